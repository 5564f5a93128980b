"""Bytes to protobuf `Graph`: binary for the wire, text and JSON for authoring."""

from __future__ import annotations

import enum
import re
from pathlib import Path

from google.protobuf import json_format, text_format
from google.protobuf.message import DecodeError

from servegraph.graph.errors import GraphError, Problem
from servegraph.v1 import graph_pb2

DEFAULT_MAX_BYTES = 16 * 1024 * 1024


class Format(enum.Enum):
    BINARY = "binary"
    TEXT = "text"
    JSON = "json"

    @classmethod
    def from_path(cls, path: str | Path) -> Format:
        """Guess by extension; anything unknown is the binary wire format."""
        return cls.by_suffix(path) or cls.BINARY

    @classmethod
    def by_suffix(cls, path: str | Path) -> Format | None:
        """The format a graph file's extension names, or None for any other name."""
        return _SUFFIXES.get(Path(path).suffix.lower())

    @classmethod
    def sniff(cls, data: bytes) -> Format:
        """The format of a graph's bytes: JSON opens with `{`; text format is UTF-8 without
        control characters; binary has them (every valid graph: `schema_version` is the
        bytes 0x18 0x01)."""
        head = data.lstrip()[:1]
        if head == b"{":
            return cls.JSON
        if _CONTROL.search(data):
            return cls.BINARY
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            return cls.BINARY
        return cls.TEXT


_SUFFIXES = {
    **dict.fromkeys((".textproto", ".txtpb", ".txt", ".pbtxt"), Format.TEXT),
    ".json": Format.JSON,
    **dict.fromkeys((".pb", ".binpb", ".bin"), Format.BINARY),
}
_CONTROL = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def decode(data: bytes, fmt: Format = Format.BINARY, *, max_bytes: int = DEFAULT_MAX_BYTES) -> graph_pb2.Graph:
    """Decode without interpreting; the validator turns the message into the model."""
    if len(data) > max_bytes:
        raise GraphError([Problem("", f"graph is {len(data)} bytes, over the limit of {max_bytes}")])
    msg = graph_pb2.Graph()
    try:
        if fmt is Format.BINARY:
            msg.ParseFromString(data)
        elif fmt is Format.TEXT:
            text_format.Parse(data.decode("utf-8"), msg)
        else:
            json_format.Parse(data.decode("utf-8"), msg)
    except (DecodeError, text_format.ParseError, json_format.ParseError) as exc:
        raise GraphError([Problem("", f"cannot decode {fmt.value} protobuf: {exc}")]) from None
    except UnicodeDecodeError as exc:
        raise GraphError([Problem("", f"cannot decode {fmt.value} protobuf: not UTF-8 ({exc.reason})")]) from None
    except RecursionError:
        raise GraphError([Problem("", f"cannot decode {fmt.value} protobuf: nested too deeply")]) from None
    if fmt is not Format.BINARY:
        # Text and JSON nest deeper than the binary decoder's limit: hold them to it, so
        # every graph that decodes can also be packed and served as binary.
        try:
            graph_pb2.Graph.FromString(msg.SerializeToString())
        except DecodeError:
            raise GraphError([Problem("", f"cannot decode {fmt.value} protobuf: nested too deeply")]) from None
    return msg


def encode(msg: graph_pb2.Graph, fmt: Format = Format.BINARY) -> bytes:
    """Deterministic encoding, so packing the same graph twice gives the same bytes."""
    if fmt is Format.BINARY:
        return msg.SerializeToString(deterministic=True)
    if fmt is Format.TEXT:
        return text_format.MessageToString(msg).encode()
    return (json_format.MessageToJson(msg, sort_keys=True) + "\n").encode()


def decode_file(data: bytes, name: str | Path, *, max_bytes: int = DEFAULT_MAX_BYTES) -> graph_pb2.Graph:
    """Decode a graph file: in the format its extension names, else the one its content shows.

    When the extension names a format the content is not in, the error says which it is
    (a text graph named .pb, read as binary, would only say the wire format was corrupt).
    """
    named = Format.by_suffix(name)
    try:
        return decode(data, named or Format.sniff(data), max_bytes=max_bytes)
    except GraphError:
        content = Format.sniff(data)
        if named is None or content is named or not _decodes(data, content, max_bytes):
            raise
    suffix = {Format.BINARY: ".pb", Format.TEXT: ".txtpb", Format.JSON: ".json"}[content]
    raise GraphError(
        [Problem("", f"the name says {named.value} protobuf but the content is {content.value}: name it {suffix}")]
    )


def _decodes(data: bytes, fmt: Format, max_bytes: int) -> bool:
    try:
        decode(data, fmt, max_bytes=max_bytes)
    except GraphError:
        return False
    return True
