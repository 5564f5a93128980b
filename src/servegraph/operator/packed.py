"""JSON values held compressed: what the operator keeps of every object but reads rarely.

At 10,000 ServeGraphs each kilobyte held per ServeGraph is 10 MiB. Decoded JSON is ~5x
its text in Python dicts and strings: a ServeGraph's status (~2 KiB of JSON, read once
per reconcile) takes ~7 KiB that way and ~0.9 KiB packed; a live Ray cluster spec
(~1.1 KiB, read to render and to predict an upgrade) ~8 KiB and ~0.6 KiB.

LZ4 rather than zlib: a reconcile packs and unpacks several of these, and on this JSON
zlib at its fastest (level 1, a 4 KiB window) took 12-54 µs to pack and 4-22 µs to
unpack, LZ4 1-10 µs and 0.5-3 µs, for output about a third larger (measured on the
bench's tenant graphs: a status 642 → 864 bytes, a Serve config text 1,680 → 2,245).
"""

from __future__ import annotations

from typing import Any, cast

import lz4.block
import orjson


def pack_bytes(data: bytes) -> bytes:
    return cast(bytes, lz4.block.compress(data))  # the size goes first: unpacking needs no bound


def unpack_bytes(data: bytes) -> bytes:
    return cast(bytes, lz4.block.decompress(data))


def pack(value: Any) -> bytes:
    return pack_bytes(orjson.dumps(value))


def unpack(data: bytes) -> Any:
    return orjson.loads(unpack_bytes(data))
