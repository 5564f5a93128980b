"""`servegraph completion bash|zsh`: a shell completion script, written from the parser
itself (so it never lists a command or flag that does not exist), as kubectl and helm
print theirs: `source <(servegraph completion bash)`.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any

from servegraph.cli.common import command


def add_arguments(sub: Any, root: argparse.ArgumentParser) -> None:
    p = command(
        sub,
        "completion",
        help="print a shell completion script (bash, or zsh through its bash compatibility)",
        examples=[
            "source <(servegraph completion bash)",
            'servegraph completion zsh > "${fpath[1]}/_servegraph"',
        ],
    )
    p.add_argument("shell", choices=("bash", "zsh"), help="the shell to complete in")
    p.set_defaults(func=lambda args: _print(root, args.shell))


def _print(root: argparse.ArgumentParser, shell: str) -> int:
    sys.stdout.write(script(root, shell))
    return 0


def _subcommands(root: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in root._actions:  # argparse keeps the subcommands only here
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def script(root: argparse.ArgumentParser, shell: str) -> str:
    """The completion function: commands first, then a command's flags, a flag's choices,
    and files for everything else."""
    commands = _subcommands(root)
    flags_by_command, choices = [], []
    for name, parser in sorted(commands.items()):
        flags = sorted(f for a in parser._actions for f in a.option_strings)
        flags_by_command.append(f"    {name}) opts={shlex.quote(' '.join(flags))} ;;")
        for action in parser._actions:
            if action.choices and action.option_strings:
                words = shlex.quote(" ".join(str(c) for c in action.choices))
                for flag in action.option_strings:
                    choices.append(f'    "{name} {flag}") COMPREPLY=($(compgen -W {words} -- "$cur")); return ;;')
            elif action.choices and not action.option_strings and not isinstance(action, argparse._SubParsersAction):
                words = shlex.quote(" ".join(str(c) for c in action.choices))
                choices.append(f'    "{name} {name}") COMPREPLY=($(compgen -W {words} -- "$cur")); return ;;')
    top = shlex.quote(" ".join([*sorted(commands), "--help", "--version"]))
    body = "\n".join(
        [
            "_servegraph() {",
            '  local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}" cmd="${COMP_WORDS[1]}" opts=""',
            "  if [[ $COMP_CWORD -eq 1 ]]; then",
            f'    COMPREPLY=($(compgen -W {top} -- "$cur")); return',
            "  fi",
            '  case "$cmd $prev" in',
            *choices,
            "  esac",
            '  case "$cmd" in',
            *flags_by_command,
            "  esac",
            '  if [[ "$cur" == -* ]]; then',
            '    COMPREPLY=($(compgen -W "$opts" -- "$cur"))',
            "  else",
            '    COMPREPLY=($(compgen -f -- "$cur"))',
            "  fi",
            "}",
            "complete -o filenames -F _servegraph servegraph",
        ]
    )
    if shell == "zsh":
        body = "#compdef servegraph\nautoload -U +X bashcompinit && bashcompinit\n" + body
    return body + "\n"
