"""Decoding: three formats, size limit, and clean errors for garbage."""

from __future__ import annotations

import pytest
from builders import graph

from servegraph.graph import DEFAULT_MAX_BYTES, Format, GraphError, decode, encode, parse_graph


@pytest.mark.parametrize("fmt", list(Format))
def test_round_trip_each_format(fmt: Format) -> None:
    msg = graph()
    assert decode(encode(msg, fmt), fmt) == msg


@pytest.mark.parametrize(
    ("fmt", "data", "fragment"),
    [
        (Format.BINARY, b"\x0a\xff\xff", "cannot decode binary protobuf"),
        (Format.TEXT, b"name: 'x' bogus_field: 1", "cannot decode text protobuf"),
        (Format.JSON, b"{not json", "cannot decode json protobuf"),
        (Format.JSON, b'{"applications": [{"nodes": {"a": {"kind": 3}}}]}', "cannot decode json protobuf"),
        (Format.TEXT, b"\xff\xfe", "not UTF-8"),
    ],
)
def test_decode_errors_are_clean(fmt: Format, data: bytes, fragment: str) -> None:
    with pytest.raises(GraphError) as err:
        decode(data, fmt)
    assert fragment in str(err.value)


def test_size_limit_is_enforced_and_configurable() -> None:
    data = encode(graph())
    assert parse_graph(data, max_bytes=len(data)).name == "g"
    with pytest.raises(GraphError, match=f"{len(data)} bytes, over the limit of {len(data) - 1}"):
        parse_graph(data, max_bytes=len(data) - 1)
    assert DEFAULT_MAX_BYTES == 16 * 1024 * 1024


def test_oneof_conflict_in_text_is_a_decode_error() -> None:
    text = b"""
    schema_version: 1 name: "g"
    applications { name: "a" route_prefix: "/" ingress: "n"
      nodes { key: "n" value { deployment { import_path: "a:b" } sequence { steps { id: "n" } } } } }
    """
    with pytest.raises(GraphError, match="cannot decode text protobuf"):
        decode(text, Format.TEXT)


def test_format_from_path() -> None:
    assert Format.from_path("g.textproto") is Format.TEXT
    assert Format.from_path("g.txtpb") is Format.TEXT
    assert Format.from_path("G.JSON") is Format.JSON
    assert Format.from_path("g.pb") is Format.BINARY
