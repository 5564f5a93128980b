"""Fuzz servegraph's three decoders, the validator and the renderers.

    .venv/bin/python fuzz/fuzz_graph.py TARGET [libFuzzer flags] [corpus dirs]

TARGET is `binary`, `text` or `json`: the format `parse_graph` reads the input
as. Under atheris (libFuzzer) the search is coverage-guided over servegraph,
protobuf's Python decoders and PyYAML; `tests/unit/test_fuzz.py` imports the
same oracle and mutator and runs them without atheris for a bounded time.

The oracle (`check`) is the contract callers rely on: `parse_graph` raises
GraphError and nothing else, and a graph that validates renders, its Serve
config YAML reads back as the rendered dict, and it re-encodes to the same
graph in every format (what `servegraph pack` does). Most mutations
are structure-aware (decode, change fields, re-encode) because random bytes
rarely get past the decoder to the validator and renderers.

    .venv/bin/python fuzz/fuzz_graph.py seeds DIR   # samples + mutated valid graphs
"""

from __future__ import annotations

import contextlib
import math
import random
import shlex
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __name__ == "__main__" and sys.argv[1:2] != ["seeds"]:
    import atheris

    # Coverage feedback from the code under test and the parsers it drives.
    _instrumented: Any = atheris.instrument_imports(include=["servegraph", "google.protobuf", "yaml"])
else:
    _instrumented = contextlib.nullcontext()

with _instrumented:
    import yaml
    from google.protobuf.descriptor import FieldDescriptor
    from google.protobuf.message import Message

    from servegraph.graph import Format, GraphError, decode, encode, parse_graph
    from servegraph.render import RayServiceOptions, render_rayservice, render_serve_config, serve_config_yaml
    from servegraph.render.inspect import describe, to_dot
    from servegraph.render.serve_config import dump_yaml
    from servegraph.v1 import graph_pb2

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "fuzz" / "corpus"
TARGETS = {"binary": Format.BINARY, "text": Format.TEXT, "json": Format.JSON}
MAX_SIZE = 64 * 1024
"""Big enough for super-linear work to show as a slow input, small enough to keep executions fast."""


def check(data: bytes, fmt: Format) -> bool:
    """Raise on a bug; return whether `data` was a valid graph (so reached the renderers)."""
    try:
        graph = parse_graph(data, fmt)
    except GraphError as exc:
        _expect(bool(exc.problems) and all(str(p) for p in exc.problems), "GraphError without problems")
        return False
    config = render_serve_config(graph)
    text = serve_config_yaml(graph)
    _expect(yaml.safe_load(text) == config, "serve_config_yaml does not read back as render_serve_config")
    msg = decode(data, fmt)
    for other in Format:
        again = parse_graph(encode(msg, other), other)
        _expect(again == graph, f"re-encoding as {other.value} changed the graph")
    # Validation plans the worker groups: a graph that parsed must render, or the
    # operator would accept a graph it then cannot apply.
    manifest = render_rayservice(graph, RayServiceOptions(name=graph.name))
    describe(graph)
    to_dot(graph)
    _expect(manifest["spec"]["serveConfigV2"] == text, "the RayService embeds another serve config")
    _expect(yaml.safe_load(dump_yaml(manifest)) == manifest, "dump_yaml does not read back as the manifest")
    return True


def _expect(ok: bool, what: str) -> None:
    if not ok:
        raise AssertionError(what)


# --- mutation -----------------------------------------------------------------

_STRINGS = [
    "", "a", "Z", "0", "-", "_", ".", "/", "//", "/a/", "/a:", "a:", ":", "a.b:C", "a..b:C", "s3://b/k:",
    "https://x/y.zip", "gs://b", "yes", "No", "NULL", "~", "on", "1e5", "1_0", "0x1f", ".inf", "-.5", "#", "a #b",
    " a", "a ", "\t", "\n", "a\nb", " \n", "\r", "\x00", "\x7f", "\x85", "\u2028", "\ufeff", "\ufffe", "é", "😀",
    '"', "'", "\\", "{", "[", "&a", "*a", "!a", "%", "@", "`", "|", ">", "? a", "- a", ": a", "a: b", "<<", "=",
    "a" * 63, "a" * 64, "b" * 1100, "CPU", "GPU", "memory", "TPU", "A100", "H100", "app.kubernetes.io/name", "a/",
    "/b", "x" * 254 + "/y", "servegraph.runtime:build", "ray-head", "cpu", "gpu", "gpu-a100", "default",
]  # fmt: skip
_DOUBLES = [0.0, -0.0, 0.25, 0.5, 1.0, 1.5, 2.0, -1.0, 3.7, 7.9, 100.0, 1e16, 2.0**53, 2.0**53 + 2, 1e300, 1.7e308,
            -1e308, 5e-324, 1e-07, math.inf, -math.inf, math.nan]  # fmt: skip
_INTS = [0, 1, 2, 3, 7, 33, 50, 99, 100, 101, 255, 1000, 2**31 - 1, 2**32 - 1, 2**53 + 1, 2**63 - 1, 2**64 - 1,
         -1, -2, -(2**31), -(2**63)]  # fmt: skip
_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
}
_TOKENS = [
    b"{", b"}", b"[", b"]", b":", b",", b'"', b"\\", b"\\u", b"\\ud800", b"nan", b"inf", b"-inf", b"1e999", b"-0",
    b"null", b"true", b"0x", b"\x00", b"\xff", b"\xc3", b"\xed\xa0\x80", b"#", b"\n", b"<", b">", b"'", b"1e-400",
    b"applications", b"nodes", b"key", b"value", b"struct_value", b"\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01",
]  # fmt: skip


def mutate(
    data: bytes, fmt: Format, max_size: int, rng: random.Random, byte_mutate: Callable[[bytes, int], bytes]
) -> bytes:
    """Structure-aware when `data` decodes (change fields, re-encode), else byte-level."""
    if rng.random() < 0.6:
        msg = graph_pb2.Graph()
        try:
            msg.CopyFrom(decode(data, fmt))
            for _ in range(rng.choice((1, 1, 1, 2, 3, 5))):
                mutate_message(msg, rng)
            out = encode(msg, fmt)
        except Exception:  # noqa: S110 - not decodable or not re-encodable (NaN in JSON): mutate the bytes
            pass
        else:
            if len(out) <= max_size:
                return out
    return byte_mutate(data, max_size)


def mutate_message(root: Message, rng: random.Random) -> None:
    """One random edit somewhere in the message tree: a field, a map entry, a list element."""
    slots: list[tuple[Message, FieldDescriptor]] = []
    messages: dict[str, list[Message]] = {}
    strings: list[str] = []
    _collect(root, slots, messages, strings)
    # Snapshots, so copying a message into its own descendant cannot alias.
    library = {k: [_snapshot(m) for m in v[:8]] for k, v in messages.items()}
    if rng.random() < 0.05:
        _nest(rng.choice(slots)[0], rng)
        return
    msg, fd = rng.choice(slots)
    if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
        _mutate_map(msg, fd, rng, library, strings)
    elif fd.is_repeated:
        _mutate_list(msg, fd, rng, library, strings)
    elif fd.message_type is not None:
        op = rng.randrange(3)
        if op == 0:
            msg.ClearField(fd.name)
        elif op == 1 or not library.get(fd.message_type.full_name):
            getattr(msg, fd.name).SetInParent()
        else:
            getattr(msg, fd.name).CopyFrom(rng.choice(library[fd.message_type.full_name]))
    else:
        setattr(msg, fd.name, _scalar(fd, getattr(msg, fd.name), rng, strings))


def _collect(
    msg: Message, slots: list[tuple[Message, FieldDescriptor]], messages: dict[str, list[Message]], strings: list[str]
) -> None:
    messages.setdefault(msg.DESCRIPTOR.full_name, []).append(msg)
    for fd in msg.DESCRIPTOR.fields:
        slots.append((msg, fd))
        value = getattr(msg, fd.name)
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            strings.extend(value.keys())
            if fd.message_type.fields_by_name["value"].message_type is not None:
                for v in value.values():
                    _collect(v, slots, messages, strings)
            else:
                strings.extend(v for v in value.values() if isinstance(v, str))
        elif fd.message_type is not None:
            for v in value if fd.is_repeated else [value] if msg.HasField(fd.name) else []:
                _collect(v, slots, messages, strings)
        elif fd.type == FieldDescriptor.TYPE_STRING:
            strings.extend(value if fd.is_repeated else [value])


def _snapshot(msg: Message) -> Message:
    copy = type(msg)()
    copy.CopyFrom(msg)
    return copy


def _mutate_map(
    msg: Message, fd: FieldDescriptor, rng: random.Random, library: dict[str, list[Message]], strings: list[str]
) -> None:
    entries = getattr(msg, fd.name)
    value_fd = fd.message_type.fields_by_name["value"]
    keys = list(entries.keys())
    op = rng.randrange(4)
    if keys and op == 0:
        del entries[rng.choice(keys)]
        return
    if keys and op == 1:  # rename: dangling references, or a fixed one
        old = rng.choice(keys)
        kept = _snapshot(entries[old]) if value_fd.message_type is not None else entries[old]
        del entries[old]
        keys = [_string(old, rng, strings)]
    else:
        kept = None
        keys = [_string(rng.choice(keys) if keys else "", rng, strings) for _ in range(rng.choice((1, 1, 1, 20)))]
    for key in keys:
        if value_fd.message_type is None:
            entries[key] = kept if kept is not None else _scalar(value_fd, None, rng, strings)
            continue
        value = entries[key]
        source = kept if kept is not None else _pick(library.get(value_fd.message_type.full_name), rng)
        if source is not None:
            value.CopyFrom(source)
        else:
            value.SetInParent()


def _mutate_list(
    msg: Message, fd: FieldDescriptor, rng: random.Random, library: dict[str, list[Message]], strings: list[str]
) -> None:
    items = getattr(msg, fd.name)
    op = rng.randrange(4)
    if len(items) and op == 0:
        del items[rng.randrange(len(items))]
    elif len(items) > 1 and op == 1:
        i, j = rng.randrange(len(items)), rng.randrange(len(items))
        if fd.message_type is None:
            items[i], items[j] = items[j], items[i]
        else:
            a, b = _snapshot(items[i]), _snapshot(items[j])
            items[i].CopyFrom(b)
            items[j].CopyFrom(a)
    elif fd.message_type is None:
        items.append(_scalar(fd, items[0] if len(items) else None, rng, strings))
    else:
        source = _pick(library.get(fd.message_type.full_name), rng)
        for _ in range(rng.choice((1, 1, 1, 2, 30))):
            new = items.add()
            if source is not None and rng.random() < 0.7:
                new.CopyFrom(source)


def _nest(msg: Message, rng: random.Random) -> None:
    """Wrap a Struct value many levels deep: recursion limits of decoders, validator and YAML."""
    if msg.DESCRIPTOR.full_name != "google.protobuf.Value":
        return
    inner = _snapshot(msg)
    for _ in range(rng.choice((10, 40, 60, 120, 400))):
        outer = type(msg)()
        if rng.random() < 0.5:
            outer.list_value.values.add().CopyFrom(inner)
        else:
            outer.struct_value.fields["k"].CopyFrom(inner)
        inner = outer
    msg.CopyFrom(inner)


def _pick(items: list[Message] | None, rng: random.Random) -> Message | None:
    return rng.choice(items) if items and rng.random() < 0.8 else None


def _scalar(fd: FieldDescriptor, current: Any, rng: random.Random, strings: list[str]) -> Any:
    if fd.type == FieldDescriptor.TYPE_STRING:
        return _string(current if isinstance(current, str) else "", rng, strings)
    if fd.type == FieldDescriptor.TYPE_BOOL:
        return not current if current is not None else rng.random() < 0.5
    if fd.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return rng.choice(_DOUBLES) if rng.random() < 0.8 else rng.uniform(-10, 300)
    if fd.type == FieldDescriptor.TYPE_ENUM:
        return rng.choice([v.number for v in fd.enum_type.values])
    lo, hi = _RANGES.get(fd.type, (0, 1))
    n = rng.choice(_INTS) if rng.random() < 0.7 else (current or 0) + rng.randint(-3, 3)
    return min(max(n, lo), hi)


def _string(current: str, rng: random.Random, strings: list[str]) -> str:
    op = rng.randrange(7)
    if op == 0 and strings:
        return rng.choice(strings)  # another node's id: new edges, cycles, duplicates
    if op == 1:
        return rng.choice(_STRINGS)
    if op == 2:
        pos = rng.randint(0, len(current))
        return current[:pos] + rng.choice(_STRINGS) + current[pos:]
    if op == 3 and current:
        pos = rng.randrange(len(current))
        return current[:pos] + current[pos + rng.randint(1, 4) :]
    if op == 4 and current:  # long, repetitive strings expose super-linear regexes and scanners
        i = rng.randrange(len(current))
        j = rng.randint(i + 1, len(current))
        tail = rng.choice(_STRINGS) if rng.random() < 0.5 else ""  # so the match fails only at the end
        return current[:i] + current[i:j] * rng.choice((2, 10, 100, 2000, 8000)) + current[j:] + tail
    if op == 5:
        return current.upper() if rng.random() < 0.5 else current + current[-1:] * rng.randint(1, 70)
    return current + rng.choice(_STRINGS)


def byte_mutate(data: bytes, max_size: int, rng: random.Random) -> bytes:
    """libFuzzer-like byte edits, for when atheris (and its `Mutate`) is not there."""
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op, pos = rng.randrange(6), rng.randint(0, len(b))
        if op == 0 and b:
            b[min(pos, len(b) - 1)] ^= 1 << rng.randrange(8)
        elif op == 1 and b:
            b[min(pos, len(b) - 1)] = rng.randrange(256)
        elif op == 2:
            b[pos:pos] = rng.choice(_TOKENS)
        elif op == 3 and b:
            del b[pos : pos + rng.randint(1, 16)]
        elif op == 4 and b:
            start = rng.randrange(len(b))
            b[pos:pos] = b[start : start + rng.randint(1, 64)]
        else:
            b[pos:pos] = rng.randbytes(rng.randint(1, 8))
    return bytes(b[:max_size])


# --- running ------------------------------------------------------------------


@dataclass
class Stats:
    executions: int = 0
    valid: int = 0
    seconds: float = 0.0


class Crash(Exception):
    """An input that broke the contract, with the input attached for a regression test."""

    def __init__(self, data: bytes, fmt: Format, cause: str) -> None:
        self.data = data
        super().__init__(f"{cause} on {fmt.value} input of {len(data)} bytes: {data[:2000]!r}")


def corpus(target: str) -> list[bytes]:
    return [p.read_bytes() for p in sorted((CORPUS / target).iterdir()) if p.is_file()]


def fuzz_loop(
    fmt: Format, seeds: Iterable[bytes], *, iterations: int, seconds: float, seed: int, hang_seconds: float = 3.0
) -> Stats:
    """Mutate without atheris: a fixed seed replays the same inputs, the clock only cuts it short.

    Valid mutants join the pool so edits stack, which is what reaches deep validator
    and renderer paths without coverage feedback.
    """
    rng = random.Random(seed)
    pool = list(seeds)
    stats = Stats()
    start = time.monotonic()
    while stats.executions < iterations and time.monotonic() - start < seconds:
        data = mutate(rng.choice(pool), fmt, MAX_SIZE, rng, lambda d, n: byte_mutate(d, n, rng))
        cpu = time.process_time()  # CPU time, so a busy machine does not make inputs "hang"
        try:
            valid = check(data, fmt)
        except Exception as exc:
            raise Crash(data, fmt, f"{type(exc).__name__}: {exc}") from exc
        if (cpu := time.process_time() - cpu) > hang_seconds:
            raise Crash(data, fmt, f"took {cpu:.1f} s of CPU")
        stats.executions += 1
        if valid:
            stats.valid += 1
            if len(pool) < 500:
                pool.append(data)
            else:
                pool[rng.randrange(len(pool))] = data
    stats.seconds = time.monotonic() - start
    return stats


def write_seeds(out: Path, per_target: int = 40) -> None:
    """The samples in every format, plus structure-mutated graphs that still validate."""
    samples = sorted((ROOT / "config" / "samples").glob("*.pb"))
    rng = random.Random(7)
    for target, fmt in TARGETS.items():
        (out / target).mkdir(parents=True, exist_ok=True)
        base = [encode(decode(p.read_bytes()), fmt) for p in samples]
        found = list(base)
        tries = 0
        while len(found) < len(base) + per_target and tries < 200 * per_target:
            tries += 1
            data = mutate(rng.choice(found), fmt, MAX_SIZE, rng, lambda d, n: d)
            if data not in found and check(data, fmt):
                found.append(data)
        for i, data in enumerate(found):
            (out / target / f"seed-{i:03d}").write_bytes(data)


def main(argv: list[str]) -> None:
    if argv[1:2] == ["seeds"] and len(argv) == 3:
        write_seeds(Path(argv[2]))
        return
    if len(argv) < 2 or argv[1] not in TARGETS:
        sys.exit(__doc__)
    fmt = TARGETS[argv[1]]

    def one_input(data: bytes) -> None:
        check(data, fmt)

    def custom_mutator(data: bytes, max_size: int, seed: int) -> bytes:
        return mutate(data, fmt, max_size, random.Random(seed), atheris.Mutate)

    # libFuzzer reruns argv[0] through the shell for -merge, -fork and -jobs: make it the whole command.
    command = shlex.join([sys.executable, argv[0], argv[1]])
    atheris.Setup([command, *argv[2:]], one_input, custom_mutator=custom_mutator)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
