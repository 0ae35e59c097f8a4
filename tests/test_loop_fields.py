"""Every state field SKILL.md names, read where it applies: ncu_num, numerics_mode (approximate as SKILL.md defines
it), generation_allowed, env per step, the arch the methods are checked against; and SKILL.md's --compile-jobs
(a memory budget, a serial retry on OOM) and the CUTLASS headers in the build key. Plain functions over recorded
gate results, as tests/test_loop_close.py; no GPU."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_kopt import compile_jobs, registry
from pytest_kopt.errors import CompileError
from pytest_kopt.loop import session
from pytest_kopt.loop import state as st
from pytest_kopt.loop.methods import validate_methods
from pytest_kopt.settings import parse_compile_jobs

from test_loop_close import METHOD, Run

REG = registry.load(registry.METHODS)
BUDGET = {"compute": 2, "memory": 1, "latency": 1}
H200 = {"gpu": {"name": "NVIDIA H200", "uuid": "GPU-aaaa", "index": 0}, "sm_arch": "sm_90a",
        "generation_allowed": True, "hardware_attempts": [{"attempt": 1}], "can_read_counters": None}
OTHER_H200 = {**H200, "gpu": {"name": "NVIDIA H200", "uuid": "GPU-bbbb", "index": 0}}


def test_a_close_uses_the_runs_ncu_num_and_its_command_passes_it(tmp_path: Path) -> None:
    """Before, closes used the command line's --kopt-ncu-num (default 5), not state.ncu_num, and next.command did
    not pass it."""
    r = Run(tmp_path)
    r.kernel("branches/b1", 10.0)
    st.save_state(r.run, {"ncu_num": 3})
    assert session.run_overrides(r.run)["ncu_num"] == 3
    assert "--kopt-ncu-num=3" in st.next_step(r.run)["command"]
    same = session.fixed_option_problems(r.run, {"ncu_num": "3", "noise": "2", "numerics_mode": "reference"})
    assert same == []
    (problem,) = session.fixed_option_problems(r.run, {"ncu_num": "7"})
    assert problem.startswith("--kopt-ncu-num 7: this run's ncu_num is 3")
    assert len(session.fixed_option_problems(r.run, {"iterations": "9", "numerics_mode": "strict"})) == 2


@pytest.mark.parametrize(("mode", "rules"), [
    ("reference", {"compute.tensor_core": "numerics_reference", "compute.register_tiling": None,
                   "memory.vectorized_access": None}),
    ("strict", {"compute.tensor_core": "numerics_strict", "compute.register_tiling": "numerics_strict",
                "memory.vectorized_access": None}),
    ("approximate", {"compute.tensor_core": None, "compute.register_tiling": None,
                     "memory.vectorized_access": None}),
])
def test_numerics_modes_admit_what_skill_md_says(mode: str, rules: dict[str, str | None]) -> None:
    """reference keeps the reference's atol/rtol contract (tolerance-changing methods refused), strict admits
    bitwise-preserving methods only, approximate is the explicit opt-in that admits every method. Before,
    approximate behaved exactly like reference."""
    for method, rule in rules.items():
        found = validate_methods({"methods": [{"id": method}]}, REG, BUDGET, {"numerics_mode": mode}, "sm_90a")
        assert [p.detail["rule"] for p in found] == ([rule] if rule else []), (mode, method)


def test_approximate_loosens_no_correctness_check(tmp_path: Path) -> None:
    """SKILL.md: approximate "still runs all correctness checks": a close of an approximate run judges every seed
    at the reference's tolerance (its settings carry no atol/rtol of the loop's own)."""
    r = Run(tmp_path)
    r.kernel("branches/b1", 10.0)
    st.save_state(r.run, {"numerics_mode": "approximate"})
    over = session.run_overrides(r.run)
    assert "atol" not in over and "rtol" not in over and over["seeds"] == "1"


def test_a_close_on_a_machine_that_does_not_allow_generation_stops_the_run(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """SKILL.md step 0: "If generation_allowed is false, stop immediately". Before, generation_allowed was written
    and never read."""
    r = Run(tmp_path)
    r.fake_profile(monkeypatch)
    r.judged(r.kernel("branches/b1", 10.0))
    env = {**H200, "gpu": None, "generation_allowed": False, "reason": "no GPU; missing tools: ncu"}
    out = session.finish_run(r.run, r.ctx_for, r.records, False, env=env).to_json()
    assert (out["exit_code"], out["stage"]) == (3, "hardware") and "no GPU; missing tools: ncu" in out["message"]
    assert out["next"]["action"] == "start_over" and out["next"]["requires"]
    state = st.load_state(r.run)
    assert (state["run_status"], state["generation_allowed"]) == ("stopped", False)
    assert [b["branch"] for b in out["branches"]] == ["b1"]


def test_a_set_up_whose_machine_does_not_allow_generation_stops_at_step_0(tmp_path: Path) -> None:
    from test_loop_close import ROOF, _init

    run, out = _init(tmp_path, [], ROOF)
    assert out["exit_code"] == 0  # the helper's env allows generation
    (tmp_path / "no").mkdir()
    base = tmp_path / "no" / "k.cu"
    base.write_text("// baseline\n")
    (tmp_path / "no" / "ref.py").write_text("def reference(x, y, **_):\n    y.copy_(x)\n")
    run = st.new_run_dir(base)
    st.init_state(run, base, tmp_path / "no" / "ref.py", {"M": 64}, iterations=3, branches=2, ncu_num=5,
                  noise_pct=2.0, numerics_mode="reference", seeds=[1],
                  env={"generation_allowed": False, "reason": "no NVIDIA driver"})
    ctx = SimpleNamespace(outdir=tmp_path, kernel=base.resolve(), gates=None)
    res = session.finish_init(run, ctx, []).to_json()  # type: ignore[arg-type]
    assert (res["exit_code"], res["stage"]) == (3, "hardware") and "SKILL.md step 0" in res["message"]
    assert json.loads((run / "stop.json").read_text())["exit_code"] == 3


def test_env_is_the_latest_steps_machine_and_each_close_keeps_its_own(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The set-up ran on one H200, the close's branch step on another: env.json and state.env are the close's,
    iterv1/env.json and the history keep which machine each step ran on, and can_read_counters is not carried
    from one GPU to another (the close's own profile sets it)."""
    r = Run(tmp_path)
    r.fake_profile(monkeypatch)
    st.save_state(r.run, {"env": {**H200, "can_read_counters": True}})
    r.judged(r.kernel("branches/b1", 10.0), r.kernel(f"ablations/{METHOD}", 12.0, base="b1"))
    refreshed: list[Any] = []
    from pytest_kopt.loop import envs

    real = envs.refresh
    monkeypatch.setattr(envs, "refresh", lambda *a, **k: refreshed.append(real(*a, **k)) or refreshed[-1])
    out = session.finish_run(r.run, r.ctx_for, r.records, False, env=OTHER_H200).to_json()
    assert out["exit_code"] == 0
    assert refreshed[0].env["can_read_counters"] is None  # another GPU: not known until its profile
    state = st.load_state(r.run)
    assert state["env"]["gpu"]["uuid"] == "GPU-bbbb" and state["env"]["can_read_counters"] is True  # profiled
    assert json.loads((r.run / "env.json").read_text())["gpu"]["uuid"] == "GPU-bbbb"
    assert json.loads((r.it / "env.json").read_text())["gpu"]["uuid"] == "GPU-bbbb"
    (step,) = state["history"][0]["steps"]
    assert (step["step"], step["gpu_uuid"], step["sm_arch"]) == ("branch_explore", "GPU-bbbb", "sm_90a")
    assert st.run_view(r.run)["machine"]["gpu_uuid"] == "GPU-bbbb"
    # on the same GPU a known can_read_counters is kept
    st.save_state(r.run, {"env": {**OTHER_H200, "can_read_counters": False}})
    assert envs.refresh(r.run, OTHER_H200).env["can_read_counters"] is False


def test_methods_are_checked_against_the_arch_of_the_machine_that_ran_the_close(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The run was seeded on an sm_80 machine; its close runs on an H200 (sm_90a): wgmma is allowed there. Before,
    methods were checked against the set-up machine's arch (state.env), at configure. The same claim on an sm_80
    step is refused at the step's end (exit 4, the run left open)."""
    r = Run(tmp_path)
    r.fake_profile(monkeypatch)
    st.save_state(r.run, {"env": {"sm_arch": "sm_80"}, "numerics_mode": "approximate"})
    (r.it / "methods.json").write_text(json.dumps({"methods": [{"id": "compute.wgmma"}]}))
    r.judged(r.kernel("branches/b1", 10.0), r.kernel("ablations/compute.wgmma", 12.0, base="b1"))
    session.run_overrides(r.run)  # configure: the step's machine is not probed yet, no arch rule
    a100 = {**H200, "sm_arch": "sm_80", "gpu": {"name": "A100", "uuid": "GPU-a100"}}
    bad = session.finish_run(r.run, r.ctx_for, r.records, False, env=a100).to_json()
    assert bad["exit_code"] == 4 and bad["error"]["problems"] == ["compute.wgmma: needs sm_90a+, target is sm_80"]
    assert st.load_state(r.run)["open_iter"] == 1
    ok = session.finish_run(r.run, r.ctx_for, r.records, False, env=H200).to_json()
    assert ok["exit_code"] == 0 and ok["verdicts"] == {"compute.wgmma": "unverified"}


def test_compile_jobs_auto_follows_skill_md_and_n_is_n() -> None:
    gib = compile_jobs.GIB
    assert parse_compile_jobs(None) == "auto" and parse_compile_jobs("8") == 8
    with pytest.raises(Exception, match="neither auto nor a positive integer"):
        parse_compile_jobs("0")
    assert compile_jobs.plan_jobs("auto", cpus=16, available=64 * gib).jobs == 4  # capped at four
    assert compile_jobs.plan_jobs("auto", cpus=2, available=64 * gib).jobs == 1  # half the CPUs
    plan = compile_jobs.plan_jobs("auto", cpus=16, available=10 * gib)
    assert plan.memory_bytes == 8 * gib and "memory budget 8.0 GiB" in plan.why  # 2 GiB kept free
    plan = compile_jobs.plan_jobs(6, cpus=2, available=2 * gib)
    assert (plan.jobs, plan.memory_bytes) == (6, 0)  # N is N; the budget still holds them to one at a time
    assert compile_jobs.build_gib(True) == 4.0 and compile_jobs.build_gib(False) == 2.0


def _race(slots: compile_jobs.BuildSlots, gibs: list[float]) -> int:
    """Run one short 'build' per estimate at once; returns the most that ran together."""
    def one(g: float) -> None:
        with slots.take(g):
            time.sleep(0.05)

    threads = [threading.Thread(target=one, args=(g,)) for g in gibs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return slots.peak


def test_build_slots_hold_to_the_jobs_and_the_memory_budget() -> None:
    gib = compile_jobs.GIB
    assert _race(compile_jobs.BuildSlots(compile_jobs.JobPlan(2, None, "")), [2.0] * 6) == 2
    # 8 GiB of budget: two CUTLASS builds (4 GiB each) at once, though four jobs are allowed
    assert _race(compile_jobs.BuildSlots(compile_jobs.JobPlan(4, 8 * gib, "")), [4.0] * 5) == 2
    # one build always runs, however large its estimate against the budget
    assert _race(compile_jobs.BuildSlots(compile_jobs.JobPlan(4, 1 * gib, "")), [4.0, 4.0]) == 1


def test_a_build_killed_for_memory_is_retried_once_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_kopt import scheduler as sched
    from pytest_kopt.proc.pool import HarnessPool

    calls: list[str] = []

    def build(ctx: Any) -> Any:
        calls.append("build")
        if len(calls) == 1:
            raise CompileError("nvcc was interrupted (exit -9)", gate="compile",
                               details="nvcc error   : 'cicc' died due to signal 9 (Kill signal)")
        return SimpleNamespace(cache_hit=False, artifact="lib.so", seconds=1.0)

    monkeypatch.setattr(sched, "ensure_built", build)
    s = sched.Scheduler(HarnessPool())
    (tmp_path / "compile_error.json").write_text("{}")
    ctx = SimpleNamespace(settings=SimpleNamespace(compile_jobs=2), kind=SimpleNamespace(cutlass=False),
                          outdir=tmp_path)
    assert s.build_within_budget(ctx).artifact == "lib.so" and calls == ["build", "build"]  # type: ignore[arg-type]
    assert not (tmp_path / "compile_error.json").exists()
    calls.clear()

    def broken(ctx: Any) -> Any:
        calls.append("build")
        raise CompileError("nvcc failed (exit 2)", gate="compile", details="k.cu:3: error: expected ';'")

    monkeypatch.setattr(sched, "ensure_built", broken)
    with pytest.raises(CompileError):
        s.build_within_budget(ctx)  # type: ignore[arg-type]
    assert calls == ["build"]  # a compile error of the sources is not retried
    assert compile_jobs.out_of_memory("nvcc failed", "virtual memory exhausted: Cannot allocate memory")
    assert not compile_jobs.out_of_memory("nvcc was interrupted (exit -2)", "died due to signal 2")


def test_the_cutlass_headers_are_in_the_build_key(tmp_path: Path) -> None:
    """Before, a CUTLASS build's key covered the include folders' paths only: a checkout moved to another release
    at the same path reused the old builds."""
    from pytest_kopt.kinds import nvcc

    inc = tmp_path / "cutlass" / "include"
    (inc / "cutlass").mkdir(parents=True)
    (inc / "cutlass" / "version.h").write_text("#define CUTLASS_MAJOR 3\n#define CUTLASS_MINOR 5\n")
    before = nvcc.build_parts("13.0", "sm_90a", True, (inc,))
    (inc / "cutlass" / "version.h").write_text("#define CUTLASS_MAJOR 4\n#define CUTLASS_MINOR 2\n")
    after = nvcc.build_parts("13.0", "sm_90a", True, (inc,))
    assert before["include_dirs"] == after["include_dirs"]
    assert before["cutlass_headers"]["header"] != after["cutlass_headers"]["header"]
    assert "cutlass_headers" not in nvcc.build_parts("13.0", "sm_90a", False, ())  # plain CUDA keys unchanged


def test_a_close_given_another_ncu_num_is_refused_with_the_report_written(pytester: pytest.Pytester) -> None:
    """Before, --kopt-ncu-num on a close silently replaced the run's; now the close uses the state's, and a
    different value is a usage error (exit 4) whose report names the run's value; the same value is accepted."""
    from test_loop_files import cpu_run

    run, _ = cpu_run(pytester.path)
    bad = pytester.runpytest_subprocess("--kopt-run", str(run), "--kopt-ncu-num", "7", "-p", "no:cacheprovider",
                                        "--kopt-json", "r.json", "--co")
    doc = json.loads((pytester.path / "r.json").read_text())
    assert bad.ret == 4 and doc["exit_code"] == 4
    assert doc["error"]["problems"] == ["--kopt-ncu-num 7: this run's ncu_num is 5 (state.json, fixed by "
                                        "--kopt-init); leave the option out, or start a new run with --kopt-init"]
    ok = pytester.runpytest_subprocess("--kopt-run", str(run), "--kopt-ncu-num=5", "-p", "no:cacheprovider", "--co")
    assert ok.ret == 0, ok.stderr.str()[-1500:]
