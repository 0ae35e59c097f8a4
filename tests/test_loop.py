"""The loop's state machine and decisions (pytest_kopt.loop), on recorded artifacts and on the CPU."""

from __future__ import annotations

import json
import sys
import shutil
from pathlib import Path

import pytest

from pytest_kopt.gates.builtin import default_table
from pytest_kopt import registry
from pytest_kopt.registry import REGISTRY_DIR
from pytest_kopt.gates.sass import verify_methods
from pytest_kopt.loop import decisions
from pytest_kopt.loop import state as loop
from pytest_kopt.loop.methods import validate_methods
from pytest_kopt.loop.summary import render_summary

REDTEAM = Path(__file__).parent / "redteam"
REG = registry.load(registry.METHODS)
SIGS = registry.load(registry.SASS)
BUDGET = {"compute": 1, "memory": 1, "latency": 1}
#: a reference for runs made here (--kopt-init copies it into the run: it must exist)
REF = "def reference(x, y, **_):\n    y.copy_(x)\n"
#: approximate: these rows are about the registry rules, and admit tensor-core methods (reference mode refuses
#: tolerance-changing ones: test_loop_fields.py)
STATE = {"ineffective_methods": ["memory.coalescing"], "implementation_failed_methods": ["compute.tensor_core"],
         "numerics_mode": "approximate"}


def methods(*ids: str, **extra) -> dict:
    return {"methods": [{"id": i, **extra} for i in ids]}


@pytest.mark.parametrize(("doc", "budget", "arch", "problems"), [
    (methods("memory.shared_memory_tiling"), BUDGET, "sm_90a", []),
    (methods("memory.shared_memory_tiling", "compute.register_tiling", "latency.occupancy_tuning"), BUDGET, "sm_90a", []),
    (methods("memory.shared_memory_tiling", "memory.vectorized_access"), BUDGET, "sm_90a",
     ["axis memory: 2 method slot(s), budget 1 (cap 2)"]),
    # a same-budget pair takes one slot (upstream rejects it by mistake)
    (methods("memory.async_copy", "latency.async_pipeline"), {"compute": 0, "memory": 1, "latency": 1}, "sm_90a", []),
    (methods("compute.wgmma"), BUDGET, "sm_90", ["compute.wgmma: needs sm_90a+, target is sm_90"]),
    (methods("compute.tensor_core", "compute.wgmma"), {"compute": 2, "memory": 0, "latency": 0}, "sm_90a",
     ["compute.tensor_core: failed to implement before; set acknowledge_failure: true",
      "compute.tensor_core and compute.wgmma conflict"]),
    (methods("memory.coalescing"), BUDGET, "sm_90a",
     ["memory.coalescing: was ineffective before; give override_reason (changed bottleneck)"]),
    (methods("memory.coalescing", override_reason="DRAM % fell from 80 to 20"), BUDGET, "sm_90a", []),
    (methods("compute.magic"), BUDGET, "sm_90a", [f"compute.magic: not in {REGISTRY_DIR / 'method_registry.json'}"]),
    (methods("memory.tma", "memory.tma"), {"compute": 0, "memory": 2, "latency": 0}, "sm_90a",
     ["memory.tma: listed twice"]),
    ({"methods": []}, BUDGET, "sm_90a",
     ['methods.json lists no method; to end the run without another close, write {"finish": "<why>"} instead']),
    (methods("compute.register_tiling"), {"compute": 0, "memory": 2, "latency": 1}, "sm_90a",
     ["axis compute: 1 method slot(s), budget 0 (cap 2)"]),
])
def test_validate_methods(doc, budget, arch, problems) -> None:
    assert validate_methods(doc, REG, budget, STATE, arch) == problems


def test_methods_validation_applies_skill_md_scan_rules() -> None:
    """SKILL.md 3c's scan and numerics modes: a method tried in an earlier iteration, or one whose registry trigger
    the iteration's ncu evidence contradicts, needs override_reason; strict admits bitwise-preserving methods only
    (register_tiling reorders sums; before, it passed under strict)."""
    tried = {**STATE, "selected_methods": ["memory.shared_memory_tiling"]}
    assert validate_methods(methods("memory.shared_memory_tiling"), REG, BUDGET, tried, "sm_90a") == [
        "memory.shared_memory_tiling: already selected in an earlier iteration; give override_reason"]
    assert validate_methods(methods("memory.shared_memory_tiling", override_reason="new tile shape"), REG, BUDGET,
                            tried, "sm_90a") == []
    # occupancy_tuning triggers on achieved occupancy < 50%: at 85% it is untriggered
    assert validate_methods(methods("latency.occupancy_tuning"), REG, BUDGET, STATE, "sm_90a",
                            {"achieved_occupancy_pct": 85.0}) == [
        "latency.occupancy_tuning: its trigger achieved_occupancy_pct < 50 does not hold here "
        "(achieved_occupancy_pct = 85); give override_reason or pick a triggered method"]
    assert validate_methods(methods("latency.occupancy_tuning"), REG, BUDGET, STATE, "sm_90a",
                            {"achieved_occupancy_pct": 31.0}) == []
    strict = {**STATE, "numerics_mode": "strict"}
    assert validate_methods(methods("compute.register_tiling"), REG, BUDGET, strict, "sm_90a") == [
        "compute.register_tiling: is reordered, and numerics_mode strict admits only bitwise-preserving methods "
        "(or one marked preconditioned: true with its precondition)"]
    assert validate_methods(methods("memory.vectorized_access"), REG, BUDGET, strict, "sm_90a") == []


def test_champion_attribution_and_buckets() -> None:
    results = [{"branch": "b1", "index": 1, "median_ms": 5.0, "passed": True},
               {"branch": "b2", "index": 2, "median_ms": 4.0, "passed": False},
               {"branch": "b3", "index": 3, "median_ms": 5.0, "passed": True}]
    assert decisions.select_champion(results)["branch"] == "b1"  # tie -> lower index; failed b2 never wins
    assert decisions.select_champion([{**results[1]}]) is None
    attr = decisions.attribution(4.0, {"a": 4.2, "b": 4.05, "c": None, "d": 6.0}, 2.0, {"d": "ablation built from b2"})
    assert attr["a"]["attribution_ms"] == pytest.approx(0.2) and attr["a"]["attribution_pct"] == pytest.approx(5.0)
    assert attr["a"]["contributed"] is True
    assert attr["b"]["contributed"] is False  # 1.25% <= 2% noise
    assert attr["c"]["contributed"] is None and attr["d"]["contributed"] is None  # missing -> inconclusive
    assert decisions.classify(True, "pass") == "effective"
    assert decisions.classify(False, "pass") == "ineffective"
    assert decisions.classify(True, "fail") == "unverified"  # faster without its signature: SKILL.md's "unverified"
    assert decisions.classify(False, "fail") == "implementation_failed"
    assert decisions.classify(None, "fail") == "implementation_failed"
    assert decisions.classify(True, "inconclusive") == "unverified"
    assert decisions.classify(None, "pass") == "unverified"
    assert decisions.classify(True, "not_applicable") == "unverified"
    assert decisions.improved(9.79, 10.0, 2.0) and not decisions.improved(9.81, 10.0, 2.0) and decisions.improved(1.0, None, 2.0)


SASS = """
        Function : _Z5tiledPKfS0_Pfiii
        /*0040*/                   LDS.128 R4, [R2] ;
        /*0050*/                   STS [R3], R8 ;
        /*0060*/              @!P0 LDG.E.128 R8, desc[UR4][R6.64] ;
        /*0070*/                   FFMA R0, R4, R8, R0 ;
"""


def test_sass_verify_matches_whole_opcodes_only() -> None:
    got = verify_methods(["memory.shared_memory_tiling", "memory.vectorized_access", "memory.async_copy",
                            "compute.register_tiling"], [SASS], SIGS)
    assert got == {"memory.shared_memory_tiling": "pass", "memory.vectorized_access": "pass",
                   "memory.async_copy": "fail", "compute.register_tiling": "inconclusive"}
    # a symbol or comment naming an opcode never counts (upstream matched substrings of the whole dump)
    fake = "Function : HMMA_LDGSTS_kernel\n        /*0010*/                   FFMA R0, R1, R2, R0 ;  // HMMA\n"
    assert verify_methods(["compute.tensor_core"], [fake], SIGS) == {"compute.tensor_core": "fail"}
    assert verify_methods(["compute.tensor_core"], [""], SIGS) == {"compute.tensor_core": "tool_error"}


def test_every_registered_method_has_a_signature_or_says_why_not() -> None:
    """Each of the registry's methods has a SASS signature with opcodes, or an inconclusive entry with its reason
    (before, 5 of 13 had neither and could never become effective); sass_check's evidence names the opcodes
    looked for, found and missing."""
    from pytest_kopt.gates.sass import sass_evidence

    ids = [m["id"] for m in registry.load(registry.METHODS)["methods"]]
    sigs = registry.load(registry.SASS)
    for m in ids:
        sig = sigs["signatures"].get(m) or {}
        assert (sig.get("require_all") or sig.get("require_any")) or len(sigs["inconclusive"].get(m, "")) > 20, m
    text = ("Function : k\n        /*0010*/                   LDS R0, [R1] ;\n"
            "        /*0020*/                   FFMA R0, R1, R2, R0 ;\n")
    ev = sass_evidence(["memory.shared_memory_tiling", "compute.loop_unroll", "latency.warp_shuffle"], [text], sigs)
    assert ev["memory.shared_memory_tiling"] == {"status": "fail", "require_all": ["LDS", "STS"], "require_any": [],
                                                 "found": ["LDS"], "missing": ["STS"], "reason": None}
    assert ev["compute.loop_unroll"]["status"] == "inconclusive" and "ablation" in ev["compute.loop_unroll"]["reason"]
    assert ev["latency.warp_shuffle"]["missing"] == ["SHFL"]
    empty = {"signatures": {"x.y": {"require_all": []}}, "inconclusive": {}}
    assert sass_evidence(["x.y"], [text], empty)["x.y"]["status"] == "inconclusive"  # an empty pattern never passes
    assert sass_evidence(["x.y"], [], empty)["x.y"]["status"] == "tool_error"


def test_state_transitions_and_summary(tmp_path: Path) -> None:
    """init -> open iterv1 -> close with a champion -> open iterv2 -> stop; files and buckets as SKILL.md says."""
    base = tmp_path / "gemm.cu"
    base.write_text("// baseline\n")
    (tmp_path / "ref.py").write_text(REF)
    run = loop.new_run_dir(base)
    state = loop.init_state(run, base, tmp_path / "ref.py", {"M": 64}, iterations=2, branches=2, ncu_num=5,
                            noise_pct=2.0, numerics_mode="reference", seeds=[1, 2], env={"generation_allowed": True})
    assert state["run_status"] == "initializing" and (run / "baseline" / "gemm.cu").is_file()
    loop.save_state(run, {"baseline_ms": 10.0, "best_metric_ms": 10.0})
    roof = {"delta_compute": 0.5, "delta_memory": 0.9, "delta_latency": 0.2, "bound": "memory",
            "axis_budget": {"compute": 1, "memory": 2, "latency": 0}, "near_peak": False}
    it = loop.open_iteration(run, 1, ncu_rep=None, roofline=roof, branches=2, ncu_top={"top": {}})
    assert sorted(p.name for p in (it / "branches").iterdir()) == ["b1", "b2"]
    assert loop.load_state(run)["open_iter"] == 1
    k1, k2 = it / "branches" / "b1" / "kernel.cu", it / "branches" / "b2" / "kernel.cu"
    k1.write_text("// b1\n")
    k2.write_text("// b2\n")
    (it / "ablations" / "memory.shared_memory_tiling").mkdir()
    (it / "ablations" / "memory.shared_memory_tiling" / "kernel.cu").write_text("// ablation\n")
    branches, ablations = loop.iteration_kernels(run, 1)
    assert branches == [k1, k2] and list(ablations) == ["memory.shared_memory_tiling"]
    results = [{"branch": "b1", "index": 1, "kernel": str(k1), "median_ms": 6.0, "passed": True},
               {"branch": "b2", "index": 2, "kernel": str(k2), "median_ms": 7.0, "passed": True}]
    attr = decisions.attribution(6.0, {"memory.shared_memory_tiling": 9.0}, 2.0)
    state = loop.close_iteration(run, 1, results=results, champion=results[0],
                                 methods=["memory.shared_memory_tiling"], attr=attr,
                                 sass={"memory.shared_memory_tiling": "pass"}, champion_roofline=roof,
                                 champion_bench={"median_ms": 6.0})
    assert state["effective_methods"] == ["memory.shared_memory_tiling"]
    assert state["best_metric_ms"] == 6.0 and state["best_file"].endswith("iterv1/kernel.cu")
    assert [f["branch"] for f in state["frontier"]] == ["b2"]
    assert state["verified_iterations"] == 1 and (it / "attribution.json").is_file()
    summary = render_summary(state, run)
    assert "**1.67x** over the baseline (best kernel `iterv1/kernel.cu`)" in summary and "memory.shared_memory_tiling (effective, 50.00)" in summary
    stop = loop.stop_run(run, "all branches failed a strict gate", "branch_explore", 2)
    assert stop["exit_code"] == 2 and loop.load_state(run)["run_status"] == "stopped"
    assert "Stopped** at `branch_explore`" in (run / "summary.md").read_text()


def test_a_run_stopped_at_its_set_up_has_a_summary_of_sentences_not_empty_tables(tmp_path: Path) -> None:
    """A run that stopped before anything was profiled or closed (no GPU at --kopt-init) says so in each section,
    instead of table headers with no rows; a run with history keeps its tables."""
    state = {"run_status": "stopped", "stop_stage": "hardware", "stop_reason": "no GPU: libcuda.so.1 not found",
             "dims": {"n": 64}, "validation_seeds": [1, 2], "noise_threshold_pct": 2.0}
    text = render_summary(state, tmp_path)
    assert "**Stopped** at `hardware`: no GPU: libcuda.so.1 not found" in text
    assert "| iter |" not in text and "No iteration has closed yet." in text
    assert "No iteration has been opened" in text and "No method has been judged yet." in text
    assert "Baseline not timed" in text and "No other branch has passed yet." in text


_SASS = """\tcode for sm_90a
\t\tFunction : _Z3addPf
\t.headerflags\t@"EF_CUDA_SM90"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                      /* 0x00000a00ff017b82 */
                                                                               /* 0x000fe40000000f00 */
        /*0010*/                   FFMA R5, R2, R3, R4 ;                       /* 0x0000000302057223 */
        /*0020*/                   STG.E desc[UR4][R2.64], R5 ;                /* 0x0000000502007986 */
        /*0030*/                   EXIT ;                                      /* 0x000000000000794d */
\t\t..........
identifier = {build}/kopt_shim.cu
"""


def test_instruction_digest_sees_instructions_not_the_build_path(tmp_path: Path) -> None:
    from pytest_kopt.gates.sass import instruction_digest, parse_sass, sass_digests, save_sass

    a, b = _SASS.format(build="/cache/aaa"), _SASS.format(build="/cache/bbb")
    assert instruction_digest(a) == instruction_digest(b)  # two builds of one source
    assert instruction_digest(a) != instruction_digest(a.replace("FFMA R5, R2, R3, R4", "FFMA R5, R2, R3, R6"))
    assert instruction_digest(a) != instruction_digest(a.replace("0x0000000302057223", "0x0000000302057224"))
    folder = tmp_path / "sass"
    folder.mkdir()
    (folder / "_Z6renamedPf.sass").write_text(a)  # an earlier build's function, since renamed
    save_sass(parse_sass(b), folder)
    assert sorted(sass_digests(folder)) == ["_Z3addPf"] and sass_digests(tmp_path / "none") == {}


def test_a_champion_with_the_best_kernels_sass_leaves_its_methods_unverified(tmp_path: Path) -> None:
    """The SGEMM walkthrough's iteration 3: the agent 'added' an unroll the best already had; the champion's SASS
    equals the best's, so its ablation (+13.5%) credits nothing this iteration did."""
    from types import SimpleNamespace

    from pytest_kopt.gates.sass import sass_digests, save_sass, parse_sass
    from pytest_kopt.loop.session import branch_results
    from pytest_kopt.records import GateRecord

    base = tmp_path / "gemm.cu"
    base.write_text("// baseline\n")
    (tmp_path / "ref.py").write_text(REF)
    run = loop.new_run_dir(base)
    loop.init_state(run, base, tmp_path / "ref.py", {"M": 64}, iterations=3, branches=2, ncu_num=5, noise_pct=2.0,
                    numerics_mode="reference", seeds=[1], env={"generation_allowed": True})
    best_sass = {"_Z3addPf": "0" * 64}
    loop.save_state(run, {"baseline_ms": 10.0, "best_metric_ms": 4.0, "best_sass": best_sass})
    roof = {"delta_compute": 0.5, "delta_memory": 0.9, "delta_latency": 0.2, "bound": "memory",
            "axis_budget": {"compute": 1, "memory": 1, "latency": 0}, "near_peak": False}
    it = loop.open_iteration(run, 1, ncu_rep=None, roofline=roof, branches=2, ncu_top={"top": {}})
    kernels = []
    for b, body in (("b1", _SASS.format(build="/x")), ("b2", _SASS.replace("FFMA R5, R2, R3, R4", "FMUL R5, R2, R3"))):
        k = it / "branches" / b / "kernel.cu"
        k.write_text(f"// {b}\n")
        save_sass(parse_sass(body), k.parent / "sass")
        kernels.append(k)
    same = sass_digests(kernels[0].parent / "sass")
    loop.save_state(run, {"best_sass": same})  # b1 is the best kernel's build
    rec = lambda k, gate: GateRecord(f"{k}::{gate}", str(k.resolve()), gate, None, "passed", "PASSED")  # noqa: E731
    records = [rec(k, g) for k in kernels for g in ("compile", "sass")]
    results = branch_results(kernels, records, lambda k: SimpleNamespace(outdir=k.parent, gates=default_table()), same)
    assert [r["same_sass_as_best"] for r in results] == [True, False]
    assert results[0]["sass_digest"] == same and results[1]["sass_digest"] != same
    no_sass = branch_results(kernels, [rec(k, "compile") for k in kernels], lambda k: SimpleNamespace(outdir=k.parent, gates=default_table()),
                             same)  # the sass gate did not run this session: the folder's files are not evidence
    assert [r["same_sass_as_best"] for r in no_sass] == [None, None] and no_sass[0]["sass_digest"] == {}
    champion = {**results[0], "median_ms": 3.99, "passed": True}
    attr = decisions.attribution(3.99, {"compute.loop_unroll": 4.53}, 2.0)
    assert attr["compute.loop_unroll"]["contributed"] is True
    state = loop.close_iteration(run, 1, results=[champion], champion=champion, methods=["compute.loop_unroll"],
                                 attr=attr, sass={"compute.loop_unroll": "pass"}, champion_roofline=roof,
                                 champion_bench={"median_ms": 3.99})
    assert state["history"][-1]["verdicts"] == {"compute.loop_unroll": "unverified"}
    assert state["history"][-1]["same_sass_as_best"] is True and state["history"][-1]["improved"] is False
    assert state["best_sass"] == same and state["best_metric_ms"] == 4.0
    assert state["unverified_methods"] == ["compute.loop_unroll"] and state["effective_methods"] == []
    assert "instruction for instruction" in loop.run_view(run)["reasons"]["compute.loop_unroll"]
    assert "the champion's SASS is the best kernel's: no instruction changed" in render_summary(state, run)
    # a champion with new instructions is classified as before, and its SASS becomes the best's
    other = {**results[1], "median_ms": 3.0, "passed": True}
    state = loop.close_iteration(run, 1, results=[other], champion=other, methods=["compute.loop_unroll"],
                                 attr=decisions.attribution(3.0, {"compute.loop_unroll": 4.0}, 2.0),
                                 sass={"compute.loop_unroll": "pass"}, champion_roofline=roof,
                                 champion_bench={"median_ms": 3.0})
    assert state["history"][-1]["verdicts"] == {"compute.loop_unroll": "effective"}
    assert state["best_sass"] == results[1]["sass_digest"] and state["best_metric_ms"] == 3.0


def _cpu_run(folder: Path) -> tuple[Path, Path]:
    shutil.copy(REDTEAM / "ref_softmax.py", folder / "ref.py")
    base = folder / "k.py"
    shutil.copy(REDTEAM / "honest_python.py", base)
    run = loop.new_run_dir(base)
    loop.init_state(run, base, folder / "ref.py", {"M": 4, "N": 16}, iterations=2, branches=2, ncu_num=5,
                    noise_pct=2.0, numerics_mode="reference", seeds=[3], env={"sm_arch": "sm_90a"})
    roof = {"axis_budget": {"compute": 1, "memory": 1, "latency": 1}, "near_peak": False}
    it = loop.open_iteration(run, 1, ncu_rep=None, roofline=roof, branches=2, ncu_top={})
    shutil.copy(REDTEAM / "honest_python.py", it / "branches" / "b1" / "kernel.py")
    shutil.copy(REDTEAM / "passthrough.py", it / "branches" / "b2" / "kernel.py")
    (it / "methods.json").write_text(json.dumps(methods("latency.occupancy_tuning")))
    return run, it


def test_run_session_on_cpu_stops_the_run_for_want_of_generation_and_keeps_what_was_written(
        pytester: pytest.Pytester) -> None:
    """--kopt-run on a machine without GPU: branches are collected from the run folder and checked for
    correctness (pure-Python candidates run on the CPU); b2 is wrong, b1 cannot be timed here. The machine does not
    allow generation (env.json's generation_allowed false), so SKILL.md step 0 stops the run: exit 3 (hardware, not
    exit 2: no branch was found wanting), stop.json, and a start_over whose command seeds a new run from the best
    kernel so far, names where it can run (requires) and lists the files written into the stopped iteration
    (reuse). The JSON's loop section still lists both branches with their stage."""
    run, it = _cpu_run(pytester.path)
    result = pytester.runpytest_subprocess("--kopt-run", str(run), "-p", "no:cacheprovider", "--kopt-json", "r.json")
    doc = json.loads((pytester.path / "r.json").read_text())
    status = {i["nodeid"]: i["status"] for i in doc["items"] if i["gate"] == "correctness"}
    assert set(status.values()) == {"PASSED", "INCORRECT_NUMERICAL"}, result.stdout.str()
    assert any("b2/kernel.py" in n and s == "INCORRECT_NUMERICAL" for n, s in status.items())
    assert result.ret == 3 and doc["exit_code"] == 3 and doc["loop"]["exit_code"] == 3
    assert doc["status"] == "complete" and doc["loop"]["stage"] == "hardware"
    by = {b["branch"]: b for b in doc["loop"]["branches"]}
    assert (by["b1"]["stage"], by["b2"]["stage"], by["b2"]["status"]) == ("hardware", "correctness",
                                                                          "INCORRECT_NUMERICAL")
    nxt = doc["loop"]["next"]
    assert nxt["action"] == "start_over" and nxt["requires"].startswith("a machine with an NVIDIA GPU")
    assert nxt["runs_here"] is False
    assert nxt["command"][:4] == [sys.executable, "-m", "pytest", "--kopt-init"]
    assert nxt["seeds_from"] == str(pytester.path / "k.py")  # nothing improved on the baseline yet
    assert set(nxt["reuse"]) == {str(it / "methods.json"), str(it / "branches" / "b1" / "kernel.py"),
                                 str(it / "branches" / "b2" / "kernel.py")}
    stop = json.loads((run / "stop.json").read_text())
    assert (stop["exit_code"], stop["stop_stage"]) == (3, "hardware") and "SKILL.md step 0" in stop["stop_reason"]
    assert json.loads((run / "env.json").read_text())["generation_allowed"] is False
    assert loop.load_state(run)["run_status"] == "stopped"
    # the same command on an open run, with methods.json spoiled: the files are checked before the machine is
    (pytester.path / "again").mkdir()
    run, it = _cpu_run(pytester.path / "again")
    # a bad methods.json is a usage error naming the file and the rule
    (it / "methods.json").write_text(json.dumps(methods("memory.shared_memory_tiling", "memory.vectorized_access")))
    bad = pytester.runpytest_subprocess("--kopt-run", str(run), "-p", "no:cacheprovider", "--kopt-json", "bad.json")
    assert bad.ret == 4
    bad.stderr.fnmatch_lines(["*methods.json is not valid:*", "*axis memory: 2 method slot(s), budget 1 (cap 2)*"])
    # ... and the JSON report says it too (before, none was written): the methods stage, the rule, the file
    doc = json.loads((pytester.path / "bad.json").read_text())
    assert doc["exit_code"] == 4 and doc["items"] == []
    assert doc["error"]["gate"] == "methods" and doc["error"]["path"] == str(it / "methods.json")
    assert doc["error"]["problems"] == ["axis memory: 2 method slot(s), budget 1 (cap 2)"]
    assert doc["error"]["problem_details"] == [{"method": None, "rule": "axis_budget", "axis": "memory", "used": 2,
                                                "budget": 1, "message": doc["error"]["problems"][0]}]
    assert doc["loop"]["stage"] == "methods" and doc["loop"]["next"]["command"][3] == f"--kopt-run={run}"
    assert loop.load_state(run)["run_status"] == "iterating"  # the run stays open
    jsonschema = pytest.importorskip("jsonschema")
    schema = registry.load("report_schema.json")
    jsonschema.validate(doc, schema)  # the schema documents the error document and the loop section
    jsonschema.validate(json.loads((pytester.path / "r.json").read_text()), schema)
    # ids as plain strings (or a bare list) are what agents write: accepted, not an INTERNALERROR
    for form in ({"methods": ["latency.occupancy_tuning"]}, ["latency.occupancy_tuning"]):
        (it / "methods.json").write_text(json.dumps(form))
        ok = pytester.runpytest_subprocess("--kopt-run", str(run), "-p", "no:cacheprovider", "--co", "-q")
        assert ok.ret == 0, ok.stderr.str()[-1500:]
    (it / "methods.json").write_text(json.dumps({"methods": [7]}))
    worse = pytester.runpytest_subprocess("--kopt-run", str(run), "-p", "no:cacheprovider")
    assert worse.ret == 4
    worse.stderr.fnmatch_lines(["*methods entry 7 is neither a method id nor an object with an 'id'*"])


def cmd_opt(cmd: list[str], flag: str) -> str:
    """The value of ``flag`` in a loop command (each option written as ``--kopt-x=VALUE``)."""
    (value,) = [a.split("=", 1)[1] for a in cmd if a.startswith(flag + "=")]
    return value


def cmd_json(nxt: dict) -> str:
    return cmd_opt(nxt["command"], "--kopt-json")


def test_next_step_of_a_stopped_run_is_a_command_that_runs(tmp_path: Path) -> None:
    """A stopped run's next step starts over with everything the first --kopt-init had: the dims (as JSON),
    iterations, branches, noise and numerics mode (before: only the kernel and reference, so it failed on the
    missing dims)."""
    base = tmp_path / "k.cu"
    base.write_text("")
    (tmp_path / "ref.py").write_text(REF)
    run = loop.new_run_dir(base)
    loop.init_state(run, base, tmp_path / "ref.py", {"M": 256, "N": 256}, iterations=2, branches=3, ncu_num=5,
                    noise_pct=1.5, numerics_mode="strict", seeds=[3], env={"sm_arch": "sm_90a"})
    loop.stop_run(run, "no GPU", "hardware", 3)
    nxt = loop.next_step(run)
    assert nxt["action"] == "start_over" and str(run / "stop.json") in nxt["read"]
    # what a person reads of the stop too, and every file listed is there to read
    assert str(run / "summary.md") in nxt["read"] and all(Path(r).is_file() for r in nxt["read"])
    # a stop for want of a GPU: the same command here would stop the same way; next says where it can succeed
    assert nxt["requires"].startswith("a machine with an NVIDIA GPU")
    assert "stopped at hardware (no GPU)" in nxt["requires"]
    assert cmd_json(nxt) == str(base.parent / f"kopt-init-{run.name}.json")
    cmd = nxt["command"]
    assert cmd_opt(cmd, "--kopt-dims") == '{"M": 256, "N": 256}'
    assert [cmd_opt(cmd, o) for o in ("--kopt-iterations", "--kopt-branches", "--kopt-noise",
                                      "--kopt-numerics-mode")] == ["2", "3", "1.5", "strict"]


def test_two_stopped_runs_start_over_into_two_reports(tmp_path: Path) -> None:
    """Two stopped runs of one folder, started over at once, write two reports: each start_over command's
    --kopt-json is named after its run (before: both wrote <folder>/kopt-init.json, the second over the first)."""
    base = tmp_path / "k.cu"
    base.write_text("")
    (tmp_path / "ref.py").write_text(REF)
    runs = []
    for _ in range(2):
        run = loop.new_run_dir(base)
        loop.init_state(run, base, tmp_path / "ref.py", {"M": 256}, iterations=1, branches=1, ncu_num=5,
                        noise_pct=1.5, numerics_mode="reference", seeds=[3], env={"sm_arch": "sm_90a"})
        loop.stop_run(run, "no GPU", "hardware", 3)
        runs.append(run)
    reports = [loop.next_step(run)["report"] for run in runs]
    assert runs[0] != runs[1] and reports[0] != reports[1]
    assert [Path(r).parent for r in reports] == [tmp_path, tmp_path]
    assert [Path(r).name for r in reports] == [f"kopt-init-{run.name}.json" for run in runs]
    # a run renamed near the 255-byte limit: its report's name is cut to fit (its command would fail to write it)
    long = runs[0].rename(tmp_path / ("run_" + "x" * 246))
    name = Path(loop.next_step(long)["report"]).name
    assert name == f"kopt-init-run_{'x' * 196}.json" and len(name.encode()) <= 255


def test_a_stop_for_want_of_a_gpu_is_read_from_state_json_where_stop_json_is_gone(tmp_path: Path) -> None:
    """stop.json deleted or damaged: state.json's stop stage (hardware) still says the machine stopped the run, so
    next still says to run elsewhere (before: requires None and runs_here True), and read lists only files that
    are there."""
    base = tmp_path / "k.cu"
    base.write_text("")
    (tmp_path / "ref.py").write_text(REF)
    run = loop.new_run_dir(base)
    loop.init_state(run, base, tmp_path / "ref.py", {"M": 256}, iterations=1, branches=1, ncu_num=5,
                    noise_pct=1.5, numerics_mode="reference", seeds=[3], env={"sm_arch": "sm_90a"})
    loop.stop_run(run, "no GPU", "hardware", 3)
    (run / "stop.json").write_text('{"exit_code": "3"')
    damaged = loop.next_step(run)
    (run / "stop.json").unlink()
    gone = loop.next_step(run)
    for nxt in (damaged, gone):
        assert nxt["action"] == "start_over" and nxt["runs_here"] is False
        assert nxt["requires"].endswith("this one stopped at hardware (no GPU)")
    assert str(run / "stop.json") in damaged["read"] and str(run / "stop.json") not in gone["read"]
    assert all(Path(r).is_file() for r in gone["read"])
    # a stop at another stage may be the machine's (ncu's counters: exit 3) or the kernel's: without stop.json's
    # exit code, not known
    loop.stop_run(run, "counters unreadable", "ncu", 3)
    assert loop.next_step(run)["runs_here"] is False
    (run / "stop.json").unlink()
    unknown = loop.next_step(run)
    assert (unknown["runs_here"], unknown["requires"]) == (None, None)
