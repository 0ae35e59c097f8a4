"""The two-step close against a careless or adversarial agent (and a crash): pytest_kopt.loop.session.finish_run
and run_overrides driven as plain functions with fake gate results, like tests/test_loop_close.py. Each test
names the defect a red team found (2026-12-02) and the behaviour that replaced it; a test accepts either of the
fixes its docstring names (a refusal, or the right conclusion)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_kopt.errors import ConfigError, KoptError
from pytest_kopt.loop import gates as loop_gates
from pytest_kopt.loop import session
from pytest_kopt.loop import state as st
from pytest_kopt.records import GateRecord

from test_loop_close import METHOD, Run

OTHER = "compute.register_tiling"  # a second claim that fits the 1/1/1 budget beside METHOD


def _methods(*ids: str) -> str:
    return json.dumps({"methods": [{"id": i, "rationale": "probe"} for i in ids]})


def _first_step(r: Run, *, b1: float = 10.0, b2: float = 8.0, stale: tuple[str, ...] = (METHOD,)) -> dict[str, Any]:
    """b2 wins; every ablation in ``stale`` was written before the close from b1: the close asks for b2's."""
    ks = [r.kernel("branches/b1", b1), r.kernel("branches/b2", b2)]
    ks += [r.kernel(f"ablations/{m}", 12.0, base="b1") for m in stale]
    r.judged(*ks)
    first = r.close()
    assert first["next"]["action"] == "write_ablations" and first["champion"] == "b2"
    return first


def _records(k: Path, **outcomes: tuple[str, str, str | None]) -> list[GateRecord]:
    """Records of one kernel: gate -> (outcome, status, blocked_by)."""
    return [GateRecord(nodeid=f"{k}::{g}", kernel=str(k.resolve()), gate=g, case=None, outcome=o, status=s,
                       blocked_by=b, message=None if o == "passed" else f"{g} {s}") for g, (o, s, b) in outcomes.items()]


def test_a_method_removed_from_methods_json_between_the_steps_is_not_silently_dropped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Defect: methods.json is re-read in the second step and not frozen by the first. The branches were judged
    (and the champion picked) under the claims [METHOD, OTHER]; deleting OTHER from methods.json after step 1
    makes step 2 close the iteration as if OTHER was never claimed: no attribution, no SASS verdict, not in
    selected_methods (so it can be re-claimed later without override_reason, and an implementation_failed verdict
    can be dodged). Expected: step 2 concludes on the claims step 1 judged (state['ablation_step'] keeps them) or
    refuses the edited methods.json."""
    r = Run(tmp_path)
    r.fake_profile(monkeypatch)
    (r.it / "methods.json").write_text(_methods(METHOD, OTHER))
    first = _first_step(r, stale=(METHOD, OTHER))
    assert first["ablations_needed"] == [METHOD, OTHER]
    (r.it / "methods.json").write_text(_methods(METHOD))  # the agent drops the second claim
    try:
        session.run_overrides(r.run)
    except ConfigError:
        return  # refusing the edit is a fix
    r.judged(r.kernel(f"ablations/{METHOD}", 9.0, base="b2"))
    second = r.close()
    assert set(second["attribution"]) == {METHOD, OTHER}
    assert OTHER in st.load_state(r.run)["selected_methods"]


def test_a_method_added_to_methods_json_between_the_steps_is_not_claimed_with_a_contradictory_reason(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Defect: a method added to methods.json after step 1 (its branches never claimed it) joins the iteration's
    claims in step 2; its ablation, written with base b2 as asked, is never judged (run_overrides keeps only
    step 1's 'needed'), and its attribution reason reads 'ablation built from b2, champion is b2'. Expected: the
    edit is refused, or step 2 concludes on step 1's claims only (the added method is not in this iteration's
    history)."""
    r = Run(tmp_path)
    r.fake_profile(monkeypatch)
    _first_step(r)
    (r.it / "methods.json").write_text(_methods(METHOD, OTHER))
    ab = r.kernel(f"ablations/{METHOD}", 9.0, base="b2")
    added = r.kernel(f"ablations/{OTHER}", 9.5, base="b2")
    try:
        over = session.run_overrides(r.run)
    except ConfigError:
        return
    r.judged(*[Path(k) for k in [over["baseline"], *over["candidate"]]])
    second = r.close()
    reasons = [str(a.get("reason")) for a in second["attribution"].values()]
    assert not any("built from b2, champion is b2" in x for x in reasons), reasons
    assert st.load_state(r.run)["history"][-1]["methods"] == [METHOD] or str(added) in (
        [over["baseline"], *over["candidate"]]), (ab, added)


def test_a_champion_edited_between_the_steps_is_not_recorded_as_the_best(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Defect (high): step 2 does not re-judge the champion, yet close_iteration copies the champion's *current*
    branches/b2/kernel.cu into iterv1/kernel.cu, which becomes best_file. Editing the champion after step 1 (a
    careless 'small tweak', or on purpose) makes an unjudged kernel the run's best, carrying step 1's time and
    correctness. Expected: step 1 snapshots the judged champion (or records its hash) and step 2 uses that
    snapshot, or refuses a champion that changed."""
    r = Run(tmp_path)
    r.fake_profile(monkeypatch)
    _first_step(r)
    judged_src = (r.it / "branches" / "b2" / "kernel.cu").read_text()
    (r.it / "branches" / "b2" / "kernel.cu").write_text("// edited after it won: never compiled or checked\n")
    r.judged(r.kernel(f"ablations/{METHOD}", 9.0, base="b2"))
    try:
        out = r.close()
    except (ConfigError, KoptError):
        return
    if out["exit_code"] != 0:
        return
    best = Path(st.load_state(r.run)["best_file"])
    assert best.read_text() == judged_src


def test_run_overrides_refuses_a_second_step_whose_champion_is_gone(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Defect: with the champion's branch folder deleted between the steps, run_overrides still hands the
    session the ablation (or, with none written, the missing champion kernel as --kopt-baseline, which fails
    with an unrelated 'baseline not found'-style error). Expected: a ConfigError naming the champion's kernel
    and how to recover (restore it, or start the close over)."""
    r = Run(tmp_path)
    r.fake_profile(monkeypatch)
    _first_step(r)
    r.kernel(f"ablations/{METHOD}", 9.0, base="b2")
    champion = r.it / "branches" / "b2" / "kernel.cu"
    champion.unlink()
    with pytest.raises(ConfigError, match="b2"):
        session.run_overrides(r.run)


def test_a_second_step_whose_champion_is_gone_neither_crashes_nor_half_closes(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Defect: the same deletion makes finish_run raise FileNotFoundError from close_iteration's copy of the
    champion (an INTERNALERROR, no --kopt-json report), after _ablation_step already cleared
    state['ablation_step']: the iteration is neither concluded nor awaiting its ablations, and the next
    --kopt-run silently starts the close over (re-judges every branch). Expected: a loop result (exit code,
    message naming the champion), and state.json either still in the ablation step or the iteration closed."""
    r = Run(tmp_path)
    r.fake_profile(monkeypatch)
    _first_step(r)
    ab = r.kernel(f"ablations/{METHOD}", 9.0, base="b2")
    (r.it / "branches" / "b2" / "kernel.cu").unlink()
    r.judged(ab)
    crashed = None
    try:
        out = r.close()
    except OSError as exc:
        crashed, out = exc, None
    state = st.load_state(r.run)
    assert state.get("ablation_step") or state.get("open_iter") != 1, "half-closed: no ablation step, iterv1 open"
    assert crashed is None, f"finish_run raised {crashed!r}"
    assert out is not None and "b2" in out["message"]


def test_an_ablation_written_as_kernel_py_beside_a_stale_kernel_cu_is_the_one_judged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Defect: kernel_in() prefers kernel.cu over kernel.py without saying so. The stale ablation of b1 was
    kernel.cu; the agent writes the champion's ablation as kernel.py and sets base to b2: run_overrides hands the
    session the stale kernel.cu (b1's ablation), which is then judged and attributed as b2's. Expected: a folder
    with both kernel.cu and kernel.py is refused as ambiguous (ConfigError), or the kernel written for the base
    named is judged."""
    r = Run(tmp_path)
    r.fake_profile(monkeypatch)
    _first_step(r)
    folder = r.it / "ablations" / METHOD
    (folder / "kernel.py").write_text("# ablation of b2\n")
    (folder / "base").write_text("b2\n")
    try:
        over = session.run_overrides(r.run)
    except ConfigError:
        return
    assert over["baseline"] != str(folder / "kernel.cu"), "the stale b1 ablation (kernel.cu) is judged as b2's"


def test_write_ablations_names_the_champions_language(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Defect: next.ablations[*].kernel takes its suffix from the run's baseline, not from the champion. With a
    .cu baseline and a Python (kernel.py) champion, the agent is told to write the champion-without-the-method
    as kernel.cu. Expected: the ablation path has the champion's suffix (kernel.py)."""
    r = Run(tmp_path)
    r.fake_profile(monkeypatch)
    b1 = r.kernel("branches/b1", 10.0)
    b2 = r.it / "branches" / "b2" / "kernel.py"
    b2.write_text("# b2\n")
    out = r.outdir(b2)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps({"timing_valid": True, "median_ms": 8.0, "gpu_uuid": "GPU-0"}))
    (out / "sass").mkdir(exist_ok=True)
    r.judged(b1, b2)
    first = r.close()
    assert first["champion"] == "b2" and first["next"]["action"] == "write_ablations"
    assert first["next"]["ablations"][0]["kernel"].endswith("kernel.py"), first["next"]["ablations"]


def test_write_ablations_paths_can_be_written_as_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Defect (low): next.write of a write_ablations step names iterv1/ablations/<method>/kernel.cu and base, but
    for a method with no ablation written before the close the folder does not exist (branches/b*/ are made by
    open_iteration; these are not), so an agent writing exactly the named paths fails with FileNotFoundError.
    Expected: every path in next.write is absolute and its folder exists."""
    r = Run(tmp_path)
    r.fake_profile(monkeypatch)
    _first_step(r, stale=())
    nxt = st.next_step(r.run)
    assert nxt["write"]
    for p in nxt["write"]:
        assert Path(p).is_absolute() and Path(p).parent.is_dir(), p


def test_finalize_given_to_the_first_step_is_not_lost_in_the_second(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Defect: `--kopt-run RUN --kopt-finalize` whose close takes two steps ignores --kopt-finalize in step 1
    (it returns write_ablations) and neither records it nor puts it in next.command; the agent runs next.command
    and the run opens iterv2 instead of completing. Expected: the finalize intent carries to the conclusion
    (kept in state['ablation_step'], or --kopt-finalize in next.command)."""
    r = Run(tmp_path)
    r.fake_profile(monkeypatch)
    ks = [r.kernel("branches/b1", 10.0), r.kernel("branches/b2", 8.0)]
    r.judged(*ks)
    first = session.finish_run(r.run, r.ctx_for, r.records, True).to_json()
    assert first["next"]["action"] == "write_ablations"
    finalize = "--kopt-finalize" in first["next"]["command"]
    r.judged(r.kernel(f"ablations/{METHOD}", 9.0, base="b2"))
    session.finish_run(r.run, r.ctx_for, r.records, finalize)
    assert st.load_state(r.run)["run_status"] == "completed"


def test_an_ablation_that_could_not_run_its_gpu_gates_keeps_the_second_step_open(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Defect: step 2 run where there is no GPU (the ablation's timing skipped, blocked by the hardware gate)
    concludes the iteration with attribution 'the ablation failed SKIPPED' and the method unverified, for good.
    Step 1 treats the same situation as exit 3, 'the iteration stays open: run again where the GPU is'.
    Expected: exit 3, state['ablation_step'] kept, iterv1 still open, no history entry."""
    r = Run(tmp_path)
    r.fake_profile(monkeypatch)
    _first_step(r)
    ab = r.kernel(f"ablations/{METHOD}", None, base="b2")
    r.records = _records(ab, compile=("passed", "PASSED", None), correctness=("passed", "PASSED", None),
                         timing=("skipped", "SKIPPED", "hardware"))
    out = r.close()
    state = st.load_state(r.run)
    assert out["exit_code"] == 3, (out["exit_code"], out.get("attribution"))
    assert state.get("ablation_step") and state["open_iter"] == 1 and state["history"] == []
    # the same command, run where the GPU is: not again here (before: runs_here True, requires None)
    assert out["next"]["action"] == "write_ablations" and out["next"]["runs_here"] is False
    assert out["next"]["requires"].startswith("a machine with an NVIDIA GPU, nvcc and ncu that can read its counters: "
                                              f"this one could not run the ablation of {METHOD}'s GPU gates")


def test_a_branch_step_where_no_branch_could_run_its_gpu_gates_is_run_again_elsewhere(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No branch passed and one could not run its GPU gates here: exit 3, the iteration stays open, and next says
    the same command runs on a machine with a GPU, not here (runs_here False, requires naming the branch)."""
    r = Run(tmp_path)
    r.fake_profile(monkeypatch)
    k = r.kernel("branches/b1", None)
    r.records = _records(k, compile=("passed", "PASSED", None), correctness=("passed", "PASSED", None),
                         timing=("skipped", "SKIPPED", "hardware"))
    out = r.close()
    assert out["exit_code"] == 3 and st.load_state(r.run)["open_iter"] == 1
    assert out["next"]["action"] == "write_and_close" and out["next"]["runs_here"] is False
    assert "this one could not run b1's GPU gates (timing SKIPPED)" in out["next"]["requires"]
    assert out["next"]["command"][-1] == f"--kopt-json={r.it / 'report.json'}"  # the step's own command


def test_an_ablation_without_a_timing_item_in_this_session_is_not_timed_from_a_stale_bench_json(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Defect: ablation_results (and branch_results) take median_ms from the kernel folder's bench.json whenever no
    record of this session blocks it, without requiring a timing record. The ablation folder still holds the
    bench.json of the stale b1-based ablation judged in step 1 (12.0 ms); step 2 run with the timing items
    deselected (-k / -m 'not gpu') 'times' b2's new ablation at 12.0 ms and attributes 50% to the method.
    Expected: no timing record in this session -> not timed (attribution inconclusive), as --kopt-init already
    refuses ('were some gates deselected with -k?')."""
    r = Run(tmp_path)
    r.fake_profile(monkeypatch)
    _first_step(r)
    folder = r.it / "ablations" / METHOD
    (folder / "kernel.cu").write_text("// ablation of b2\n")
    (folder / "base").write_text("b2\n")
    ab = folder / "kernel.cu"
    r.records = _records(ab, compile=("passed", "PASSED", None), correctness=("passed", "PASSED", None))
    out = r.close()
    assert out.get("attribution", {}).get(METHOD, {}).get("contributed") is None, out.get("attribution")


def test_a_failed_same_gpu_retiming_still_says_what_to_do_next(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Defect (low): when re-timing on one GPU fails (step 1 or step 2) the run is stopped but the loop result has
    no 'next' (every other stop returns next_step(): start_over with the --kopt-init command). Expected:
    next.action == 'start_over'."""
    r = Run(tmp_path)
    r.fake_profile(monkeypatch)
    b1, b2 = r.kernel("branches/b1", 10.0), r.kernel("branches/b2", 10.2)
    (r.outdir(b2) / "bench.json").write_text(json.dumps({"timing_valid": True, "median_ms": 10.2,
                                                         "gpu_uuid": "GPU-1"}))
    r.judged(b1, b2)

    def boom(ctxs: Any) -> Any:
        raise KoptError("timing harness died")

    monkeypatch.setattr(loop_gates, "retime_interleaved", boom)
    monkeypatch.setattr(loop_gates, "ensure_built", lambda ctx: None)
    out = r.close()
    assert st.load_state(r.run)["run_status"] == "stopped"
    assert (out.get("next") or {}).get("action") == "start_over", out


@pytest.mark.parametrize("base", ["branches/b2", "\ufeffb2\n", "iterv1/branches/b2/"])
def test_a_base_that_names_no_branch_is_refused_not_concluded_as_stale(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                       base: str) -> None:
    """Defect: ablation_base() only strips whitespace; a base that names no branch of the iteration (the branch's
    path instead of its name, a UTF-8 BOM from an editor) is taken as 'built from another branch'. In step 2
    run_overrides then drops the ablation (the session judges the champion again) and the step concludes the
    iteration for good with 'ablation built from branches/b2, champion is b2'. Expected: a base naming no branch
    of the iteration is refused (ConfigError naming the base file and the branches), or read as the branch it
    plainly names, so that the ablation is judged."""
    r = Run(tmp_path)
    r.fake_profile(monkeypatch)
    _first_step(r)
    ab = r.kernel(f"ablations/{METHOD}", 9.0)
    (ab.parent / "base").write_text(base)
    try:
        over = session.run_overrides(r.run)
    except ConfigError:
        return
    assert over["baseline"] == str(ab), f"base {base!r}: the ablation is not judged, the champion is"


def test_an_undecodable_base_file_is_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Defect (low): a base file that is not UTF-8 (written as UTF-16 by an editor) makes run_overrides raise
    UnicodeDecodeError, which options.read_settings does not catch (only ConfigError): an INTERNALERROR at
    configure time, no --kopt-json report. Expected: ConfigError naming the base file."""
    r = Run(tmp_path)
    r.fake_profile(monkeypatch)
    _first_step(r)
    ab = r.kernel(f"ablations/{METHOD}", 9.0)
    (ab.parent / "base").write_bytes("b2\n".encode("utf-16"))
    with pytest.raises(ConfigError):
        session.run_overrides(r.run)


def test_a_champion_that_fails_correctness_when_re_judged_in_step_2_is_not_concluded_as_best(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Defect: with no ablation written, run_overrides makes the champion the second step's only kernel, so the
    session judges it again, and _ablation_step ignores the outcome: a champion whose re-run now fails
    correctness (a race that seed/launch luck hid in step 1) still becomes best_file, and the loop result says
    nothing. Expected: a strict-gate failure of the champion in this session is not ignored (the close does not
    record it as the new best, or reports it / stops), or the champion is not re-judged at all."""
    r = Run(tmp_path)
    r.fake_profile(monkeypatch)
    _first_step(r, stale=())
    over = session.run_overrides(r.run)
    b2 = r.it / "branches" / "b2" / "kernel.cu"
    assert over["baseline"] == str(b2)
    r.records = _records(b2, compile=("passed", "PASSED", None),
                         correctness=("failed", "INCORRECT_NUMERICAL", None), timing=("skipped", "SKIPPED", "correctness"))
    out = r.close()
    state = st.load_state(r.run)
    assert out["exit_code"] != 0 or state["best_file"] != str(r.it / "kernel.cu"), out["message"]


def test_a_champion_that_cannot_run_its_gpu_gates_in_step_2_is_judged_again_elsewhere(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The champion, judged again in the second step, is blocked by the hardware gate here: exit 3, the step stays
    open, and next says to run the same command on a machine with a GPU (runs_here False, requires naming it)."""
    r = Run(tmp_path)
    r.fake_profile(monkeypatch)
    _first_step(r, stale=())
    b2 = r.it / "branches" / "b2" / "kernel.cu"
    r.records = _records(b2, compile=("passed", "PASSED", None), correctness=("passed", "PASSED", None),
                         timing=("skipped", "SKIPPED", "hardware"))
    out = r.close()
    assert out["exit_code"] == 3 and st.load_state(r.run).get("ablation_step")
    assert out["next"]["action"] == "write_ablations" and out["next"]["runs_here"] is False
    assert "this one could not run champion b2's GPU gates (timing SKIPPED)" in out["next"]["requires"]


def test_iteration_bench_json_is_the_timing_that_champion_ms_came_from(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Defect (low): in the same case (no ablation written) the champion's re-timing in step 2 overwrites the
    bench.json in its branch folder (its artifact folder), and _conclude saves that as iterv1/bench.json, while
    champion_ms, best_metric_ms and the history keep step 1's median. Expected: iterv1/bench.json's median is
    the champion_ms the close decided on."""
    r = Run(tmp_path)
    r.fake_profile(monkeypatch)
    _first_step(r, stale=())
    b2 = r.kernel("branches/b2", 7.1)  # what the step-2 session's timing gate wrote over step 1's 8.0 ms
    r.judged(b2)
    out = r.close()
    assert out["champion_ms"] == 8.0
    assert json.loads((r.it / "bench.json").read_text())["median_ms"] == out["champion_ms"]


def test_the_first_steps_champion_contest_survives_the_second_steps_retiming(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Defect (low, audit): b1 (GPU-1) and b2 (GPU-0) were within 10%, so step 1 re-timed both on one GPU and
    picked b2 (decision.json: champion_contest true, retimed b1 and b2). Step 2 re-times the champion beside its
    ablation (timed on GPU-1) and writes its own decision over decision.json and into branch_results.json: the
    record of how the champion was chosen is gone. Expected: the iteration keeps step 1's champion decision (e.g.
    both decisions, or step 2's under another key)."""
    r = Run(tmp_path)
    r.fake_profile(monkeypatch)
    b1, b2 = r.kernel("branches/b1", 8.3), r.kernel("branches/b2", 8.0)
    (r.outdir(b1) / "bench.json").write_text(json.dumps({"timing_valid": True, "median_ms": 8.3, "gpu_uuid": "GPU-1"}))
    times = {"iterv1_branches_b1": 8.5, "iterv1_branches_b2": 8.1}
    monkeypatch.setattr(loop_gates, "retime_interleaved", lambda ctxs: [
        {"median_ms": times.get(c.outdir.name, 9.0), "stop_reason": "done", "gpu_uuid": "GPU-0"} for c in ctxs])
    monkeypatch.setattr(loop_gates, "ensure_built", lambda ctx: None)
    r.judged(b1, b2)
    first = r.close()
    assert first["champion"] == "b2"
    assert json.loads((r.it / "decision.json").read_text())["champion_contest"] is True
    ab = r.kernel(f"ablations/{METHOD}", 9.0, base="b2")
    (r.outdir(ab) / "bench.json").write_text(json.dumps({"timing_valid": True, "median_ms": 8.9, "gpu_uuid": "GPU-1"}))
    r.judged(ab)
    assert r.close()["exit_code"] == 0
    kept = json.dumps([json.loads((r.it / "decision.json").read_text()),
                       json.loads((r.it / "branch_results.json").read_text())])
    assert '"branches/b1": 8.5' in kept, "step 1's re-timing of b1 against b2 is no longer recorded"


def test_a_crash_between_recording_the_close_and_opening_the_next_iteration_can_be_rerun(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Defect (crash safety): _conclude writes the close into state.json (history, buckets, selected_methods,
    best) before open_iteration publishes iterv2 and moves open_iter; a crash in between (killed, disk full while
    copying the ncu report) leaves open_iter == 1 with iterv1 already in the history. Re-running the close then
    fails methods.json validation on the iteration's own claims ('already selected in an earlier iteration; give
    override_reason'), and if forced would append a second iterv1 history entry. Expected: the close is
    re-runnable after such a crash (one state write, or open_iter moved in the same write as the history)."""
    r = Run(tmp_path)
    r.fake_profile(monkeypatch)
    _first_step(r)
    r.judged(r.kernel(f"ablations/{METHOD}", 9.0, base="b2"))
    real = st.open_iteration

    def crash(*a: Any, **k: Any) -> Any:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(st, "open_iteration", crash)
    with pytest.raises(OSError):
        r.close()
    monkeypatch.setattr(st, "open_iteration", real)
    state = st.load_state(r.run)
    assert state["open_iter"] == 1
    session.run_overrides(r.run)  # raises ConfigError now: METHOD 'already selected in an earlier iteration'



def test_the_champions_sass_dumped_again_in_step_2_is_the_one_later_steps_check(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The champion, judged again in step 2 (no ablation written), passes its sass gate (a dump that may differ
    from step 1's: another nvcc) and is then blocked by the hardware gate: exit 3. The ablation then written is
    judged elsewhere, the champion not again: the step concludes on the SASS kopt dumped last (before: exit 4,
    'SASS changed', with no way to restore step 1's dump). A SASS edited by hand after that dump is refused, also
    when the champion is judged again with its sass item deselected (-k 'not sass')."""
    r = Run(tmp_path)
    r.fake_profile(monkeypatch)
    _first_step(r, stale=())
    b2 = r.it / "branches" / "b2" / "kernel.cu"
    sass = r.outdir(b2) / "sass" / "k.sass"
    sass.write_text(sass.read_text() + "        /*0030*/                   NOP ;\n")  # the step-2 session's dump
    r.records = _records(b2, compile=("passed", "PASSED", None), correctness=("passed", "PASSED", None),
                         sass=("passed", "PASSED", None), timing=("skipped", "SKIPPED", "hardware"))
    out = r.close()
    assert out["exit_code"] == 3 and out["next"]["action"] == "write_ablations"
    redumped = sass.read_text()
    forged = redumped + "        /*0040*/                   SHFL.BFLY R0, R1, 0x1, 0x1f ;\n"
    sass.write_text(forged)
    r.records = _records(b2, compile=("passed", "PASSED", None), correctness=("passed", "PASSED", None),
                         timing=("passed", "PASSED", None))  # judged again, its sass item deselected
    out = r.close()
    assert out["exit_code"] == 4 and "SASS changed between the close's steps" in out["message"], out["message"]
    sass.write_text(redumped)
    ablation = r.kernel(f"ablations/{METHOD}", 9.0, base="b2")
    r.judged(ablation)
    out = r.close()
    assert (out["exit_code"], out["champion"], out["sass"]) == (0, "b2", {METHOD: "pass"}), out["message"]
