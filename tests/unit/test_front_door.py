"""What a newcomer reads first (issue 47, item 8): BENCHMARKS.md opens with one page of
current figures; the README's sample list, application counts and layout are the repository's;
observability.md's example is the sample it names; the `complete` ServeGraph sets every spec
field that can be set together, against the CRD's schema, as complete.txtpb does the graph's."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

import jsonschema
import pytest
import yaml
from support import ROOT, SAMPLES
from test_samples import _closed

from servegraph.graph import load_graph

CRD = ROOT / "config" / "crd" / "servegraph.io_servegraphs.yaml"
NOT_TOGETHER = {  # each with the fields below it
    "spec.source.caBundle.configMapRef": "exactly one of secretRef and configMapRef (CEL)",
    "spec.rollout.pin.version": "exactly one of digest and version (CEL)",
    "spec.rayService.clusterUpgradeOptions": "only with NewClusterWithIncrementalUpgrade, behind a KubeRay feature gate",
    "spec.rayService.suspend": "deprecated, the same as spec.suspend",
    "spec.rollout.canary.stickyKey.field": "exactly one of header and field (CEL)",
}


def _crd_schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    (version,) = crd["spec"]["versions"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def _schema_paths(schema: Mapping[str, Any], path: str) -> Iterator[str]:
    """Every field path the schema declares under `path`; `*` for a map's keys. A field whose
    contents the schema leaves open (preserve-unknown-fields, no properties) is one path."""
    yield path
    items = schema.get("items")
    if isinstance(items, Mapping):
        schema = items
    for name, sub in (schema.get("properties") or {}).items():
        yield from _schema_paths(sub, f"{path}.{name}")
    extra = schema.get("additionalProperties")
    if isinstance(extra, Mapping) and (extra.get("properties") or extra.get("items")):
        yield from _schema_paths(extra, f"{path}.*")


def _set_paths(value: Any, path: str, schema: Mapping[str, Any]) -> Iterator[str]:
    """Every declared path `value` sets (a list's items and a map's entries all count)."""
    yield path
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for item in value:
            yield from _set_paths(item, path, schema["items"])
        return
    if not isinstance(value, Mapping):
        return
    properties = schema.get("properties") or {}
    extra = schema.get("additionalProperties")
    for key, item in value.items():
        if key in properties:
            yield from _set_paths(item, f"{path}.{key}", properties[key])
        elif isinstance(extra, Mapping) and (extra.get("properties") or extra.get("items")):
            yield from _set_paths(item, f"{path}.*", extra)


def _complete() -> dict[str, Any]:
    (sg,) = [d for d in yaml.safe_load_all((SAMPLES / "complete.yaml").read_text()) if d["kind"] == "ServeGraph"]
    return dict(sg)


def test_the_complete_servegraph_sets_every_spec_field_that_can_be_set_together() -> None:
    spec_schema = _crd_schema()["properties"]["spec"]
    declared = set(_schema_paths(spec_schema, "spec"))
    assert len(declared) > 90, "the walk found the CRD's fields"
    unset = {
        p
        for p in declared - set(_set_paths(_complete()["spec"], "spec", spec_schema))
        if not any(p == x or p.startswith(x + ".") for x in NOT_TOGETHER)
    }
    assert not unset, f"config/samples/complete.yaml leaves unset: {sorted(unset)}"
    assert set(NOT_TOGETHER) <= declared, "an exclusion names a field the CRD no longer has"


def test_the_complete_servegraph_passes_the_crds_schema_closed() -> None:
    """As the .txtpb is decoded strictly: no field the CRD does not declare (the API server
    would drop it silently)."""
    jsonschema.Draft7Validator(_closed(_crd_schema())).validate(_complete())


def test_the_field_walk_can_fail() -> None:
    schema = {
        "properties": {
            "a": {"properties": {"b": {}, "c": {}}},
            "m": {"additionalProperties": {"properties": {"x": {}}}},
        }
    }
    assert set(_schema_paths(schema, "s")) == {"s", "s.a", "s.a.b", "s.a.c", "s.m", "s.m.*", "s.m.*.x"}
    assert set(_set_paths({"a": {"b": 1}, "m": {"k": {"x": 1}}}, "s", schema)) == {
        "s",
        "s.a",
        "s.a.b",
        "s.m",
        "s.m.*",
        "s.m.*.x",
    }


# ---- README -----------------------------------------------------------------------------

README = (ROOT / "README.md").read_text()


def test_the_readme_lists_every_sample_with_its_application_count() -> None:
    words = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five"}
    for path in sorted(SAMPLES.glob("*.txtpb")):
        name = path.stem
        assert f"`{name}` (" in README, f"README.md's sample list does not name {name}"
        said = re.search(rf"`{name}` \((\w+) application", README)
        count = len(load_graph(path).applications)
        assert said and said[1] == words[count], f"README.md: {name} has {words[count]} application(s)"


def test_the_readme_layout_names_the_cli_modules() -> None:
    cli = sorted(p.name for p in (ROOT / "src" / "servegraph" / "cli").glob("*.py") if p.name != "__init__.py")
    layout = README.split("## Development", 1)[1].split("```", 2)[1].splitlines()
    (start,) = [i for i, x in enumerate(layout) if x.strip().startswith("cli/")]
    indent = len(layout[start]) - len(layout[start].lstrip())
    entry = [layout[start]]
    for line in layout[start + 1 :]:  # its continuation lines, indented deeper
        if len(line) - len(line.lstrip()) <= indent + 2:
            break
        entry.append(line)
    text = " ".join(entry)
    missing = [m for m in cli if not re.search(rf"\b{re.escape(m.removesuffix('.py'))}\b", text)]
    assert not missing, f"README.md's layout entry for cli/ does not name {missing}: {text}"


# ---- BENCHMARKS.md ---------------------------------------------------------------------

BENCHMARKS = (ROOT / "BENCHMARKS.md").read_text()


def test_benchmarks_is_one_page_of_current_figures_and_the_history_is_apart() -> None:
    page = BENCHMARKS
    assert len(page.splitlines()) <= 80, "BENCHMARKS.md is longer than a page"
    assert "(BENCHMARKS-HISTORY.md)" in page, "BENCHMARKS.md does not link its history"
    history = (ROOT / "BENCHMARKS-HISTORY.md").read_text()
    assert len(history.splitlines()) > len(page.splitlines()), "the history is missing"
    rows = [r for r in page.splitlines() if r.startswith("| ") and not r.startswith(("| figure", "|---"))]
    assert len(rows) >= 10, "the first page has no table of figures"
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 5, row
        figure, value, command, commit, date = cells
        assert figure and value, row
        assert command.startswith("`") and command.endswith("`"), f"no command: {row}"
        assert re.fullmatch(r"`?[0-9a-f]{7,40}`?( .*)?", commit), f"no commit: {row}"
        assert re.fullmatch(r"20\d\d-\d\d-\d\d", date), f"no date: {row}"


@pytest.mark.parametrize("bad", ["| a | b | `c` | nocommit | 2026-11-28 |", "| a | b | c | 1234567 | 2026-11-28 |"])
def test_the_figures_check_can_fail(bad: str) -> None:
    cells = [c.strip() for c in bad.strip("|").split("|")]
    command, commit = cells[2], cells[3]
    ok = command.startswith("`") and re.fullmatch(r"`?[0-9a-f]{7,40}`?( .*)?", commit)
    assert not ok


# ---- docs/observability.md's `servegraph status` is what the command prints ------------

OBSERVABILITY = ROOT / "docs" / "observability.md"


def _observed_snapshot() -> tuple[Any, Any]:
    """The ServeGraph of config/samples/observed.yaml serving observed.pb, as the operator and
    KubeRay report it four minutes after it became Ready."""
    import hashlib
    from datetime import UTC, datetime

    from servegraph.render import serve_config_yaml
    from servegraph.statustree.tree import Snapshot

    data = (SAMPLES / "observed.pb").read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    graph = load_graph(SAMPLES / "observed.pb")
    applied, ready = "2026-11-23T10:00:00Z", "2026-11-23T10:01:00Z"

    def condition(kind: str, reason: str, message: str, at: str) -> dict[str, str]:
        return {"type": kind, "status": "True", "reason": reason, "message": message, "lastTransitionTime": at}

    apps = {
        a.name: {"status": "RUNNING", "deployments": {n: {"status": "HEALTHY"} for n in a.nodes}}
        for a in graph.applications
    }
    servegraph = {
        "metadata": {"name": "observed", "namespace": "team-a"},
        "status": {
            "graph": {"name": "observed", "version": "1", "digest": f"sha256:{digest}", "applications": 2, "nodes": 9},
            "rayServiceName": "observed",
            "conditions": [
                condition(
                    "Fetched",
                    "Downloaded",
                    f"downloaded {len(data)} bytes from https://registry.example.com/v1/graphs/observed",
                    applied,
                ),
                condition("GraphValid", "Valid", "graph observed version '1': 2 applications, 9 nodes", applied),
                condition("Applied", "UpToDate", "RayService observed matches the graph and spec", applied),
                condition("Ready", "AllApplicationsRunning", "2 of 2 applications RUNNING", ready),
                condition("Progressing", "Complete", "version '1' is Ready", ready),
            ],
            "rollout": {
                "version": "1",
                "digest": digest,
                "phase": "Serving",
                "cause": "source",
                "startedAt": applied,
                "readyAt": ready,
            },
            "history": [
                {"version": "1", "digest": digest, "outcome": "Serving", "appliedAt": applied, "readyAt": ready}
            ],
            "applications": apps,
        },
    }
    rayservice = {
        "spec": {"serveConfigV2": serve_config_yaml(graph)},
        "status": {"activeServiceStatus": {"rayClusterName": "observed-x7k2p"}},
    }
    live = {"replicas": [{"state": "RUNNING"}], "target_num_replicas": 1}
    serve = {"applications": {a.name: {"deployments": {n: live for n in a.nodes}} for a in graph.applications}}
    return Snapshot(servegraph, rayservice, [], serve), datetime(2026, 11, 23, 10, 5, 0, tzinfo=UTC)


def test_observability_md_shows_what_status_prints_for_the_observed_sample() -> None:
    from servegraph.statustree.tree import render

    snapshot, now = _observed_snapshot()
    text = OBSERVABILITY.read_text().split("## `servegraph status`", 1)[1]
    example = text.split("```console\n", 1)[1].split("```", 1)[0]
    assert example == "$ servegraph status observed -n team-a\n" + render(snapshot, now)
