"""`servegraph canary`, `promote` and `abort` without a cluster: their arguments, which form
`promote NAME` takes, the refusals that need no dashboard, and the config read back.
(On a real Ray, the commands themselves: tests/e2e/test_e2e_canary.py.)"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from cli_support import run_cli

from servegraph.cli import canary as command
from servegraph.raydash.canary import Refused, deployed_config
from servegraph.raydash.dashboard import AppState, ServeState


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="servegraph")
    command.add_arguments(p.add_subparsers(dest="command", required=True))
    return p


def test_canary_takes_a_weight_a_mirror_and_one_sticky_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_DASHBOARD_ADDRESS", raising=False)
    args = parser().parse_args(["canary", "v2.txtpb", "--weight", "10", "--mirror", "20", "--sticky-field", "user"])
    assert (args.func, args.file, args.weight, args.mirror, args.sticky_field, args.sticky_header) == (
        command.run_canary,
        Path("v2.txtpb"),
        10,
        20,
        "user",
        None,
    )
    assert args.address == "http://127.0.0.1:8265"


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["canary", "v2.txtpb"], "--weight"),
        (["canary", "v2.txtpb", "--weight", "101"], "101 is not a percent from 0 to 100"),
        (["canary", "v2.txtpb", "--weight", "ten"], "'ten' is not a whole percent"),
        (["canary", "v2.txtpb", "--weight", "5", "--sticky-header", "h", "--sticky-field", "f"], "not allowed with"),
    ],
)
def test_bad_arguments_are_one_line(argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parser().parse_args(argv)
    assert exited.value.code == 2 and says in capsys.readouterr().err


def test_promote_and_abort_tell_a_servegraph_from_the_plain_cluster() -> None:
    plain = parser().parse_args(["promote"])
    assert (plain.name, plain.address, plain.func) == (None, None, command.run_promote)
    named = parser().parse_args(["abort", "fraud", "-n", "team-a"])
    assert (named.name, named.namespace, named.address, named.func) == ("fraud", "team-a", None, command.run_abort)
    there = parser().parse_args(["promote", "--address", "http://ray:8265"])
    assert there.address == "http://ray:8265"


def test_promote_of_a_servegraph_goes_to_its_api_server(tmp_path: Path) -> None:
    """With a NAME and no --address, the ServeGraph is asked (its annotation): here there is no
    cluster to ask, said in one line (exit 3); tests/integration/test_canary_cli.py asks a real one."""
    done = run_cli("promote", "fraud", "-n", "team-a", home=tmp_path)
    assert done.returncode == 3
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: no kubeconfig: ") and "--kubeconfig" in line


def test_the_annotation_asks_once_and_only_while_a_canary_runs() -> None:
    from servegraph.cli.rollouts import canary_patch

    body = {
        "metadata": {"name": "g", "namespace": "ns", "uid": "u"},
        "status": {"rollout": {"canary": {"phase": "Weighted"}}},
    }
    patch, said = canary_patch(body, "abort")
    value = patch["metadata"]["annotations"]["servegraph.io/canary"]
    assert value.startswith("abort@") and patch["metadata"]["uid"] == "u" and "the canary is removed" in said
    done = {**body, "status": {"rollout": {"canary": {"phase": "Promoted"}}}}
    with pytest.raises(LookupError, match="no canary runs \\(its last canary is Promoted\\)"):
        canary_patch(done, "promote")


def test_an_unreachable_dashboard_is_one_line_and_exit_2(tmp_path: Path) -> None:
    done = run_cli("abort", "--address", "http://127.0.0.1:1", "--token", "t", home=tmp_path)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("servegraph abort: ") and "127.0.0.1:1" in line


def test_the_running_config_is_read_from_every_applications_deployed_config() -> None:
    app = {"name": "a", "route_prefix": "/a", "import_path": "servegraph.runtime:build", "args": {}}
    state = ServeState(
        applications={"a": AppState("a", "RUNNING", "", "/a", (), deployed_app_config=app)},
        http_host="127.0.0.1",
        http_port=8123,
        grpc_port=9000,
        grpc_servicer_functions=("servegraph.v1.service_pb2_grpc.add_GraphServiceServicer_to_server",),
    )
    assert deployed_config(state) == {
        "proxy_location": "EveryNode",
        "http_options": {"host": "127.0.0.1", "port": 8123},
        "grpc_options": {"port": 9000, "grpc_servicer_functions": list(state.grpc_servicer_functions)},
        "applications": [app],
    }
    with pytest.raises(Refused, match="`servegraph up` a graph first"):
        deployed_config(ServeState(applications={}, http_host=None, http_port=None))
