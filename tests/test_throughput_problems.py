"""benchmarks/throughput.py's problems: the variants it writes as a close's branches are distinct and, for the
Triton softmax, correct at a shape that leaves a partial tile of rows (Triton's interpreter, on the CPU)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import throughput  # noqa: E402


def test_each_problem_gives_32_distinct_branches_with_the_examples_own_shape_not_among_the_softmax_first_three():
    for name, (example, baseline, ref, kernel_name, dims, make) in throughput.PROBLEMS.items():
        got = make(32)
        assert len(got) == 32 and len({label for label, _ in got}) == 32 and len({src for _, src in got}) == 32, name
        assert (ROOT / "examples" / example / baseline).is_file() and (ROOT / "examples" / example / ref).is_file()
        assert kernel_name.endswith(Path(baseline).suffix)
    soft = throughput.softmax_variants(3)
    assert [label for label, _ in soft] == ["rows2_w4", "rows2_w8", "rows2_w2"]
    consts = dict(re.findall(r"^(ROWS|WARPS|EXP2) = (\S+)$", soft[1][1], re.M))
    assert consts == {"ROWS": "2", "WARPS": "8", "EXP2": "False"}


def test_softmax_variants_match_torch_softmax_in_tritons_interpreter_with_a_partial_tile_of_rows():
    # 37 rows leave a partial last program at ROWS 2, 4, 8 and 16; N=100 a partial BLOCK of 128
    code = """
import sys, types, torch
sys.path.insert(0, sys.argv[1])
import throughput
for label, src in throughput.softmax_variants(42):
    m = types.ModuleType(label)
    exec(compile(src, label, "exec"), m.__dict__)
    b = m.setup(37, 100, 0, device="cpu")
    x, y = b["inputs"]["x"], b["inputs"]["y"]
    x.copy_(torch.randn(37, 100, generator=torch.Generator().manual_seed(1)) * 4)
    y.fill_(float("nan"))
    m.run_kernel(x, y)
    print(label, float((y.double() - torch.softmax(x.double(), -1)).abs().max()))
"""
    out = subprocess.run([sys.executable, "-c", code, str(ROOT / "benchmarks")], capture_output=True, text=True,
                         env={**os.environ, "TRITON_INTERPRET": "1"}, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    errors = dict(line.split() for line in out.stdout.splitlines())
    assert len(errors) == 42 and {"rows16_w8", "rows1_w4", "rows1_w1_exp2"} <= errors.keys()
    assert all(float(e) < 1e-6 for e in errors.values()), errors


def test_the_benchmarks_name_their_host_by_cpu_model_cpus_and_load():
    import cpu_sampler

    line = cpu_sampler.host_line()
    models = [ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
              if ln.startswith("model name")] if Path("/proc/cpuinfo").is_file() else []
    assert line.startswith(f"host: {models[0] if models else 'unknown CPU'}, {len(os.sched_getaffinity(0))} CPUs, ")
    assert re.search(r"load average \d+\.\d/\d+\.\d/\d+\.\d$", line), line


def test_a_hold_with_no_request_is_named_by_the_function_that_took_it(tmp_path, monkeypatch):
    """The timeline plugin records who took each hold of the GPU lock; throughput.py sums the empty holds per
    caller, so an ncu profile's hold and the peaks' are told apart."""
    import timeline_plugin
    from pytest_kopt.proc.gpulock import GpuLock

    path = tmp_path / "timeline.jsonl"
    monkeypatch.setattr(GpuLock, "__enter__", GpuLock.__enter__)
    monkeypatch.setattr(GpuLock, "__exit__", GpuLock.__exit__)
    monkeypatch.delattr(GpuLock, "_timeline", raising=False)
    timeline_plugin._wrap_gpu_lock(str(path))

    def profile_the_champion():
        with GpuLock(str(tmp_path / "gpu.lock")):
            pass

    profile_the_champion()
    row = [__import__("json").loads(ln) for ln in path.read_text().splitlines()][-1]
    assert row["lock"] == "exclusive"
    assert row["caller"] == "test_throughput_problems.profile_the_champion"
    holds = [{"pid": 1, "held": 0.0, "released": 9.5, "caller": "ncu.gate_ncu"},
             {"pid": 1, "held": 10.0, "released": 11.0, "caller": "measure.device_peaks"},
             {"pid": 1, "held": 12.0, "released": 13.0, "caller": "measure.device_peaks"},
             {"pid": 1, "held": 20.0, "released": 20.5}]
    requests = [{"pid": 1, "sent": 20.1, "returned": 20.4, "request": "time", "round": None}]
    lines = throughput.hold_contents(holds, requests)
    assert any(ln.split()[:5] == ["(holds", "with", "no", "request)", "3"] and ln.split()[5] == "11.50"
               for ln in lines), lines
    named = {ln.split()[0]: ln.split()[1:4] for ln in lines if ln.endswith("(most)")}
    assert named == {"ncu.gate_ncu": ["1", "9.50", "9.500"], "measure.device_peaks": ["2", "2.00", "1.000"]}


def test_each_ncu_profile_of_the_run_prints_its_phases(tmp_path):
    import json

    top = tmp_path / "iterv1" / "branches" / "b2" / "kernel_ncu_top.json"
    top.parent.mkdir(parents=True)
    top.write_text(json.dumps({"attempts": [{"set": "full", "ok": True, "started_ahead_s": 12.25, "ahead": "taken",
                                             "phase_s": {"lock": 0.01, "start": 2.4, "range": 3.5, "read": 0.3}}]}))
    (tmp_path / "baseline").mkdir()
    (tmp_path / "baseline" / "ncu_top.json").write_text(json.dumps({"attempts": [
        {"set": "full", "ok": False, "started_ahead_s": None, "ahead": "none started"}, "not an attempt"]}))
    (tmp_path / "iterv1" / "kernel_ncu_top.json").write_text(top.read_text())  # the champion's, copied
    for empty in ("iterv1/branches/b3/ncu_top.json", "iterv1/branches/b4/ncu_top.json"):  # no attempt: no line
        (tmp_path / empty).parent.mkdir(parents=True)
        (tmp_path / empty).write_text(json.dumps({"attempts": []}))
    lines = throughput.ncu_phases(tmp_path)
    assert len(lines) == 2
    assert "baseline/ncu_top.json" in lines[0] and "failed; started ahead no (none started)" in lines[0]
    assert lines[1].endswith("set full ok; started ahead 12.2 s before its go (taken); "
                             "lock 0.01 start 2.40 range 3.50 read 0.30 (also iterv1/kernel_ncu_top.json)")
