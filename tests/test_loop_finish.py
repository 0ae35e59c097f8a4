"""A run the agent ends on purpose, and what a close tells it (pytest_kopt.loop, as plain functions over recorded
gate results, like tests/test_loop_close.py): finish, start_over from the best kernel, the residual no method
explains, verified iterations, the final champion's roofline, the best a close compared against, loop.stage and
next.write, analysis.md written by kopt."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_kopt.errors import ConfigError
from pytest_kopt.loop import decisions, session
from pytest_kopt.loop import state as st

from test_loop_close import METHOD, Run

OTHER = "compute.register_tiling"


def _methods(it: Path, *ids: str, **extra: Any) -> None:
    (it / "methods.json").write_text(json.dumps({"methods": [{"id": i, "rationale": f"why {i}"} for i in ids],
                                                 **extra}))


def _close_one_iteration(r: Run, b1: float = 10.0, ablation_ms: float = 12.0) -> dict[str, Any]:
    """Iteration 1 closed in one step: b1 wins, its ablation of METHOD written before the close."""
    k = r.kernel("branches/b1", b1)
    r.judged(k, r.kernel(f"ablations/{METHOD}", ablation_ms, base="b1"))
    return r.close()


def test_finish_alone_ends_the_run_now_and_every_record_says_why(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, an empty methods.json was refused and there was no other way to stop: the agent had to invent a
    method. Now {"finish": why} ends the run at the open iteration, unjudged, exit 0: stop.json (exit 0, stage
    finish), state (completed, finished), summary.md and the step's result hold the reason; next is done."""
    r = Run(tmp_path)
    r.fake_profile(monkeypatch)
    out = _close_one_iteration(r)
    assert out["next"]["iteration"] == 2
    it2 = r.run / "iterv2"
    why = "nothing triggered is left within the budget"
    (it2 / "methods.json").write_text(json.dumps({"finish": why}))
    over = session.run_overrides(r.run)  # no branch written: the session's kernel is the best, left unjudged
    assert over["baseline"] == st.load_state(r.run)["best_file"] and over["candidate"] == []
    assert session.finishing(r.run)
    res = session.finish_run(r.run, r.ctx_for, [], False, env={"generation_allowed": False}).to_json()
    assert (res["exit_code"], res["stage"], res["finish"]) == (0, "finish", why)  # no GPU needed to finish
    assert res["next"]["action"] == "done" and res["next"]["finish"] == why
    stop = json.loads((r.run / "stop.json").read_text())
    assert (stop["exit_code"], stop["stop_stage"], stop["stop_reason"]) == (0, "finish", why)
    assert stop["details"] == {"left_open": "iterv2"}
    state = st.load_state(r.run)
    assert (state["run_status"], state["completion"], state["open_iter"]) == ("completed", "finished", None)
    assert state["stop_reason"] == why and state["verified_iterations"] == 1
    assert f"**Finished by the agent:** {why}" in (r.run / "summary.md").read_text()
    assert st.run_view(r.run)["phase"] == "completed"


def test_finish_beside_methods_closes_the_iteration_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    r = Run(tmp_path)
    r.fake_profile(monkeypatch)
    _methods(r.it, METHOD, finish="the budget is spent on what matters")
    out = _close_one_iteration(r, b1=10.0, ablation_ms=12.0)
    assert (out["exit_code"], out["stage"], out["finish"]) == (0, "finish", "the budget is spent on what matters")
    assert out["attribution"][METHOD]["contributed"] is True and out["next"]["action"] == "done"
    state = st.load_state(r.run)
    assert (state["completion"], state["history"][0]["iter"]) == ("finished", 1)
    assert not (r.run / "iterv2").exists()  # the run ended after the close: no iteration 2 was opened
    assert json.loads((r.run / "stop.json").read_text())["details"] is None


def test_finish_during_a_close_waiting_for_ablations_concludes_it_first(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Adding finish beside the same claims in the second step is allowed (the claims did not change) and ends the
    run after the conclusion; dropping the claims for finish alone is refused, and the fix says how to finish."""
    r = Run(tmp_path)
    r.fake_profile(monkeypatch)
    r.judged(r.kernel("branches/b1", 10.0), r.kernel("branches/b2", 8.0))
    assert r.close()["next"]["action"] == "write_ablations"
    (r.it / "methods.json").write_text(json.dumps({"finish": "enough"}))
    with pytest.raises(ConfigError) as exc:
        session.run_overrides(r.run)
    assert '"finish": "<why>"' in exc.value.fix
    _methods(r.it, METHOD, finish="enough")
    r.judged(r.kernel(f"ablations/{METHOD}", 9.0, base="b2"))
    out = r.close()
    assert (out["stage"], out["finish"], out["next"]["action"]) == ("finish", "enough", "done")
    assert st.load_state(r.run)["ablation_step"] is None


def test_an_empty_methods_json_says_how_to_finish(tmp_path: Path) -> None:
    from pytest_kopt import registry
    from pytest_kopt.loop.methods import validate_methods

    reg = registry.load(registry.METHODS)
    (p,) = validate_methods({"methods": []}, reg, {"compute": 1, "memory": 1, "latency": 1}, {}, "sm_90a")
    assert p.detail["rule"] == "empty" and '{"finish": "<why>"}' in p
    assert validate_methods({"methods": [], "finish": "done"}, reg, {}, {}, "sm_90a") == []


def test_start_over_seeds_from_the_best_kernel_beside_the_stopped_run(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, start_over re-seeded from the original baseline and dropped the best kernel found. Now its command
    starts from iterv<i>/kernel.<ext> (seeds_from), the new run is made beside the stopped one (never inside it),
    and reuse lists the files written into the iteration the stop left."""
    r = Run(tmp_path)
    r.fake_profile(monkeypatch)
    _close_one_iteration(r, b1=10.0)  # 10 ms beats the 20 ms baseline: iterv1/kernel.cu is the best
    it2 = r.run / "iterv2"
    (it2 / "branches" / "b1" / "kernel.cu").write_text("// written before the stop\n")
    _methods(it2, OTHER)
    st.stop_run(r.run, "no GPU", "hardware", 3)
    nxt = st.next_step(r.run)
    best = r.run / "iterv1" / "kernel.cu"
    assert nxt["action"] == "start_over" and nxt["seeds_from"] == str(best)
    assert f"--kopt-baseline={best}" in nxt["command"] and "--kopt-ncu-num=5" in nxt["command"]
    report = tmp_path / f"kopt-init-{r.run.name}.json"  # beside the run, named after it
    assert nxt["command"][-1] == f"--kopt-json={report}"
    assert nxt["report"] == str(report)  # where the agent reads the command's outcome
    assert set(nxt["reuse"]) == {str(it2 / "methods.json"), str(it2 / "branches" / "b1" / "kernel.cu")}
    new = st.new_run_dir(best)
    assert new.parent == tmp_path and new != r.run
    assert st.run_home(r.run / "baseline" / "k.cu") == tmp_path and st.run_home(tmp_path / "k.cu") == tmp_path


def test_the_residual_is_the_gain_no_method_explains() -> None:
    """1.7010 ms -> 0.0089 ms (the issue's softmax), two methods explaining 0.25 ms of the 1.6921 ms gain: 85% of
    it is in no attribution; an inconclusive method explains nothing and is listed."""
    attr = {"a": {"attribution_ms": 0.20}, "b": {"attribution_ms": 0.05}, "c": {"attribution_ms": None}}
    res = decisions.residual(1.7010, 0.0089, attr)
    assert res is not None
    assert res["gain_ms"] == pytest.approx(1.6921) and res["explained_ms"] == pytest.approx(0.25)
    assert res["residual_ms"] == pytest.approx(1.4421)
    assert res["residual_pct_of_gain"] == pytest.approx(85.225, abs=1e-3)
    assert res["explained_pct_of_gain"] + res["residual_pct_of_gain"] == pytest.approx(100.0)
    assert res["gain_pct"] == pytest.approx(99.477, abs=1e-3)
    assert (res["methods_counted"], res["inconclusive"], res["label"]) == (["a", "b"], ["c"],
                                                                           "not explained by any method")
    assert res["note"] is None
    # the transpose drive's first iteration on the H200: 0.4840 -> 0.1953 ms, and the champion without its shared
    # memory tiling took 1.0951 ms: the method "explains" 0.8998 ms of a 0.2887 ms gain
    tiled = decisions.residual(0.4840, 0.1953, {"memory.shared_memory_tiling": {"attribution_ms": 0.8998}})
    assert tiled is not None and tiled["residual_ms"] == pytest.approx(-0.6111)
    assert tiled["residual_pct_of_gain"] == pytest.approx(-211.67, abs=0.01) and tiled["note"] == decisions.NOT_ADDITIVE
    worse = decisions.residual(1.0, 1.1, {"a": {"attribution_ms": 0.1}})
    assert worse is not None and worse["residual_pct_of_gain"] is None  # no gain to share out
    assert worse["note"] is None
    assert decisions.residual(None, 1.0, {}) is None


def test_a_close_records_the_residual_and_the_best_it_compared_against(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    r = Run(tmp_path, best_ms=20.0)
    r.fake_profile(monkeypatch)
    out = _close_one_iteration(r, b1=10.0, ablation_ms=12.0)  # gain 10 ms, the method explains 2 ms
    res = out["residual"]
    assert (res["gain_ms"], res["explained_ms"], res["residual_ms"]) == (10.0, 2.0, 8.0)
    assert res["residual_pct_of_gain"] == pytest.approx(80.0)
    assert json.loads((r.it / "attribution.json").read_text())["residual"] == res
    assert st.load_state(r.run)["history"][0]["residual"] == res
    assert out["compared_against"] == {"best_ms": 20.0, "best_file": "baseline/k.cu", "source": "state",
                                       "noise_pct": 2.0, "threshold_ms": pytest.approx(19.6)}
    summary = (r.run / "summary.md").read_text()
    assert "residual: not explained by any method" in summary and "8.0000 ms of a 10.0000 ms gain (80.0%)" in summary


def test_verified_iterations_count_only_iterations_that_verified_a_method(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """SKILL.md: an unverified iteration never increments verified_iterations. Iteration 1 verifies
    shared-memory tiling (SASS pass, attribution conclusive); iteration 2's only method has no SASS signature
    (register tiling: inconclusive), so it verified nothing and is not counted."""
    assert decisions.verified({"a": "unverified", "b": "ineffective"}) and not decisions.verified({"a": "unverified"})
    r = Run(tmp_path)
    r.fake_profile(monkeypatch)
    _close_one_iteration(r)
    r.it = r.run / "iterv2"
    _methods(r.it, OTHER)
    k = r.kernel("branches/b1", 5.0)
    r.judged(k, r.kernel(f"ablations/{OTHER}", 6.0, base="b1"))
    out = r.close()
    assert out["verdicts"] == {OTHER: "unverified"}
    state = st.load_state(r.run)
    assert [h["verified"] for h in state["history"]] == [True, False]
    assert (state["verified_iterations"], state["last_verified_iter"]) == (1, 1)


def test_roofline_history_holds_the_final_champion(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, roofline_history was appended when an iteration opened, so the last champion's gaps were in neither
    it nor summary.md. Now: the baseline's profile, then each champion's at its close."""
    r = Run(tmp_path)
    r.fake_profile(monkeypatch)
    st.save_state(r.run, {"iterations_total": 1})
    state = st.load_state(r.run)
    assert state["roofline_history"][0]["profile"] == "best_input"
    out = _close_one_iteration(r)
    assert out["next"]["action"] == "done"  # the last iteration: no next one opened
    rh = st.load_state(r.run)["roofline_history"]
    assert [(h["iter"], h["profile"], h["kernel"]) for h in rh] == [(1, "best_input", "baseline/k.cu"),
                                                                     (1, "champion", "iterv1/kernel.cu")]
    assert rh[1]["improved"] is True and "the champion `iterv1/kernel.cu`" in (r.run / "summary.md").read_text()


def test_every_step_result_names_its_stage_and_next_write_holds_paths_only(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    r = Run(tmp_path)
    r.fake_profile(monkeypatch)
    nxt = st.next_step(r.run)
    assert all("<" not in p and "{" not in p for p in nxt["write"])
    assert nxt["methods_file"] == str(r.it / "methods.json")
    assert nxt["branch_kernels"] == {"b1": str(r.it / "branches" / "b1" / "kernel.cu"),
                                     "b2": str(r.it / "branches" / "b2" / "kernel.cu")}
    # the optional ablations by method once methods.json names them, and as a pattern
    assert nxt["ablations"] == [{"method": METHOD, "kernel": str(r.it / "ablations" / METHOD / "kernel.cu"),
                                 "base": str(r.it / "ablations" / METHOD / "base")}]
    assert nxt["ablation_pattern"]["kernel"].endswith("ablations/{method}/kernel.cu")
    r.judged(r.kernel("branches/b1", 10.0), r.kernel("branches/b2", 8.0))
    first = r.close()
    assert first["stage"] == "branch_explore" and all("<" not in p for p in first["next"]["write"])
    r.judged(r.kernel(f"ablations/{METHOD}", 9.0, base="b2"))
    assert r.close()["stage"] == "conclude"
    st.stop_run(r.run, "no GPU", "hardware", 3)
    bad = session.finish_run(r.run, r.ctx_for, [], False).to_json()
    assert (bad["exit_code"], bad["stage"]) == (4, "loop")


def test_analysis_md_is_written_by_kopt_from_methods_json_and_keeps_the_agents_notes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Decision: analysis.md is not asked of the agent (it was an empty template nobody checked); methods.json
    carries the reasons as fields, and the close writes them, the branches and the outcome into analysis.md.
    Notes the agent adds under ## Notes are kept."""
    r = Run(tmp_path)
    r.fake_profile(monkeypatch)
    text = (r.it / "analysis.md").read_text()
    assert "Nothing in this file needs writing" in text and "## Notes" in text
    (r.it / "analysis.md").write_text(text + "tile sizes from the last run's frontier\n")
    _methods(r.it, METHOD, skipped_higher=[{"id": "memory.tma", "reason": "no descriptors in this kernel"}])
    _close_one_iteration(r)
    text = (r.it / "analysis.md").read_text()
    assert f"`{METHOD}`: why {METHOD}" in text and "memory.tma: no descriptors in this kernel" in text
    assert "| b1 | PASSED | 10.0000 |" in text and "residual, not explained by any method" in text
    assert text.rstrip().endswith("tile sizes from the last run's frontier")
