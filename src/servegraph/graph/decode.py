"""Bytes to protobuf `Graph`: binary for the wire, text and JSON for authoring."""

from __future__ import annotations

import enum
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
        suffix = Path(path).suffix.lower()
        if suffix in {".textproto", ".txtpb", ".txt", ".pbtxt"}:
            return cls.TEXT
        if suffix == ".json":
            return cls.JSON
        return cls.BINARY


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
