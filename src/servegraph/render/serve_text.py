"""A serveConfigV2 text read back into its structure, fast when the renderer wrote it (pure).

`serve_config.config_yaml` writes block YAML whose every deep value is one JSON line: a
10,000-node config is 20,000 lines, and PyYAML (even libyaml) takes seconds to read it
back, which `servegraph diff sg/NAME` and `servegraph status` did with a live
RayService's config. This reads exactly that layout — two-space indented block mappings
and lists, each leaf a JSON value or a plain word — one `orjson.loads` per line, and
hands anything else (a config written or edited by hand) to YAML whole: the answer is
always YAML's, only its cost changes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import orjson
import yaml

from servegraph.render.serve_config import _PLAIN, _YAML11_WORDS

_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Unreadable(ValueError):
    """Outside the renderer's layout: read it as YAML instead."""


def read_config(text: str) -> Mapping[str, Any] | None:
    """The Serve config a serveConfigV2 text holds (None when it is not a mapping)."""
    if not text:
        return None
    try:
        config: Any = _Reader(text.split("\n")).document()
    except _Unreadable:
        config = yaml.load(text, Loader=_Loader)  # noqa: S506 - a safe loader
    return config if isinstance(config, Mapping) else None


class _Reader:
    def __init__(self, lines: list[str]) -> None:
        if lines and lines[-1] == "":
            lines.pop()
        self.lines = lines
        self.i = 0

    def document(self) -> Any:
        if not self.lines:
            raise _Unreadable("empty")
        value = self.block(0)
        if self.i != len(self.lines):
            raise _Unreadable(f"line {self.i + 1}")
        return value

    def indent(self, line: str) -> int:
        n = len(line) - len(line.lstrip(" "))
        if n % 2 or not line.strip() or "\t" in line[:n] or line.lstrip().startswith("#"):
            raise _Unreadable(f"line {self.i + 1}")
        return n

    def block(self, indent: int) -> Any:
        """The mapping or list whose lines start at `indent`."""
        line = self.lines[self.i]
        if self.indent(line) != indent:
            raise _Unreadable(f"line {self.i + 1}")
        body = line[indent:]
        if body == "-" or body.startswith("- "):
            return self.sequence(indent)
        return self.mapping(indent, {})

    def sequence(self, indent: int) -> list[Any]:
        out: list[Any] = []
        while self.i < len(self.lines) and self.indent(self.lines[self.i]) == indent:
            body = self.lines[self.i][indent:]
            if body == "-":
                self.i += 1
                out.append(self.nested(indent))
                continue
            if not body.startswith("- "):
                raise _Unreadable(f"line {self.i + 1}")
            rest = body[2:]
            entry = _entry(rest)
            if entry is None:
                self.i += 1
                out.append(_scalar(rest))
            else:
                # A mapping in a list starts on the dash's line; its other keys are two deeper.
                mapping: dict[str, Any] = {}
                self.entry(entry, indent + 2, mapping)
                out.append(self.mapping(indent + 2, mapping))
        return out

    def mapping(self, indent: int, out: dict[str, Any]) -> dict[str, Any]:
        while self.i < len(self.lines) and self.indent(self.lines[self.i]) == indent:
            entry = _entry(self.lines[self.i][indent:])
            if entry is None:
                raise _Unreadable(f"line {self.i + 1}")
            self.entry(entry, indent, out)
        return out

    def entry(self, entry: tuple[str, str | None], indent: int, out: dict[str, Any]) -> None:
        key, value = entry
        self.i += 1
        out[key] = self.nested(indent) if value is None else _scalar(value)

    def nested(self, indent: int) -> Any:
        """The block under a `key:` or a lone `-`: it must be deeper than its parent."""
        if self.i >= len(self.lines) or self.indent(self.lines[self.i]) <= indent:
            raise _Unreadable(f"line {self.i + 1}")
        return self.block(self.indent(self.lines[self.i]))


def _entry(text: str) -> tuple[str, str | None] | None:
    """(key, value text or None for a block) of a `key: value` line, None for no key."""
    if text.startswith('"'):
        end = _string_end(text)
        if end is None or not text[end:].startswith(":"):
            return None
        key = orjson.loads(text[:end])
        rest = text[end + 1 :]
    else:
        name, sep, rest = text.partition(":")
        if not sep or not _PLAIN.fullmatch(name) or name.lower() in _YAML11_WORDS:
            return None
        if rest and not rest.startswith(" "):
            return None  # `a:b` is a plain value, not a key
        key = name
    if rest == "":
        return key, None
    if not rest.startswith(" ") or rest[1:2] == " ":
        raise _Unreadable(text)
    return key, rest[1:]


def _string_end(text: str) -> int | None:
    """The index just past the JSON string `text` opens with."""
    i = 1
    while i < len(text):
        if text[i] == "\\":
            i += 2
        elif text[i] == '"':
            return i + 1
        else:
            i += 1
    return None


# YAML 1.1 reads a number with an exponent as a float only with a dot and a signed exponent
# (the renderer writes 1.0e+16); any other exponent is read as YAML reads it.
_YAML_DIFFERS = re.compile(r"(?<![\w.])-?\d+[eE]|\d[eE]\d")


def _scalar(text: str) -> Any:
    if text[:1] in '{["-0123456789' or text in ("true", "false", "null"):
        if _YAML_DIFFERS.search(text):
            raise _Unreadable(text)
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            raise _Unreadable(text) from None
    if _PLAIN.fullmatch(text) and text.lower() not in _YAML11_WORDS:
        return text
    raise _Unreadable(text)
