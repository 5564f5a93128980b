"""No traceback, ever (issue 47, item 1): every mistake a user can make is one line naming
it, with a documented exit code (2: invalid input, 3: the cluster or kubeconfig cannot be
read). Each case here printed a 31-42 line traceback before."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from cli_support import one_line, run_cli
from support import SAMPLES

MINI = str(SAMPLES / "mini.txtpb")
CLUSTER_COMMANDS = [
    ["status", "mini", "-n", "demo"],
    ["diff", "sg/mini", MINI],
    ["rollback", "mini"],
    ["restart", "mini"],
]


@pytest.mark.parametrize("argv", CLUSTER_COMMANDS, ids=lambda a: a[0])
def test_no_kubeconfig_anywhere_is_one_line(tmp_path: Path, argv: list[str]) -> None:
    out = run_cli(*argv, home=tmp_path)
    assert out.returncode == 3
    assert one_line(out).startswith("error: no kubeconfig: none given (--kubeconfig), $KUBECONFIG is unset")


@pytest.mark.parametrize("argv", CLUSTER_COMMANDS, ids=lambda a: a[0])
def test_a_kubeconfig_that_does_not_exist_is_one_line(tmp_path: Path, argv: list[str]) -> None:
    out = run_cli(*argv, "--kubeconfig", "/nonexistent", home=tmp_path)
    assert out.returncode == 3
    assert one_line(out) == "error: --kubeconfig /nonexistent: no such file"
    assert "Config not found" not in out.stderr


def test_kubeconfig_env_naming_no_file_is_one_line(tmp_path: Path) -> None:
    out = run_cli("restart", "mini", home=tmp_path, env={"KUBECONFIG": "/nope/a:/nope/b"})
    assert out.returncode == 3
    assert one_line(out) == "error: $KUBECONFIG names no file that exists (/nope/a, /nope/b)"


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("garbage: [", "the kubeconfig is not YAML at line 1"),
        ("apiVersion: v1\nkind: Config\n", "kubeconfig: Invalid kube-config file. Expected key current-context"),
    ],
)
def test_a_broken_kubeconfig_is_one_line(tmp_path: Path, content: str, expected: str) -> None:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(content)
    for argv in CLUSTER_COMMANDS:
        out = run_cli(*argv, "--kubeconfig", str(kubeconfig), home=tmp_path)
        assert out.returncode == 3, out.stderr
        assert expected in one_line(out), out.stderr


def test_an_api_server_that_does_not_answer_is_one_line(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    for argv in CLUSTER_COMMANDS:
        out = run_cli(*argv, "--kubeconfig", str(kubeconfig), home=tmp_path)
        assert out.returncode == 3, out.stderr
        assert f"servegraph {argv[0]}: cannot reach the API server: " in one_line(out)
    unknown = run_cli("restart", "mini", "--kubeconfig", str(kubeconfig), "--context", "nope", home=tmp_path)
    assert unknown.returncode == 3 and "nope" in one_line(unknown)


# ---- --pods files that crashed ------------------------------------------------------------


def _servegraph(ray_service: str) -> str:
    return (
        "apiVersion: servegraph.io/v1alpha1\nkind: ServeGraph\nmetadata: {name: m}\nspec:\n"
        '  source: {url: "https://r.example/g", tokenSecretRef: {name: t}}\n'
        f"  rayService:\n    {ray_service}\n"
    )


@pytest.mark.parametrize(
    ("ray_service", "expected"),
    [
        ("workers: {resources: {limits: {cpu: 1e999}}}", "spec.rayService.workers.resources: cpu '1e999' is too large"),
        ('workers: "big"', "field spec.rayService.workers: 'big' is not a mapping"),
        ("head: [1]", "field spec.rayService.head: a list is not a mapping"),
        (
            "workers: {resources: {limits: [1, 2]}}",
            "field spec.rayService.workers.resources.limits: a list is not a mapping",
        ),
        ('workers: {nodeSelector: "gpu"}', "field spec.rayService.workers.nodeSelector: 'gpu' is not a mapping"),
        ('workers: {tolerations: "all"}', "field spec.rayService.workers.tolerations: 'all' is not a list"),
        ('workers: {env: "A=1"}', "field spec.rayService.workers.env: 'A=1' is not a list"),
    ],
    ids=["cpu-1e999", "workers-str", "head-list", "limits-list", "nodeSelector-str", "tolerations-str", "env-str"],
)
def test_a_pods_file_the_crd_refuses_is_one_line(tmp_path: Path, ray_service: str, expected: str) -> None:
    pods = tmp_path / "sg.yaml"
    pods.write_text(_servegraph(ray_service))
    for command in ("validate", "render"):
        out = run_cli(command, MINI, "--pods", str(pods), home=tmp_path)
        assert out.returncode == 2, out.stderr
        line = one_line(out)
        assert expected in line and ("sg.yaml" in line or "mini.txtpb" in line), line


def test_a_binary_pods_file_is_one_line(tmp_path: Path) -> None:
    pods = tmp_path / "sg.yaml"
    pods.write_bytes(bytes(range(256)) * 4)
    out = run_cli("validate", MINI, "--pods", str(pods), home=tmp_path)
    assert out.returncode == 2
    assert one_line(out) == f"error: {pods}: not a YAML manifest (not UTF-8 text)"


def test_a_bug_is_one_line_and_its_traceback_is_there_when_asked(tmp_path: Path) -> None:
    """The last resort: an exception no handler expected still prints one line (exit 4)."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import sys\nimport servegraph.cli.graphs as g\n"
        "def boom(args): raise ZeroDivisionError('x')\n"
        "g.inspect = boom\nfrom servegraph.cli.main import main\nsys.exit(main(sys.argv[1:]))\n"
    )
    import subprocess
    import sys

    out = subprocess.run([sys.executable, str(probe), "inspect", MINI], capture_output=True, text=True, timeout=60)
    assert out.returncode == 4
    assert one_line(out) == (
        "servegraph inspect: internal error: ZeroDivisionError: x (a bug: please report it; "
        "SERVEGRAPH_DEBUG=1 shows the traceback)"
    )
