"""The audit log the benches and integration tests count requests from.

A count must never come out short because the log moved under it: at 10,000 ServeGraphs
the API server's default rotation (100 MB) emptied a storm's count without a word.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servegraph_testbed import AuditLog, Binaries
from servegraph_testbed.audit import AuditLogRotated
from servegraph_testbed.certs import PkiFiles
from servegraph_testbed.launch import apiserver_argv


def _line(user: str, verb: str, stage: str = "ResponseComplete") -> str:
    event = {"stage": stage, "verb": verb, "user": {"username": user}, "objectRef": {"resource": "rayservices"}}
    return json.dumps(event) + "\n"


def test_a_mark_counts_only_what_came_after_it(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.log")
    assert log.offset() == 0 and log.events() == []
    log.path.write_text(_line("op", "create") + _line("op", "get", stage="RequestReceived"))
    mark = log.offset()
    with log.path.open("a") as f:
        f.write(_line("op", "patch") + _line("other", "patch"))
    assert [e["user"]["username"] for e in log.events(since=mark)] == ["op", "other"]
    assert [e["verb"] for e in log.events(user="op")] == ["create", "patch"]
    assert log.events(user="op", verbs={"patch"}, since=mark)[0]["user"]["username"] == "op"


def test_a_log_rotated_or_removed_after_the_mark_is_an_error_not_an_empty_count(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.log")
    log.path.write_text(_line("op", "create") * 3)
    mark = log.offset()
    log.path.rename(tmp_path / "audit-rotated.log")  # what the API server's rotation does
    log.path.write_text(_line("op", "patch"))  # the new file is shorter than the mark
    with pytest.raises(AuditLogRotated, match="rotated or truncated"):
        log.events(since=mark)
    log.path.unlink()
    with pytest.raises(AuditLogRotated, match="gone"):
        log.events(since=mark)
    assert log.events() == []  # no mark, no log yet: nothing happened


def test_the_api_server_never_rotates_the_audit_log(tmp_path: Path) -> None:
    pki = PkiFiles(*(tmp_path / f"{i}.pem" for i in range(7)))

    def argv(audit: bool) -> list[str]:
        return apiserver_argv(
            Binaries(tmp_path), tmp_path, pki, port=6443, etcd_port=2379, host="127.0.0.1",
            service_cidr="10.0.0.0/24", cluster=False, audit=audit, extra_args=[],
        )  # fmt: skip

    assert "--audit-log-maxsize=0" in argv(True)  # kube-apiserver's default is 100 (MB), then it rotates
    assert not [a for a in argv(False) if a.startswith("--audit")]
