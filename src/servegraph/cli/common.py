"""What every command shares: exit codes, one-line failures, capped problem lists, `-o`
output, `-` for stdin, and help that shows defaults and an example.

Standard library and PyYAML only at import time (the CLI's core), so `servegraph --help`
lists every command without the extras.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, TextIO

import yaml

EXIT_OK = 0
EXIT_DIFFERENT = 1
"""`diff`: there are differences; `up`: not RUNNING in time; `status`: no such ServeGraph."""
EXIT_INVALID = 2
"""Invalid input or a refused action: a graph, a manifest, a flag, a file."""
EXIT_UNREACHABLE = 3
"""Could not reach or read what the command needs: the kubeconfig, the API server, the registry."""
EXIT_INTERRUPTED = 130

MAX_PROBLEMS_SHOWN = 20
"""Problems printed before the rest are counted: one mistake repeated over a 10,000-node
graph is hundreds of lines, and the first few say what to fix."""

STDIN = "-"


class Failure(Exception):
    """A command cannot go on: one line (or a few) for stderr, and the exit code."""

    def __init__(self, message: str, code: int = EXIT_INVALID) -> None:
        super().__init__(message)
        self.code = code


def plural(count: int, word: str, words: str | None = None) -> str:
    """`1 application`, `3 applications`, `1,000 nodes`."""
    return f"{count:,} {word if count == 1 else (words or word + 's')}"


def print_problems(
    where: str, problems: Sequence[object], *, err: TextIO | None = None, limit: int = MAX_PROBLEMS_SHOWN
) -> None:
    """`error: WHERE: problem`, one a line, the first `limit` of them and then how many more."""
    err = err or sys.stderr
    prefix = f"{where}: " if where else ""
    for problem in problems[:limit]:
        print(f"error: {prefix}{problem}", file=err)
    if len(problems) > limit:
        print(f"error: {prefix}... and {plural(len(problems) - limit, 'more problem')} not shown", file=err)


def read_input(path: Path | str, *, limit: int | None = None) -> bytes:
    """The bytes of a file, or of stdin for `-`; at most `limit` + 1 of them, so a caller
    can tell an oversized input without holding all of it."""
    if str(path) == STDIN:
        stream = sys.stdin.buffer
        return stream.read() if limit is None else stream.read(limit + 1)
    with Path(path).open("rb") as f:
        return f.read() if limit is None else f.read(limit + 1)


def name_of(path: Path | str) -> str:
    """How a file is named in messages: its path, or `stdin` for `-`."""
    return "stdin" if str(path) == STDIN else str(path)


# ---- output ------------------------------------------------------------------------------


def add_output(p: argparse.ArgumentParser, choices: Iterable[str], default: str) -> None:
    """`-o/--output FORMAT`, as kubectl spells it: never a file."""
    names = tuple(choices)
    p.add_argument("-o", "--output", choices=names, default=default, metavar="|".join(names), help="output format")


def emit(data: Any, fmt: str, out: TextIO | None = None) -> None:
    """`data` as JSON or YAML on stdout (block YAML, keys in the order given)."""
    out = out or sys.stdout
    if fmt == "json":
        out.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    else:
        out.write(yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True, width=1 << 16))


# ---- help --------------------------------------------------------------------------------


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Examples kept as written; every option's default shown unless it is empty or the
    help already says it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            "%(default)" in text
            or "default" in text
            or default in (None, False, [], "", argparse.SUPPRESS)
            or not action.option_strings
        ):
            return text
        return f"{text} (default: %(default)s)"


def command(
    sub: Any, name: str, *, help: str, examples: Sequence[str], description: str | None = None
) -> argparse.ArgumentParser:
    """A subcommand whose --help ends with its examples and shows defaults."""
    lines = "\n".join(f"  {e}" for e in examples)
    parser: argparse.ArgumentParser = sub.add_parser(
        name,
        help=help,
        description=description or help[:1].upper() + help[1:] + ".",
        epilog=f"example{'s' if len(examples) > 1 else ''}:\n{lines}",
        formatter_class=HelpFormatter,
    )
    return parser
