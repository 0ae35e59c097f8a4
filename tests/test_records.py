"""The typed records of :mod:`pytest_kopt.artifacts`: each writes what it loads back (same fields), loads a missing or
corrupt file as None, and builds exactly the documents the gates wrote before the records owned them. The field
lists below were read from the documents the timing, ncu, roofline, hardware and correctness gates wrote through
their inline dicts (2026-12-04), on fakes of their harness results; the timing gate's own path is run here on the
same kind of fakes (no GPU needed)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_kopt import stats
from pytest_kopt.artifacts import (BENCH, ENV, NCU_TOP, ROOFLINE, Achieved, Basis, Bench, CorrectnessRecord, Env,
                                   FirstAttempt, Floor, Head, NcuTop, Roofline, TimedRun, Timing)

HEAD_FIELDS = ["kernel", "dims", "requested_dims", "realized_dims", "arch", "gpu", "gpu_uuid", "gpu_index",
               "compile_pass", "contract_pass", "correctness_pass", "autotune"]
MEASURED_FIELDS = HEAD_FIELDS + [
    "race_safe", "timing_valid", "average_ms", "median_ms", "timing_basis", "timing_basis_note", "robust_cv",
    "stability", "stability_basis", "distribution", "samples_ms", "event_samples_ms", "events", "host_ms",
    "host_probes_ms", "throttled", "nvml", "warmup", "stop_reason", "reference", "speedup_vs_ref", "speedup_ci95", "workload", "gflops",
    "gbytes_per_s", "roofline_floor_ms", "peaks", "suspect", "timed_output_check", "timing_method", "seeds",
    "timing_seed", "kernel_time", "phase_s"]
INVALID_FIELDS = HEAD_FIELDS + ["timing_valid", "median_ms", "samples_ms", "event_samples_ms", "timing_basis",
                                "timed_output_check", "kernel_time", "timing_method"]
SHAPES_FIELDS = ["kernel", "dims", "arch", "shapes", "geomean_over", "timing_valid", "samples_ms", "median_ms",
                 "speedup_vs_ref", "speedup_ci95", "gpu", "gpu_uuid", "gpu_index", "compile_pass", "contract_pass",
                 "correctness_pass", "autotune", "race_safe", "seeds"]
DISTRIBUTION_FIELDS = ["n", "median_ms", "mean_ms", "min_ms", "max_ms", "p10_ms", "p90_ms", "iqr_ms", "robust_cv",
                       "stability", "median_rse", "ci95_low_ms", "ci95_high_ms"]
POLICY = {"warmup_ms": 100.0, "min_samples": 10, "min_time_s": 0.2, "budget_s": 2.0, "max_samples": 2000,
          "target_rse": 0.005, "max_sets": 8, "mem_fraction": 0.25, "method": "cupti", "graph_calls": 20,
          "capture": False}
TIMING_METHOD_FIELDS = list(POLICY) + ["clock", "l2_flush_bytes", "rotating_sets", "fresh_values_every_call",
                                       "graph_method", "graph_note", "graph_hold", "interleaved_with_reference"]
FIGURES = ["median_ms", "mean_ms", "min_ms", "p10_ms", "p90_ms", "ci95_low_ms", "ci95_high_ms", "robust_cv",
           "median_rse", "stability", "stability_basis", "samples", "timing_basis", "events_median_ms", "stop_reason",
           "rotating_sets", "timing_method", "host_gap_ms", "ref_median_ms", "speedup_vs_ref", "speedup_ci95_low",
           "speedup_ci95_high", "gpu_uuid", "throttled_samples", "cupti_median_ms", "gflops", "gbytes_per_s",
           "roofline_floor_ms", "memory_check"]
PEAKS = {"dram_bytes_per_s": 4.0e12, "bf16_flops": 7.0e14, "fp32_flops": 5.0e13, "gpu": "H200", "method": "torch"}


def samples(median: float, n: int = 40, spread: float = 0.01) -> list[float]:
    """Deterministic samples (ms) around ``median``, each within ``spread`` of it."""
    return [median * (1 + spread * ((7 * i) % 11 - 5) / 5) for i in range(n)]


def harness_result(median_ms: float, **extra: Any) -> dict[str, Any]:
    """A timing request's result as the harness returns it (``pytest_kopt.child.timing``), kernel-only spans in µs."""
    ev = samples(median_ms * 1.05 + 0.002)
    out = {"event_ms": ev, "host_ms": [x + 0.01 for x in ev], "host_launch_ms": 0.004, "host_overhead_ms": 0.003,
           "stop_reason": "converged", "rotating_sets": 4, "method": "events", "flush_bytes": 1 << 26,
           "nvml": {"sm_clock_mhz": [1980]}, "throttled": [False] * 38 + [True, True], "gpu": "NVIDIA H200",
           "gpu_uuid": "GPU-aaa", "workload": {"flops": 2e9, "bytes_min": 8e6},
           "phase_s": {"inputs": 0.12345, "samples": 0.5}, "gate_phase_s": {"measure": 1.234, "output_check": 0.1},
           "hold_us": 50.0, "launch_host_us": [10.0] * 40, "gpu_processes": [], "spec": [], "scalars": {},
           "cupti": {"spans_us": [x * 1e3 for x in samples(median_ms)], "median_us": median_ms * 1e3, "calls": 40,
                     "empty_calls": 0, "launch_sets": [{"kernels": ["k"], "calls": 40}]}}
    out.update(extra)
    return out


HEAD = Head(kernel="/k/kern.py", dims={"M": 64}, arch="sm_90a", gpu="NVIDIA H200", gpu_uuid="GPU-aaa", gpu_index=1,
            autotune={"kern": {"BLOCK": 128}})


def measured(first_attempt: FirstAttempt | None = None, baseline: bool = False) -> Bench:
    run, ref = TimedRun.of(harness_result(0.05)), TimedRun.of(harness_result(0.08))
    base = TimedRun.of(harness_result(0.06)) if baseline else None
    basis = Basis(name="cupti", kernel=samples(0.05), reference=samples(0.08),
                  baseline=samples(0.06) if baseline else None, note=None)
    k = stats.describe(basis.kernel)
    timing = Timing(basis=basis, kernel=k, reference=stats.describe(basis.reference),
                    events=stats.describe(run.event_ms), speedup=(1.6, 1.59, 1.61), stability=k.stability,
                    stability_basis="robust_cv")
    return Bench.measured(HEAD, timing, run, ref, valid=True, race_safe=None, policy=POLICY, interleaved=True,
                          seeds=[7, 19], floor_ms=0.002, peaks=PEAKS, gflops=40.0, gbytes_per_s=0.16, suspects=[],
                          timed_output_check="PASSED", peaks_s=0.01234, first_attempt=first_attempt,
                          baseline=base, baseline_kernel="/k/base.py" if baseline else None)


# -- bench.json ---------------------------------------------------------------------------------------------------

def test_a_measured_bench_has_todays_fields() -> None:
    doc = measured().doc
    assert list(doc) == MEASURED_FIELDS
    assert list(doc["distribution"]) == DISTRIBUTION_FIELDS and list(doc["events"]) == DISTRIBUTION_FIELDS
    assert list(doc["reference"]) == DISTRIBUTION_FIELDS + ["samples_ms", "event_samples_ms"]
    assert list(doc["timing_method"]) == TIMING_METHOD_FIELDS
    assert doc["timing_method"]["clock"] == "cupti_kernel_span" and doc["timing_method"]["rotating_sets"] == 4
    assert list(doc["phase_s"]) == ["peaks", "measure", "output_check", "candidate", "reference"]
    assert doc["phase_s"]["peaks"] == 0.012 and doc["phase_s"]["candidate"] == {"inputs": 0.123, "samples": 0.5}
    # the kernel-only records without their spans (they are samples_ms already)
    assert list(doc["kernel_time"]) == ["method", "median_us", "calls", "empty_calls", "launch_sets"]
    assert doc["seeds"] == [7, 19] and doc["timing_seed"] == 7 and doc["speedup_ci95"] == [1.59, 1.61]
    assert doc["requested_dims"] == doc["realized_dims"] == doc["dims"] == {"M": 64}


def test_a_measured_bench_adds_a_first_attempt_and_a_pr_baseline() -> None:
    fa = FirstAttempt(robust_cv=0.3, median_ms=0.05, samples=40, causes=["busy"], remeasured="after 2 s",
                      basis="cupti")
    doc = measured(fa, baseline=True).doc
    assert list(doc) == MEASURED_FIELDS + ["first_attempt", "pr_baseline"]
    assert doc["first_attempt"] == {"robust_cv": 0.3, "median_ms": 0.05, "samples": 40, "causes": ["busy"],
                                    "remeasured": "after 2 s", "basis": "cupti"}
    assert list(doc["pr_baseline"]) == ["kernel", "samples_ms", "event_samples_ms", "timing_basis", "stop_reason"]
    assert doc["pr_baseline"]["kernel"] == "/k/base.py" and doc["pr_baseline"]["samples_ms"] == samples(0.06)


def test_an_invalid_bench_is_exactly_todays_document() -> None:
    result = harness_result(0.05, cupti={"spans_us": [], "empty_calls": 40, "calls": 0})
    bench = Bench.invalid(HEAD, TimedRun.of(result), Basis(name="cupti", kernel=[], reference=[0.08], baseline=None,
                                                           note="the profiled calls launched no GPU work"),
                          policy=POLICY, timed_output_check="PASSED")
    assert list(bench.doc) == INVALID_FIELDS
    assert bench.doc == {**dict(zip(HEAD_FIELDS, ["/k/kern.py", {"M": 64}, {"M": 64}, {"M": 64}, "sm_90a",
                                                  "NVIDIA H200", "GPU-aaa", 1, True, True, True,
                                                  {"kern": {"BLOCK": 128}}])),
                         "timing_valid": False, "median_ms": None, "samples_ms": [],
                         "event_samples_ms": result["event_ms"], "timing_basis": "cupti",
                         "timed_output_check": "PASSED",
                         "kernel_time": {"method": "cupti", "spans_us": [], "empty_calls": 40, "calls": 0},
                         "timing_method": {**POLICY, "method": "events"}}
    assert not bench.timing_valid and bench.median_ms is None and bench.valid_samples is None


def test_a_bench_round_trips(tmp_path: Path) -> None:
    built = measured(baseline=True)
    path = built.write(tmp_path)
    assert path == tmp_path / BENCH
    loaded = Bench.load(tmp_path)
    assert loaded is not None and loaded.doc == json.loads(json.dumps(built.doc))
    assert (loaded.timing_valid, loaded.median_ms, loaded.samples_ms, loaded.gpu_uuid, loaded.workload,
            loaded.pr_baseline) == (built.timing_valid, built.median_ms, built.samples_ms, built.gpu_uuid,
                                    built.workload, built.pr_baseline)
    assert loaded.valid_samples == samples(0.05)


def write_shape(folder: Path, median: float | None, valid: bool) -> None:
    folder.mkdir(parents=True)
    (folder / BENCH).write_text(json.dumps({
        "gpu": "H200", "gpu_uuid": "GPU-aaa", "gpu_index": 1, "compile_pass": True, "contract_pass": True,
        "correctness_pass": True, "autotune": {}, "race_safe": None, "seeds": [7], "timing_valid": valid,
        "median_ms": median, "samples_ms": samples(median or 1.0), "speedup_vs_ref": 1.5,
        "reference": {"samples_ms": samples(1.5 * (median or 1.0))}}))


def test_the_summary_over_shapes(tmp_path: Path) -> None:
    """Every shape valid: the geometric mean of the medians and of the speedups (with a bootstrap CI); one shape not
    valid: no median or speedup; a shape not timed yet: the same, and the first shape's fields still copied."""
    a, b = tmp_path / "shapes" / "M=1", tmp_path / "shapes" / "M=2"
    write_shape(a, 0.04, True)
    write_shape(b, 0.09, True)
    shapes = [({"M": 1}, "M=1", a), ({"M": 2}, "M=2", b)]
    doc = Bench.over_shapes("/k/kern.py", {"M": 1}, "sm_90a", shapes).doc
    assert list(doc) == SHAPES_FIELDS
    assert list(doc["shapes"][0]) == ["dims", "label", "path", "timing_valid", "median_ms", "speedup_vs_ref",
                                      "stop_reason"]
    assert doc["shapes"][1]["path"] == str(b / BENCH) and doc["timing_valid"] and doc["geomean_over"] == 2
    assert doc["median_ms"] == pytest.approx(0.06) and doc["speedup_vs_ref"] == pytest.approx(1.5)
    assert doc["samples_ms"] == [] and doc["seeds"] == [7]
    (b / BENCH).unlink()
    doc = Bench.over_shapes("/k/kern.py", {"M": 1}, "sm_90a", shapes).doc
    assert list(doc) == SHAPES_FIELDS and doc["timing_valid"] is False
    assert doc["median_ms"] is None and doc["speedup_vs_ref"] is None and doc["speedup_ci95"] is None
    summary = Bench.from_doc(doc)
    assert [r["label"] for r in summary.shapes] == ["M=1", "M=2"]
    assert summary.shape_benches()["M=2"] is None and summary.shape_benches()["M=1"] is not None


# -- the timing gate writes bench.json through the builders ------------------------------------------------------

class FakeContext:
    """What ``gates.timing._time_shape`` reads of a Context."""

    def __init__(self, outdir: Path, pr: bool) -> None:
        self.outdir = outdir
        self.settings = SimpleNamespace(timing_method="cupti", rotating_memory=0.25, seeds=(7, 19),
                                        fresh_process=False, loop_mode=None, pr_gate=pr,
                                        baseline=Path("/k/base.py") if pr else None, sanitizer=(), dims={"M": 64},
                                        gate_timeout_s=60.0)
        self.kind = SimpleNamespace(graph_capture=False)
        self.env = {"gpu": {"uuid": "GPU-aaa", "index": 1}, "pinned": True}
        self.kernel, self.arch, self.display = Path("/k/kern.py"), "sm_90a", "kern.py"
        #: the warm processes the gate ended
        self.ended: list[tuple[str | None, dict]] = []
        self.pool = SimpleNamespace(end=lambda identity, env: self.ended.append((identity, env)))

    def server(self, role: str) -> str:
        return f"{role}:{self.kernel}"


def run_gate(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, parties: tuple, pr: bool = False,
             ctx: FakeContext | None = None) -> Any:
    from pytest_kopt.gates import measure, timing

    monkeypatch.setattr(measure, "measure", lambda ctx, req: parties)
    monkeypatch.setattr(timing, "device_peaks", lambda ctx: dict(PEAKS))
    monkeypatch.setattr(timing, "harness_request", lambda ctx, mode, device, seed, res, **kw: {"mode": mode, **kw})
    monkeypatch.setattr(timing, "built", lambda ctx: SimpleNamespace(autotune={"kern": {"config": {"BLOCK": 128}}}))
    return timing._time_shape(ctx or FakeContext(tmp_path, pr), None, "cuda")


def passed() -> Any:
    return SimpleNamespace(ok=True, status="PASSED", message="", details=())


def test_the_timing_gate_writes_todays_bench(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    outcome = run_gate(monkeypatch, tmp_path, (harness_result(0.05), harness_result(0.08), harness_result(0.06),
                                               passed()), pr=True)
    doc = json.loads((tmp_path / BENCH).read_text())
    assert list(doc) == MEASURED_FIELDS + ["memory", "pr_baseline"] and doc["timing_valid"] is True
    assert doc["memory"]["check"] == "not_read" and doc["memory"]["leak"] is None
    assert doc["timing_basis"] == "cupti" and doc["samples_ms"] == pytest.approx(samples(0.05))
    assert doc["timing_method"] == {**POLICY, "clock": "cupti_kernel_span", "l2_flush_bytes": 1 << 26,
                                    "rotating_sets": 4, "fresh_values_every_call": True, "graph_method": None,
                                    "graph_note": None, "graph_hold": None, "interleaved_with_reference": True}
    assert doc["autotune"] == {"kern": {"BLOCK": 128}} and doc["peaks"] == PEAKS and doc["suspect"] == []
    assert list(outcome.figures) == FIGURES and outcome.artifacts == (str(tmp_path / BENCH),)
    assert outcome.summary.startswith("median 50.") and "kernel-only (CUPTI)" in outcome.summary
    assert outcome.figures["gflops"] == pytest.approx(doc["gflops"]) and doc["pr_baseline"]["kernel"] == "/k/base.py"


def test_a_leak_fails_the_timing_item_with_an_invalid_bench(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The pytest process's NVML readings of the candidate grow 2 MiB per sample (one call per sample): the timing
    item fails LEAK with the rate, its bench.json says so and is not valid timing, and the candidate's warm
    process, which holds the memory, is ended."""
    from pytest_kopt.errors import LeakError

    held = 1409 * 2**20
    outside = {"readings": [{"samples": s, "parties_min": s, "bytes": held + 2 * 2**20 * s}
                            for s in (3, 60, 120, 180, 240)], "note": None}
    inside = {"readings": [{"samples": s, "calls": 500 + s, "nvml_bytes": None, "device_used_bytes": None,
                            "torch_allocated_bytes": 2**20} for s in (3, 60, 120, 180, 240)],
              "peak_call": {"torch_bytes": 0, "device_held_bytes": 2 * 2**20, "bytes": 2 * 2**20}, "nvml_note": None}
    ctx = FakeContext(tmp_path, False)
    with pytest.raises(LeakError, match=r"2\.000 MiB \(2097152 bytes\) per call over 4 readings") as caught:
        run_gate(monkeypatch, tmp_path, (harness_result(0.05, memory=inside, memory_outside=outside),
                                         harness_result(0.08), None, passed()), ctx=ctx)
    assert caught.value.status == "LEAK" and caught.value.figures["leak_bytes_per_call"] == 2 * 2**20
    doc = json.loads((tmp_path / BENCH).read_text())
    assert doc["timing_valid"] is False and doc["memory"]["leak"] is True
    assert doc["memory"]["basis"] == "nvml_outside" and doc["memory"]["peak_call_bytes"] == 2 * 2**20
    assert ctx.ended == [("candidate:/k/kern.py", {})]


def test_a_wrong_timed_output_leaves_an_invalid_bench(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from pytest_kopt.errors import IncorrectError

    wrong = SimpleNamespace(ok=False, status="INCORRECT_NUMERICAL", message="max abs err 3", details=("a",))
    with pytest.raises(IncorrectError, match="a timed call's output is wrong: max abs err 3"):
        run_gate(monkeypatch, tmp_path, (harness_result(0.05), harness_result(0.08), None, wrong))
    doc = json.loads((tmp_path / BENCH).read_text())
    assert list(doc) == INVALID_FIELDS and doc["timed_output_check"] == "INCORRECT_NUMERICAL"


# -- ncu_top.json, roofline.json, env.json, correctness/<case>.json ------------------------------------------------

def ncu_top(tmp_path: Path) -> NcuTop:
    rows = [{"id": 0, "kernel": "prep", "grid": [1, 1, 1], "block": [32, 1, 1], "metrics": {"duration_ns": 2000.0}},
            {"id": 1, "kernel": "main", "grid": [8, 1, 1], "block": [256, 1, 1], "metrics": {"duration_ns": 8000.0}}]
    return NcuTop.build(rows, metric_names={"duration_ns": "gpu__time_duration.sum"}, nvtx_range="kopt_target",
                        report=str(tmp_path / "kernel.ncu-rep"), set="full", set_reason="under 10 ms",
                        attempts=[{"set": "full", "ok": True}], ncu_num=5, top={"memory": []},
                        metrics={"dram_throughput_pct": 40.0}, kernel="main")


def test_ncu_top_has_todays_fields_and_round_trips(tmp_path: Path) -> None:
    top = ncu_top(tmp_path)
    assert list(top.doc) == ["metric_set", "clock_control", "nvtx_range", "launches", "target_kernel", "duration_ms",
                             "metric_names", "report", "set", "set_reason", "attempts", "ncu_num", "top", "metrics",
                             "kernel"]
    assert top.doc["target_kernel"] == "main" and top.duration_ms == pytest.approx(0.01)
    assert top.write(tmp_path) == tmp_path / NCU_TOP
    loaded = NcuTop.load(tmp_path)
    assert loaded == top and loaded.doc == top.doc and NcuTop.load(tmp_path / NCU_TOP) == top
    top.write(tmp_path / "iterv1", evidence_of="/run/baseline/k.cu")
    copy = NcuTop.load(tmp_path / "iterv1")
    assert copy is not None and copy.doc == {**top.doc, "evidence_of": "/run/baseline/k.cu"}
    assert NcuTop.load(top.write(tmp_path, name="kernel_ncu_top.json")) == top  # the loop's champion copy
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / NCU_TOP).write_text(json.dumps({"set": "full"}))  # written without registry metrics
    assert NcuTop.load(tmp_path / "old") is None


def test_roofline_has_todays_fields_and_round_trips(tmp_path: Path) -> None:
    base = ["delta_compute", "delta_memory", "delta_latency", "bound", "near_peak", "axis_budget", "method",
            "stall_shares_pct", "duration_ms"]
    achieved = Achieved(flops_per_s=1e12, bytes_per_s=1e11, arithmetic_intensity=10.0)
    floor = Floor(peaks=PEAKS, floor_ms_fp32=0.1, floor_ms_best=0.05, sol_pct_fp32=50.0, sol_pct_best=25.0,
                  roofline_bound="memory")
    common = dict(delta={"compute": 0.5, "memory": 0.2, "latency": None}, bound="compute", near_peak=False,
                  axis_budget={"compute": 2, "memory": 1, "latency": 0}, method="roofline",
                  stall_shares_pct={"wait": 100.0}, duration_ms=0.2)
    assert list(Roofline.analysis(**common)) == base
    assert list(Roofline.analysis(**common, achieved=achieved)) == base + ["achieved_flops", "achieved_bytes_per_s",
                                                                           "arithmetic_intensity"]
    full = Roofline.build(Roofline.analysis(**common, achieved=achieved, floor=floor), kernel="main", dims={"M": 64})
    assert list(full.doc) == base + ["achieved_flops", "achieved_bytes_per_s", "arithmetic_intensity", "peaks",
                                     "floor_ms_fp32", "floor_ms_best", "sol_pct_fp32", "sol_pct_best",
                                     "roofline_bound", "kernel", "dims"]
    assert full.write(tmp_path) == tmp_path / ROOFLINE
    loaded = Roofline.load(tmp_path)
    assert loaded == full and loaded.doc == full.doc and loaded.axis_budget == {"compute": 2, "memory": 1, "latency": 0}
    assert Roofline.load(full.write(tmp_path, name="kernel_roofline.json")) == full  # the loop's champion copy
    with pytest.raises(ValueError):
        Roofline.build({"delta_compute": None}, kernel=None, dims={})


def test_the_roofline_gates_analysis_is_the_records(tmp_path: Path) -> None:
    """``gates.roofline.roofline`` returns :meth:`Roofline.analysis` of what it computed."""
    from pytest_kopt import registry
    from pytest_kopt.gates import roofline

    metrics = registry.load(registry.METRICS)
    table = {name: None for name in metrics["metrics"]} | {"dram_throughput_pct": 80.0, "sm_throughput_pct": 30.0}
    doc = roofline.roofline(table, metrics, 0.5, {"flops": 1e9, "bytes_min": 1e8}, PEAKS)
    assert doc["delta_memory"] == pytest.approx(0.2) and doc["delta_compute"] == pytest.approx(0.7)
    assert doc["achieved_bytes_per_s"] == pytest.approx(2e11) and doc["roofline_bound"] == "memory"
    assert doc["floor_ms_fp32"] == pytest.approx(1e8 / 4e12 * 1e3)


def test_env_has_todays_fields_and_round_trips(tmp_path: Path) -> None:
    tools = {"nvcc": {"path": "/usr/bin/nvcc", "version": "12.6"}, "ncu": {"path": None, "version": None}}
    gpu = {"name": "H200", "cc": "9.0", "uuid": "GPU-a", "index": 0, "sm_count": 132}
    doc = Env.document(gpus=[gpu], sm_arch="sm_90a", driver_version="560", gpu_error=None, tools=tools,
                       hardware_attempts=[{"ok": True}], python="3.11.7", packages={"torch": "2.5"},
                       cuda_visible_devices=None)
    assert list(doc) == ["schema_version", "backend", "gpu_available", "gpu", "gpus", "sm_arch", "driver_version",
                         "gpu_error", "tools", "can_read_counters", "generation_allowed", "reason",
                         "hardware_attempts", "python", "packages", "cuda_visible_devices"]
    assert doc["gpu"] == gpu and doc["generation_allowed"] is False and doc["reason"] == "missing tools: ncu"
    assert Env.write(tmp_path, doc) == tmp_path / ENV
    env = Env.load(tmp_path)
    assert env is not None and env.doc == doc and env.schema_version == 1 and env.gpu == gpu
    assert (env.gpu_available, env.sm_arch, env.can_read_counters, env.reason) == (True, "sm_90a", None,
                                                                                  "missing tools: ncu")
    none = Env.document(gpus=[], sm_arch=None, driver_version=None, gpu_error="no NVIDIA driver", tools=tools,
                        hardware_attempts=[], python="3.11.7", packages={}, cuda_visible_devices="0")
    assert none["gpu"] is None and none["reason"] == "no NVIDIA driver; missing tools: ncu"


def test_a_correctness_record_round_trips_with_its_mac(tmp_path: Path) -> None:
    doc = CorrectnessRecord.start({"index": 0, "seed": 7, "dims": None}, "cuda", "fp-7")
    doc.update(plan={"regime": "normal"}, call_ms=0.25, status="PASSED", passed=True)
    path = CorrectnessRecord.write(tmp_path, "seed=7", doc, mac="m4c")
    assert path == CorrectnessRecord.path(tmp_path, "seed=7") == tmp_path / "correctness" / "seed=7.json"
    on_disk = json.loads(path.read_text())
    assert list(on_disk) == ["case", "device", "fingerprint", "passed", "plan", "call_ms", "status", "mac"]
    rec = CorrectnessRecord.load(path)
    assert rec is not None and rec.doc == on_disk
    assert (rec.fingerprint, rec.passed, rec.mac, rec.status, rec.message, rec.call_ms) == ("fp-7", True, "m4c",
                                                                                           "PASSED", None, 0.25)


# -- tolerant loading -------------------------------------------------------------------------------------------------

LOADERS = [(Bench.load, lambda d: d, BENCH), (NcuTop.load, lambda d: d, NCU_TOP),
           (Roofline.load, lambda d: d, ROOFLINE), (Env.load, lambda d: d, ENV),
           (CorrectnessRecord.load, lambda d: CorrectnessRecord.path(d, "seed=7"), "correctness/seed=7.json")]


@pytest.mark.parametrize("load,where,name", LOADERS, ids=["bench", "ncu_top", "roofline", "env", "correctness"])
@pytest.mark.parametrize("content", [None, "", "{\"truncated\": ", "[1, 2]", "\x00\xff"],
                         ids=["missing", "empty", "truncated", "not-an-object", "binary"])
def test_a_missing_or_corrupt_record_loads_as_none(tmp_path: Path, load: Any, where: Any, name: str,
                                                    content: str | None) -> None:
    if content is not None:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode("latin-1"))
    assert load(where(tmp_path)) is None


def test_a_file_whose_name_is_near_the_limit_is_written_atomically(tmp_path: Path) -> None:
    """A name near the file system's 255-byte limit (a run folder renamed long, its start_over report named after
    it) is still written: the temporary file beside it is named after a cut of it (before: "File name too long",
    and no file), and none is left behind."""
    from pytest_kopt.artifacts import read_dict, write_json, write_text

    long_json, long_md = tmp_path / ("r" * 245 + ".json"), tmp_path / ("\U0001f600" * 61 + ".md")  # 250, 247 bytes
    write_json(long_json, {"exit_code": 3})
    write_text(long_md, "summary\n")
    assert read_dict(long_json) == {"exit_code": 3} and long_md.read_text() == "summary\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([long_json.name, long_md.name])
    # a name whose bytes are no UTF-8 (Python holds them as surrogates) is written as it is
    odd = tmp_path / os.fsdecode(b"r\xe9port.json")
    write_json(odd, {"exit_code": 0})
    assert read_dict(odd) == {"exit_code": 0} and os.fsencode(odd.name) == b"r\xe9port.json"


def test_a_label_is_one_file_name_in_its_folder() -> None:
    """A case or shape label as a file name: separators, % and control characters escaped, a dots-only name
    escaped, a long one cut with its hash so that two never meet; an ordinary label as it is."""
    from pytest_kopt.artifacts.io import NAME_LIMIT, file_name

    assert file_name("M=64,N=8,seed=7") == "M=64,N=8,seed=7"
    assert file_name("tag=q/../x\\y") == "tag=q%2F..%2Fx%5Cy"
    assert file_name("a%2Fb") == "a%252Fb"  # an escape in the label is not read as one
    assert (file_name(".."), file_name("."), file_name("x\x00\n")) == ("%2E.", "%2E", "x%00%0A")
    long_a, long_b = file_name("é" * 300 + "a"), file_name("é" * 300 + "b")
    assert long_a != long_b and max(len(long_a.encode()), len(long_b.encode())) <= NAME_LIMIT
    assert long_a.startswith("é" * 50) and "~" in long_a
    assert (file_name(""), file_name("t=\ud800")) == ("%", "t=%D800")
    base = Path("/run/b1")
    for label in ("tag=q/../../x", "..", "é" * 300, ""):
        assert (base / file_name(label)).parent == base


def test_a_benchmark_shapes_folder_stays_in_the_kernels_folder(tmp_path: Path) -> None:
    """Where timing and ncu write a benchmark shape's bench.json and profile: a string dim with separators and
    dots is one folder below shapes/, never a path out of it."""
    from pytest_kopt.gates.context import Context
    from pytest_kopt.settings import Settings

    kernel = tmp_path / "k.cu"
    ctx = Context(settings=Settings(dims={"M": 4, "tag": "a"}, outdir=tmp_path / ".kopt", invocation_dir=tmp_path),
                  env={}, kernel=kernel, ref=tmp_path / "ref.py", display="k.cu", cache_dir=tmp_path, pool=None,
                  blocks=None, trust=None, kind=None, gates=None, ahead=None)
    at = ctx.at({"M": 4, "tag": "q/../../../../x"}).outdir
    assert at.parent == tmp_path / ".kopt" / "k.cu" / "shapes" and at.name == "M=4,tag=q%2F..%2F..%2F..%2F..%2Fx"
