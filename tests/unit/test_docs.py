"""Docs that restate the code are checked against it, so they cannot go stale unnoticed."""

from __future__ import annotations

import re

import yaml
from support import ROOT


def _rbac_table(markdown: str) -> dict[str, set[str]]:
    """resource → verbs from the `| resource | verbs | why |` table; a row with an
    empty first cell continues the resource above it."""
    table: dict[str, set[str]] = {}
    resource = ""
    for line in markdown.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[1].startswith("`"):
            continue
        if cells[0]:
            resource = re.findall(r"`([^`]+)`", cells[0])[0]
        table.setdefault(resource, set()).update(re.findall(r"`([^`]+)`", cells[1]))
    return table


def test_the_rbac_table_in_install_md_is_the_clusterrole() -> None:
    role = yaml.safe_load((ROOT / "config" / "rbac" / "role.yaml").read_text())
    granted: dict[str, set[str]] = {}
    for rule in role["rules"]:
        for resource in rule["resources"]:
            granted.setdefault(resource, set()).update(rule["verbs"])
    assert _rbac_table((ROOT / "docs" / "install.md").read_text()) == granted


def test_the_runtime_doc_names_the_error_type_the_builder_raises() -> None:
    from servegraph.runtime import BuildError

    qualified = f"{BuildError.__module__}.{BuildError.__qualname__}: "
    assert qualified in (ROOT / "docs" / "runtime.md").read_text()
