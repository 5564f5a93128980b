"""The operator bench's regression check (bench/regression.py): a figure worse by more than 20 %
against the baseline fails the bench, naming the figure, the baseline and the new value."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from bench_modules import load

regression = load("regression")


def results(mode: str = "distinct", **overrides: Any) -> dict[str, Any]:
    """A bench run's JSON as operator_bench.py writes it (counts are strings after the round trip)."""
    counts = {
        "100": {"operator_s": 2.0, "operator_cpu_s": 1.0, "operator_vs_floor": 0.9, "floor_missing_writes": []},
        "1000": {"operator_s": 12.0, "operator_cpu_s": 6.0, "operator_vs_floor": 0.8, "floor_missing_writes": []},
    }
    storm = {"via": "events", "graphs": 100, "applied": 100, "p50_s": 1.0, "p99_s": 3.0, "all_applied_s": 4.0,
             "vs_floor": 0.5, "floor_missing_writes": []}  # fmt: skip
    out = {
        "mode": mode,
        "config": {"seed": 1, "namespaces": 10, "workers": 8, "changes": 200, "storm_fraction": 0.1},
        "counts": counts,
        "latency_p50_s": 0.03,
        "latency_p99_s": 0.06,
        "rss_loaded_mib": 140.0,
        "steady_writes_per_min": 0.0,
        "storms": [storm, {**storm, "via": "annotation"}] if mode == "distinct" else [],
    }
    out.update(overrides)
    round_trip: dict[str, Any] = json.loads(json.dumps(out))
    return round_trip


def run_check(current: dict[str, Any], baseline: dict[str, Any], tmp_path: Path) -> tuple[bool, str]:
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(regression.record([baseline], path)))
    out = io.StringIO()
    ok = regression.check([current], path, out)
    return ok, out.getvalue()


def test_figures_by_run_key() -> None:
    figs = regression.figures(results())
    assert set(figs) == {"distinct-100", "distinct-1000"}
    assert figs["distinct-100"] == {"operator_s": 2.0, "operator_cpu_s": 1.0, "operator_vs_floor": 0.9}
    # measured once, with every count present: the largest count's
    assert figs["distinct-1000"]["latency_p99_s"] == 0.06
    assert figs["distinct-1000"]["storm_events_p99_s"] == 3.0
    assert "latency_p99_s" not in figs["distinct-100"]


def test_the_same_figures_pass(tmp_path: Path) -> None:
    ok, out = run_check(results(), results(), tmp_path)
    assert ok, out
    assert "REGRESSION" not in out and out.rstrip().endswith("PASSED")


def test_more_than_20_percent_worse_fails_naming_figure_baseline_and_value(tmp_path: Path) -> None:
    slower = results()
    slower["counts"]["1000"]["operator_s"] = 15.0  # +25 %
    ok, out = run_check(slower, results(), tmp_path)
    assert not ok
    assert "REGRESSION distinct-1000 operator_s: baseline 12, now 15 (+25%" in out
    assert out.rstrip().endswith("FAILED")


def test_up_to_20_percent_worse_passes(tmp_path: Path) -> None:
    slower = results()
    slower["counts"]["1000"]["operator_s"] = 14.3  # +19 %
    ok, out = run_check(slower, results(), tmp_path)
    assert ok, out


def test_higher_is_better_figures_fail_when_lower(tmp_path: Path) -> None:
    worse = results()
    worse["counts"]["1000"]["operator_vs_floor"] = 0.6  # -25 %
    worse["storms"][0]["vs_floor"] = 0.9  # better: fine
    ok, out = run_check(worse, results(), tmp_path)
    assert not ok
    assert "REGRESSION distinct-1000 operator_vs_floor: baseline 0.8, now 0.6" in out
    assert "REGRESSION distinct-1000 storm_events_vs_floor" not in out


def test_noise_floor_of_small_figures() -> None:
    # 30 ms → 40 ms is +33 % but 10 ms: noise on two shared cores (slack 20 ms)
    assert not regression.regressed("latency_p50_s", 0.03, 0.04)
    assert regression.regressed("latency_p50_s", 0.03, 0.06)
    # no slack for writes in steady state: any write where there were none fails
    assert regression.regressed("steady_writes_per_min", 0.0, 1.0)
    assert regression.regressed("storm_events_p99_s", 3.0, 3.7)
    assert not regression.regressed("storm_annotation_p99_s", 3.0, 3.5)


def test_a_run_without_baseline_fails(tmp_path: Path) -> None:
    ok, out = run_check(results(), results(mode="shared"), tmp_path)
    assert not ok
    assert "NO BASELINE for distinct-1000" in out and "NO BASELINE for distinct-100 " in out


def test_a_floor_missing_the_operators_writes_fails(tmp_path: Path) -> None:
    bad = results()
    bad["counts"]["1000"]["floor_missing_writes"] = ["patch configmaps"]
    ok, out = run_check(bad, results(), tmp_path)
    assert not ok
    assert "INVALID    distinct-1000: the operator made patch configmaps and the floor did not" in out


def test_an_unfinished_storm_fails(tmp_path: Path) -> None:
    bad = results()
    bad["storms"][0].update({"applied": 97, "all_applied_s": None})
    ok, out = run_check(bad, results(), tmp_path)
    assert not ok
    assert "97 of 100 applied in time" in out


def test_record_keeps_other_runs(tmp_path: Path) -> None:
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(regression.record([results(mode="shared")], path)))
    merged = regression.record([results()], path)
    assert set(merged["runs"]) == {"shared-100", "shared-1000", "distinct-100", "distinct-1000"}
    assert merged["tolerance"] == 0.2


def test_a_run_with_another_configuration_fails(tmp_path: Path) -> None:
    bigger_storm = results()
    bigger_storm["config"]["storm_fraction"] = 0.3
    ok, out = run_check(bigger_storm, results(), tmp_path)
    assert not ok
    assert "INVALID    distinct-1000: run with" in out and "not comparable" in out


def test_a_storms_ratio_to_its_short_floor_is_shown_but_not_gated(tmp_path: Path) -> None:
    # Its floor (~1.5 s for 100 graphs) moved 1.3 to 1.9 s between runs of the same code; the
    # operator's own storm times stay gated.
    noisy = results()
    noisy["storms"][0]["vs_floor"] = 0.3  # -40 %
    ok, out = run_check(noisy, results(), tmp_path)
    assert ok, out
    assert "info       distinct-1000 storm_events_vs_floor: baseline 0.5, now 0.3 (-40%; not gated)" in out
    slower = results()
    slower["storms"][0]["all_applied_s"] *= 1.5
    ok, out = run_check(slower, results(), tmp_path)
    assert not ok and "REGRESSION distinct-1000 storm_events_all_applied_s" in out


def test_the_machines_python_speed_is_shown_but_not_gated(tmp_path: Path) -> None:
    # A loop 40 % slower is the machine's day, not the operator's code: shown beside the figures.
    ok, out = run_check(results(python_gauge_s=0.98), results(python_gauge_s=0.7), tmp_path)
    assert ok, out
    assert "info       distinct-1000 python_gauge_s: baseline 0.7, now 0.98 (+40%; not gated)" in out
    assert regression.figures(results(python_gauge_s=0.98))["distinct-1000"]["python_gauge_s"] == 0.98
    # A baseline recorded before the gauge existed: the figure is new, and the run still passes.
    ok, out = run_check(results(python_gauge_s=0.98), results(), tmp_path)
    assert ok, out
    assert "NEW        distinct-1000 python_gauge_s: 0.98 (no baseline)" in out


def with_floor(run: dict[str, Any], floor_s: float, scale: float = 1.0) -> dict[str, Any]:
    """The run measured on a machine `scale` times slower: its floor and every timed figure."""
    for count in run["counts"].values():
        count["floor_s"] = floor_s * scale
        count["operator_s"] *= scale
        count["operator_cpu_s"] *= scale
    run["latency_p50_s"] *= scale
    run["latency_p99_s"] *= scale
    for storm in run["storms"]:
        if storm["via"] == "events":
            continue  # paced by the endpoint's rate limit, whatever the machine (regression.PACED)
        for name in ("p50_s", "p99_s", "all_applied_s"):
            storm[name] *= scale
    return run


def test_a_slower_machine_is_not_a_regression(tmp_path: Path) -> None:
    # The same code on a day its floor took 30 % longer: every time and CPU figure +30 %.
    ok, out = run_check(with_floor(results(), 10.0, 1.3), with_floor(results(), 10.0), tmp_path)
    assert ok, out
    assert "ok         distinct-1000 operator_cpu_s: baseline 6, now 7.8, 6 at the baseline's speed (+0%)" in out
    assert "info       distinct-1000 floor_s: baseline 10, now 13" in out


def test_a_regression_on_a_faster_machine_is_still_one(tmp_path: Path) -> None:
    # The floor 20 % faster and the operator's CPU unchanged: per unit of machine, +25 %.
    faster = with_floor(results(), 10.0, 0.8)
    faster["counts"]["1000"]["operator_cpu_s"] = 6.0
    ok, out = run_check(faster, with_floor(results(), 10.0), tmp_path)
    assert not ok
    assert "REGRESSION distinct-1000 operator_cpu_s: baseline 6, now 6, 7.5 at the baseline's speed (+25%" in out


def test_a_slower_machine_still_shows_a_real_regression(tmp_path: Path) -> None:
    slower = with_floor(results(), 10.0, 1.3)
    slower["storms"][1]["all_applied_s"] = 4.0 * 1.3 * 1.25
    ok, out = run_check(slower, with_floor(results(), 10.0), tmp_path)
    assert not ok
    assert (
        "REGRESSION distinct-1000 storm_annotation_all_applied_s: baseline 4, now 6.5, 5 at the baseline's speed" in out
    )
    # figures that are not times are compared as measured
    assert "ok         distinct-1000 rss_loaded_mib: baseline 140, now 140 (+0%)" in out


def test_a_storm_paced_by_the_endpoints_rate_limit_is_compared_as_measured(tmp_path: Path) -> None:
    # Recorded on a slow day, checked on a day 20 % faster: the events storm took its 16.9 s
    # both days (5 events a second), which at the baseline's speed would read +25 %.
    baseline, faster = with_floor(results(), 10.0), with_floor(results(), 10.0, 0.8)
    for run in (baseline, faster):
        run["storms"][0].update({"p50_s": 6.2, "p99_s": 16.4, "all_applied_s": 16.9})
    ok, out = run_check(faster, baseline, tmp_path)
    assert ok, out
    assert "ok         distinct-1000 storm_events_all_applied_s: baseline 16.9, now 16.9 (+0%)" in out
    # the annotation storm is the operator's work: still at the baseline's speed
    assert "storm_annotation_all_applied_s: baseline 4, now 3.2, 4 at the baseline's speed (+0%)" in out
    slower_storm = with_floor(results(), 10.0, 0.8)
    slower_storm["storms"][0].update({"p50_s": 6.2, "p99_s": 16.4, "all_applied_s": 16.9 * 1.25})
    ok, out = run_check(slower_storm, baseline, tmp_path)
    assert not ok and "REGRESSION distinct-1000 storm_events_all_applied_s: baseline 16.9, now 21.12 (+25%" in out


def test_a_baseline_recorded_without_its_floor_has_it_from_time_and_ratio() -> None:
    assert regression.floor_of({"operator_s": 15.0, "operator_vs_floor": 0.7}) == 15.0 * 0.7
    assert regression.slowdown({"operator_s": 15.0, "operator_vs_floor": 0.7}, {"floor_s": 21.0}) == 2.0
    # a run that did not measure its floor is compared as measured
    assert regression.slowdown({"floor_s": 10.0}, {"operator_s": 15.0, "operator_vs_floor": 0.7}) is None


def test_a_machine_too_far_from_the_baselines_is_refused(tmp_path: Path) -> None:
    ok, out = run_check(with_floor(results(), 10.0, 1.6), with_floor(results(), 10.0), tmp_path)
    assert not ok
    assert "INVALID    distinct-1000: its floor took 1.60 times the baseline's" in out


def test_a_regression_must_show_in_every_run_of_the_same_key(tmp_path: Path) -> None:
    # `make bench` runs again after a failure: one noisy run is not a regression, two are.
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(regression.record([results()], path)))
    noisy, fine, slow = results(), results(), results()
    noisy["counts"]["1000"]["operator_cpu_s"] = 7.8  # +30 %
    fine["counts"]["1000"]["operator_cpu_s"] = 6.3  # +5 %
    slow["counts"]["1000"]["operator_cpu_s"] = 7.5  # +25 %
    out = io.StringIO()
    assert regression.check([noisy, fine], path, out), out.getvalue()
    assert "note       distinct-1000: 2 runs; each figure as the better run measured it" in out.getvalue()
    assert "ok         distinct-1000 operator_cpu_s: baseline 6, now 6.3 (+5%)" in out.getvalue()
    out = io.StringIO()
    assert not regression.check([noisy, slow], path, out)
    assert "REGRESSION distinct-1000 operator_cpu_s: baseline 6, now 7.5 (+25%" in out.getvalue()
    # each run's problems still count: an unfinished storm in either fails
    unfinished = results()
    unfinished["storms"][0].update({"applied": 97, "all_applied_s": None})
    out = io.StringIO()
    assert not regression.check([fine, unfinished], path, out)
    assert "97 of 100 applied in time" in out.getvalue()


def test_a_refused_run_is_left_out_when_another_run_of_its_key_is_comparable(tmp_path: Path) -> None:
    # `make bench` ran twice: the first on a machine 2.4 times slow, the second at the baseline's speed.
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(regression.record([with_floor(results(), 10.0)], path)))
    crawled, regressed = with_floor(results(), 10.0, 2.4), with_floor(results(), 10.0)
    crawled["counts"]["1000"]["operator_cpu_s"] = 6.0 * 2.4 * 0.8  # reads -20 % once scaled: must not count
    regressed["counts"]["1000"]["operator_cpu_s"] = 6.0 * 1.3
    out = io.StringIO()
    assert not regression.check([crawled, regressed], path, out)
    text = out.getvalue()
    assert "REGRESSION distinct-1000 operator_cpu_s: baseline 6, now 7.8" in text
    assert "note       distinct-1000: 1 run(s) left out, distinct-1000: its floor took 2.40 times" in text
    assert "INVALID" not in text
    fine = with_floor(results(), 10.0)
    out = io.StringIO()
    assert regression.check([crawled, fine], path, out), out.getvalue()
    # with no comparable run left, the key is refused as before
    out = io.StringIO()
    assert not regression.check([crawled, crawled], path, out)
    assert "INVALID    distinct-1000: its floor took 2.40 times the baseline's" in out.getvalue()


def long_storms(run: dict[str, Any], floor_s: float, scale: float = 1.0) -> dict[str, Any]:
    """Storms long enough for their own floor to measure the machine (the 10,000 run's), on a
    machine `scale` times slower during them, whatever it was during the round."""
    for storm in run["storms"]:
        storm["floor_s"] = floor_s * scale
        if storm["via"] == "events":
            continue  # its times are paced (regression.PACED)
        storm.update({"all_applied_s": 2 * floor_s * scale, "vs_floor": 0.5})
        storm["p50_s"] *= scale
        storm["p99_s"] *= scale
    return run


def test_a_long_storm_is_timed_by_its_own_floor(tmp_path: Path) -> None:
    # The round at the baseline's speed, the storms minutes later on a machine 1.4 times slower:
    # their times +40 % as measured, unchanged against their own floor.
    base = long_storms(with_floor(results(), 10.0), 12.0)
    ok, out = run_check(long_storms(with_floor(results(), 10.0), 12.0, 1.4), base, tmp_path)
    assert ok, out
    assert (
        "ok         distinct-1000 storm_annotation_all_applied_s: baseline 24, now 33.6, 24 at the baseline's speed"
        in out
    )
    assert "info       distinct-1000 storm_annotation_floor_s: baseline 12, now 16.8 (+40%; not gated)" in out
    # a storm slower against its own floor is a regression, though the round's floor (1.4 times
    # the baseline's) would have excused it
    slower = long_storms(with_floor(results(), 10.0, 1.4), 12.0)
    slower["storms"][1].update({"p50_s": 1.0, "p99_s": 3.0, "all_applied_s": 24.0 * 1.3})
    ok, out = run_check(slower, base, tmp_path)
    assert not ok
    assert (
        "REGRESSION distinct-1000 storm_annotation_all_applied_s: baseline 24, now 31.2, 31.2 at the baseline's "
        "speed (+30%" in out
    )
    # a storm's floor too far from its baseline's refuses the run, naming that floor
    ok, out = run_check(long_storms(with_floor(results(), 10.0, 1.3), 12.0, 1.9), base, tmp_path)
    assert not ok
    assert (
        "INVALID    distinct-1000: the events storm's own floor took 1.90 times the baseline's, "
        "the annotation storm's own floor took 1.90 times the baseline's: the machine is not comparable" in out
    )
    assert "its floor took" not in out  # the round's 1.3 is comparable


def test_a_short_storm_is_timed_by_the_runs_floor(tmp_path: Path) -> None:
    # The 1,000 run's storms of 100 graphs: a floor of 2 s swings by more than the tolerance.
    base = with_floor(results(), 10.0)
    for storm in base["storms"]:
        storm["floor_s"] = 2.0
    noisy = with_floor(results(), 10.0, 1.3)
    for storm in noisy["storms"]:
        storm["floor_s"] = 2.0 * 1.9  # would refuse the run, were it trusted
    ok, out = run_check(noisy, base, tmp_path)
    assert ok, out
    assert "storm_annotation_all_applied_s: baseline 4, now 5.2, 4 at the baseline's speed (+0%)" in out
