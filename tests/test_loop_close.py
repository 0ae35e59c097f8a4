"""The loop's close and set-up as plain functions over recorded artifacts (pytest_kopt.loop.session): the two-step
close that makes attribution conclusive for whichever branch wins, the next iteration's evidence being the current
best's, the run's ncu bundle, the baseline's near_peak stop, can_read_counters and the hardware probe's attempts.

The GPU gates' outputs here (bench.json medians, ncu_top.json, roofline.json, SASS text) are written by the test
as inputs to the decisions; they are not measurements. The loop on a real H200 is docs/loop-walkthrough.md."""

from __future__ import annotations

import dataclasses
import hashlib

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_kopt.gates.builtin import builtin_gates, default_table
from pytest_kopt.gates.table import GateTable
from pytest_kopt.gates import hardware
from pytest_kopt.loop import session, summary
from pytest_kopt.loop import state as st
from pytest_kopt.records import GateRecord

METHOD = "memory.shared_memory_tiling"
LDS = "Function : k\n        /*0010*/                   LDS R0, [R1] ;\n        /*0020*/                   STS [R1], R0 ;\n"
#: the run's reference (--kopt-init copies it into the run, so it must exist)
REF = "def reference(x, y, **_):\n    y.copy_(x)\n"
ROOF = {"delta_compute": 0.5, "delta_memory": 0.9, "delta_latency": 0.2, "bound": "memory", "near_peak": False,
        "axis_budget": {"compute": 1, "memory": 1, "latency": 1}}


class Run:
    """A run folder with iteration 1 open and kernels whose gate results the test sets."""

    def __init__(self, tmp: Path, branches: int = 2, best_ms: float = 20.0, ncu_set: str = "light") -> None:
        self.tmp = tmp
        base = tmp / "k.cu"
        base.write_text("// baseline\n")
        (tmp / "ref.py").write_text(REF)
        self.run = st.new_run_dir(base)
        st.init_state(self.run, base, tmp / "ref.py", {"M": 64}, iterations=3, branches=branches, ncu_num=5,
                      noise_pct=2.0, numerics_mode="reference", seeds=[1], env={"sm_arch": "sm_90a"})
        st.save_state(self.run, {"baseline_ms": best_ms, "best_metric_ms": best_ms, "ncu_set": ncu_set})
        self.it = st.open_iteration(self.run, 1, ncu_rep=None, roofline={**ROOF, "tag": "baseline"}, branches=branches,
                                    ncu_top={"set": ncu_set, "tag": "baseline", "top": {}})
        (self.it / "methods.json").write_text(json.dumps({"methods": [{"id": METHOD, "rationale": "test"}]}))
        self.ms: dict[Path, float] = {}
        self.records: list[GateRecord] = []
        self.profiled: list[Path] = []
        self.set_seen = ncu_set

    def kernel(self, rel: str, ms: float | None, base: str | None = None) -> Path:
        k = self.it / rel / "kernel.cu"
        k.parent.mkdir(parents=True, exist_ok=True)
        k.write_text(f"// {rel}\n")
        if base is not None:
            (k.parent / "base").write_text(base + "\n")
        out = self.outdir(k)
        out.mkdir(parents=True, exist_ok=True)
        if ms is not None:
            (out / "bench.json").write_text(json.dumps({"timing_valid": True, "median_ms": ms, "gpu_uuid": "GPU-0",
                                                        "distribution": {"ci95_low_ms": ms * 0.99,
                                                                         "ci95_high_ms": ms * 1.01}}))
        (out / "sass").mkdir(exist_ok=True)
        (out / "sass" / "k.sass").write_text(LDS)
        return k

    def outdir(self, k: Path) -> Path:
        return self.tmp / "out" / k.parent.relative_to(self.run).as_posix().replace("/", "_")

    def judged(self, *kernels: Path) -> list[GateRecord]:
        """This session's records: every kernel passed compile, correctness, timing and sass."""
        self.records = [GateRecord(nodeid=f"{k}::{g}", kernel=str(k.resolve()), gate=g, case=None, outcome="passed",
                                   status="PASSED") for k in kernels
                        for g in ("compile", "correctness", "timing", "sass")]
        return self.records

    def ctx_for(self, k: Path) -> Any:
        return SimpleNamespace(outdir=self.outdir(k), env={"gpu": {"uuid": "GPU-0", "index": 0}},
                               gates=getattr(self, "table", None) or default_table())

    def fake_profile(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """The champion's ncu and roofline gates write what a profile would (tagged with the kernel's folder)."""

        def ncu(ctx: Any) -> None:
            self.profiled.append(ctx.outdir)
            (ctx.outdir / "kernel.ncu-rep").write_bytes(b"rep")
            (ctx.outdir / "ncu_top.json").write_text(json.dumps({"set": self.set_seen, "tag": ctx.outdir.name,
                                                                 "top": {}}))

        def roof(ctx: Any) -> None:
            (ctx.outdir / "roofline.json").write_text(json.dumps({**ROOF, "tag": ctx.outdir.name}))

        # the session's table with the champion's gates standing in for ncu and the roofline
        fakes = {"ncu": lambda ctx, case: ncu(ctx), "roofline": lambda ctx, case: roof(ctx)}
        self.table = GateTable.build([dataclasses.replace(g, run=fakes.get(g.name, g.run)) for g in builtin_gates()])
        monkeypatch.setattr(summary, "plot_history", lambda state, run_dir: [])

    def close(self) -> dict[str, Any]:
        return session.finish_run(self.run, self.ctx_for, self.records, False).to_json()


def test_a_close_asks_for_the_champions_ablations_and_concludes_on_them(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent ablated b1, but b2 wins: the first step names b2 champion, profiles it and asks for its ablation
    at a named path (before: attribution inconclusive, 'ablation built from b1'). The second step judges only that
    ablation and attributes against b2: 9.0 ms without the method vs 8.0 ms with it is 12.5% > 2% noise, SASS has
    LDS/STS, so the method is effective."""
    r = Run(tmp_path)
    r.fake_profile(monkeypatch)
    b1, b2 = r.kernel("branches/b1", 10.0), r.kernel("branches/b2", 8.0)
    stale = r.kernel(f"ablations/{METHOD}", 12.0, base="b1")
    r.judged(b1, b2, stale)
    first = r.close()
    assert (first["exit_code"], first["champion"], first["ablations_needed"]) == (0, "b2", [METHOD])
    assert first["stale_ablations"] == {METHOD: "b1"} and "base b2" in first["message"]
    nxt = first["next"]
    assert nxt["action"] == "write_ablations" and nxt["champion"] == "b2"
    assert nxt["ablations"] == [{"method": METHOD, "kernel": str(r.it / "ablations" / METHOD / "kernel.cu"),
                                 "base": str(r.it / "ablations" / METHOD / "base")}]
    assert nxt["command"][3] == f"--kopt-run={r.run}"
    assert nxt["command"][-1] == f"--kopt-json={r.it / 'report_ablations.json'}"  # not over the first report
    assert st.run_view(r.run)["phase"] == "ablations" and st.load_state(r.run)["open_iter"] == 1
    assert r.profiled == [r.outdir(b2)] and (r.it / "kernel.ncu-rep").is_file()
    assert json.loads((r.it / "branch_results.json").read_text())["awaiting_ablations"] == [METHOD]
    # the stale ablation is not what the second step judges: with none of b2 written, the champion is the kernel
    assert session.run_overrides(r.run)["baseline"] == str(b2)
    # the agent writes the ablation of b2 where it was told to; the second step judges only it
    ablation = r.kernel(f"ablations/{METHOD}", 9.0, base="b2")
    over = session.run_overrides(r.run)
    assert (over["baseline"], over["candidate"], over["ncu_set"]) == (str(ablation), [], "light")
    r.judged(ablation)
    second = r.close()
    assert second["exit_code"] == 0 and second["champion"] == "b2" and second["improved"] is True
    a = second["attribution"][METHOD]
    assert a["ms_without"] == 9.0 and a["attribution_pct"] == pytest.approx(12.5) and a["contributed"] is True
    assert second["verdicts"] == {METHOD: "effective"} and second["sass"] == {METHOD: "pass"}
    state = st.load_state(r.run)
    assert state["effective_methods"] == [METHOD] and state["open_iter"] == 2 and not state.get("ablation_step")
    assert state["best_metric_ms"] == 8.0 and state["best_file"] == str(r.it / "kernel.cu")
    assert r.profiled == [r.outdir(b2)]  # profiled once, in the first step
    view = st.run_view(r.run)
    assert view["phase"] == "iterating" and view["buckets"]["effective"] == [METHOD]
    assert view["selected_methods"] == [METHOD]
    assert "attribution 12.5%" in view["reasons"][METHOD]


def test_an_ablation_of_the_champion_written_before_the_close_takes_one_step(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    r = Run(tmp_path)
    r.fake_profile(monkeypatch)
    b1, b2 = r.kernel("branches/b1", 10.0), r.kernel("branches/b2", 12.0)
    r.judged(b1, b2, r.kernel(f"ablations/{METHOD}", 10.1, base="b1"))
    out = r.close()
    assert out["exit_code"] == 0 and out["next"]["action"] == "write_and_close" and out["next"]["iteration"] == 2
    # 10.1 vs 10.0 ms is 1% <= 2% noise, SASS verified: ineffective (the speed-up came from elsewhere)
    assert out["attribution"][METHOD]["contributed"] is False and out["verdicts"] == {METHOD: "ineffective"}


def test_a_second_step_without_the_ablation_concludes_inconclusive(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent chose not to ablate: running the command again concludes, attribution inconclusive with the
    reason, the method unverified (never effective on no evidence)."""
    r = Run(tmp_path)
    r.fake_profile(monkeypatch)
    b1, b2 = r.kernel("branches/b1", 10.0), r.kernel("branches/b2", 8.0)
    r.judged(b1, b2)
    assert r.close()["next"]["action"] == "write_ablations"
    r.judged(b2)  # the session re-judged the champion (no ablation was written)
    out = r.close()
    assert out["exit_code"] == 0 and out["attribution"][METHOD]["contributed"] is None
    assert out["attribution"][METHOD]["reason"] == "no ablation of b2 written"
    assert out["verdicts"] == {METHOD: "unverified"}


def test_the_next_iteration_profiles_the_best_when_the_champion_did_not_improve(tmp_path: Path,
                                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The best so far is 10.0 ms; iterv1's champion (10.1 ms) is no improvement, so iterv2's ncu_top.json,
    roofline.json and budget are the best's (iterv1's best-input evidence), not the champion's (before: the
    champion's). An improving champion's evidence moves on."""
    r = Run(tmp_path, best_ms=10.0)
    r.fake_profile(monkeypatch)
    b1 = r.kernel("branches/b1", 10.1)
    r.judged(b1, r.kernel(f"ablations/{METHOD}", 12.0, base="b1"))
    out = r.close()
    assert out["improved"] is False and "the best stays" in out["message"]
    it2 = r.run / "iterv2"
    assert json.loads((it2 / "ncu_top.json").read_text())["tag"] == "baseline"
    assert json.loads((it2 / "roofline.json").read_text())["tag"] == "baseline"
    assert json.loads((it2 / "ncu_top.json").read_text())["evidence_of"] == st.load_state(r.run)["best_file"]
    assert out["next"]["evidence_of"].endswith("baseline/k.cu")
    # iterv2's champion improves: iterv3's evidence is that champion's profile
    (it2 / "methods.json").write_text(json.dumps({"methods": [METHOD]}))
    r.it = it2
    b1 = r.kernel("branches/b1", 5.0)
    r.judged(b1, r.kernel(f"ablations/{METHOD}", 6.0, base="b1"))
    out = r.close()
    assert out["improved"] is True
    assert json.loads((r.run / "iterv3" / "ncu_top.json").read_text())["tag"] == r.outdir(b1).name
    assert json.loads((r.run / "iterv3" / "ncu_top.json").read_text())["evidence_of"] == str(it2 / "kernel.cu")


def test_a_champion_profiled_with_another_ncu_bundle_stops_the_run(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """SKILL.md 3g: the bundle is kept identical across the run (state.json ncu_set, read by --kopt-run and handed
    to the ncu gate); a profile with another set cannot be compared and stops the run (exit 3)."""
    r = Run(tmp_path, ncu_set="light")
    r.fake_profile(monkeypatch)
    r.set_seen = "full"
    r.judged(r.kernel("branches/b1", 10.0))
    out = r.close()
    assert out["exit_code"] == 3 and "full ncu set, the run with light" in out["message"]
    assert st.load_state(r.run)["run_status"] == "stopped"


def _init(tmp_path: Path, records: list[GateRecord], roof: dict[str, Any]) -> tuple[Path, dict[str, Any]]:
    base = tmp_path / "k.cu"
    base.write_text("// baseline\n")
    (tmp_path / "ref.py").write_text(REF)
    run = st.new_run_dir(base)
    st.init_state(run, base, tmp_path / "ref.py", {"M": 64}, iterations=3, branches=4, ncu_num=5, noise_pct=2.0,
                  numerics_mode="reference", seeds=[1], env={"sm_arch": "sm_90a", "can_read_counters": None,
                                                             "generation_allowed": True})
    out = tmp_path / "out"
    out.mkdir()
    (out / "bench.json").write_text(json.dumps({"timing_valid": True, "median_ms": 3.0}))
    (out / "roofline.json").write_text(json.dumps(roof))
    (out / "ncu_top.json").write_text(json.dumps({"set": "full", "duration_ms": 3.0, "metrics": {}, "top": {}}))
    ctx = SimpleNamespace(outdir=out, kernel=base.resolve(), gates=default_table())
    return run, session.finish_init(run, ctx, records).to_json()  # type: ignore[arg-type]


def test_a_baseline_near_the_roofline_completes_the_run_at_set_up(tmp_path: Path) -> None:
    """SKILL.md 3b: near_peak (every gap known and under 0.15, with a workload model) stops early; checked on the
    baseline too (before: only after a close). The baseline's profile read counters: can_read_counters true."""
    near = {**ROOF, "delta_compute": 0.05, "delta_memory": 0.1, "delta_latency": 0.02, "near_peak": True}
    run, out = _init(tmp_path, [], near)
    assert out["exit_code"] == 0 and "near the roofline" in out["message"] and out["next"]["action"] == "done"
    state = st.load_state(run)
    assert (state["run_status"], state["completion"], state["open_iter"]) == ("completed", "near_peak", None)
    assert json.loads((run / "env.json").read_text())["can_read_counters"] is True
    (tmp_path / "other").mkdir()
    run2, out2 = _init(tmp_path / "other", [], ROOF)
    assert out2["next"]["action"] == "write_and_close" and st.load_state(run2)["env"]["can_read_counters"] is True


def test_counters_that_cannot_be_read_stop_the_set_up_with_can_read_counters_false(tmp_path: Path) -> None:
    kernel = (tmp_path / "k.cu").resolve()
    msg = ("ncu cannot read GPU performance counters (ERR_NVGPUCTRPERM): run as root or set the driver option "
           "NVreg_RestrictProfilingToAdminUsers=0")
    rec = GateRecord(nodeid="k.cu::ncu", kernel=str(kernel), gate="ncu", case=None, outcome="skipped",
                     status="SKIPPED", blocked_by="ncu", message=msg)
    run, out = _init(tmp_path, [rec], ROOF)
    assert out["exit_code"] == 3 and out["next"]["action"] == "start_over"
    assert json.loads((run / "env.json").read_text())["can_read_counters"] is False
    assert st.load_state(run)["env"]["can_read_counters"] is False


def test_the_gpu_probe_is_retried_up_to_three_times_unless_there_is_no_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    """SKILL.md step 0: discovery at most three attempts, each recorded in env.json's hardware_attempts; a missing
    driver library is final at once."""
    answers = [{"gpus": [], "driver_version": None, "error": "cuInit failed: CUDA_ERROR_UNKNOWN"},
               {"gpus": [], "driver_version": None, "error": "cuInit failed: CUDA_ERROR_UNKNOWN"},
               {"gpus": [{"name": "NVIDIA H200", "cc": "9.0", "uuid": "GPU-0", "index": 0}],
                "driver_version": "580", "error": None}]
    monkeypatch.setattr(hardware, "probe_gpus", lambda: answers.pop(0))
    monkeypatch.setattr(hardware, "RETRY_PAUSE_S", 0.0)
    env = hardware.detect(3)
    assert [a["attempt"] for a in env["hardware_attempts"]] == [1, 2, 3] and env["gpu"]["name"] == "NVIDIA H200"
    monkeypatch.setattr(hardware, "probe_gpus", lambda: {"gpus": [], "driver_version": None,
                                                         "error": "no NVIDIA driver (libcuda.so.1 not found)"})
    env = hardware.detect(3)
    assert len(env["hardware_attempts"]) == 1 and not env["gpu_available"]


def test_the_champion_between_the_steps_is_the_one_the_branch_step_judged(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Between a close's two steps the champion's folder and state.json are the agent's to write. SASS edited to
    show the claimed method's instructions (before: the method read 'effective', SASS the branch step never
    dumped) stops the second step with exit 4 naming the file; a state.json whose ablation_step names another
    branch champion than its own branch results (before: the close concluded on the slower b1) is refused at
    configure; restored, the step concludes on b2 as judged."""
    from pytest_kopt.errors import ConfigError

    r = Run(tmp_path)
    r.fake_profile(monkeypatch)
    b1, b2 = r.kernel("branches/b1", 10.0), r.kernel("branches/b2", 8.0)
    (r.outdir(b2) / "sass" / "k.sass").write_text("Function : k\n        /*0010*/    FFMA R0, R1, R2, R3 ;\n")
    r.judged(b1, b2)
    assert r.close()["ablations_needed"] == [METHOD]
    ablation = r.kernel(f"ablations/{METHOD}", 9.0, base="b2")
    sass = r.outdir(b2) / "sass" / "k.sass"
    judged_sass = sass.read_text()
    sass.write_text(LDS)  # the claimed method's instructions, forged
    r.judged(ablation)
    refused = r.close()
    assert refused["exit_code"] == 4 and "SASS changed between the close's steps" in refused["message"], refused
    assert refused["next"]["action"] == "fix_and_rerun" and st.load_state(r.run)["ablation_step"]
    assert f"{sass.parent}: k.sass changed" in json.dumps(refused)
    sass.write_text(judged_sass)
    state = json.loads((r.run / "state.json").read_text())
    judged_state = json.dumps(state)
    step = state["ablation_step"]
    step.update(champion="b1", champion_kernel=str(b1), champion_ms=10.0)
    step["champion_sha256"] = hashlib.sha256(b1.read_bytes()).hexdigest()
    (r.run / "state.json").write_text(json.dumps(state))
    (r.it / "ablations" / METHOD / "base").write_text("b1\n")
    with pytest.raises(ConfigError) as exc:
        session.run_overrides(r.run)
    assert "ablation_step names b1 (10.0 ms) the champion, but its branch results make b2 (8.0 ms)" in str(exc.value)
    (r.run / "state.json").write_text(judged_state)
    (r.it / "ablations" / METHOD / "base").write_text("b2\n")
    second = r.close()
    assert (second["exit_code"], second["champion"], second["sass"]) == (0, "b2", {METHOD: "fail"})


def test_the_champion_not_judged_in_the_ablation_step_keeps_its_artifact_folder(tmp_path: Path) -> None:
    """In a close's second step only the ablations are the session's kernels; the champion's SASS, bench.json and
    profile are still read from its branch folder (before: from the default .kopt folder, where there is nothing,
    so every method's SASS check read 'no SASS' on the H200 and bench.json of the iteration was empty)."""
    from pytest_kopt.plugin.stash import with_run_kernel
    from pytest_kopt.settings import Settings

    r = Run(tmp_path)
    champion = r.it / "branches" / "b2" / "kernel.cu"
    ablation = r.it / "ablations" / METHOD / "kernel.cu"
    s = Settings(loop_mode="run", run_dir=r.run, artifact_dirs={str(ablation): str(ablation.parent)},
                 outdir=tmp_path / ".kopt", invocation_dir=tmp_path)
    assert with_run_kernel(s, champion).artifact_dir(champion) == champion.parent
    assert s.artifact_dir(champion) == tmp_path / ".kopt" / champion.relative_to(tmp_path)  # s itself is unchanged
    assert with_run_kernel(s, ablation) is s and s.artifact_dir(ablation) == ablation.parent
    other = tmp_path / "other.cu"
    assert with_run_kernel(s, other) is s and s.artifact_dir(other) == tmp_path / ".kopt" / "other.cu"
    init = Settings(loop_mode="init", run_dir=r.run, outdir=tmp_path / ".kopt", invocation_dir=tmp_path)
    assert with_run_kernel(init, champion) is init
    # the session's contexts and its artifact_dir apply it (the gates and the loop read records through those)
    from types import SimpleNamespace

    from pytest_kopt.plugin.stash import SessionState

    ref = tmp_path / "ref.py"
    ref.write_text("def reference(**kw):\n    pass\n")
    state = SessionState(settings=dataclasses.replace(s, ref=ref))
    config = SimpleNamespace(cache=None, rootpath=tmp_path)
    assert state.context(config, champion, "champion").outdir == champion.parent
    assert state.artifact_dir(champion) == champion.parent
    assert state.context(config, tmp_path / "other.cu", "other").outdir == tmp_path / ".kopt" / "other.cu"


def test_a_trigger_problem_carries_its_metric_and_value() -> None:
    """An agent overriding (or dropping) a method whose trigger does not hold needs the metric, threshold and
    measured value as fields (before: only the sentence, which the walkthrough's agent took apart with a regex)."""
    from pytest_kopt import registry
    from pytest_kopt.loop.methods import validate_methods

    doc = {"methods": [{"id": METHOD, "rationale": "r"}]}
    (p,) = validate_methods(doc, registry.load(registry.METHODS), {"compute": 1, "memory": 1, "latency": 1}, {},
                            "sm_90a", {"l1_hit_rate_pct": 89.1319})
    assert p.startswith(f"{METHOD}: its trigger l1_hit_rate_pct < 80 does not hold")
    assert p.detail == {"method": METHOD, "rule": "trigger", "message": str(p), "metric": "l1_hit_rate_pct",
                        "op": "<", "threshold": 80, "value": 89.1319}
