"""Roofline gaps, axis budget (FIELD.md's table of cases) and the metric registry, on a real H200 ncu export."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pytest_kopt import registry
from pytest_kopt.gates import roofline as rf
from pytest_kopt.gates.ncu_csv import parse_ncu_csv

DATA = Path(__file__).parent / "data" / "ncu"
REG = registry.load(registry.METRICS)


@pytest.mark.parametrize(("gaps", "want"), [
    ((.85, .60, .55), (1, 1, 1)),
    ((.92, .57, .61), (1, 1, 1)),   # SKILL.md's walkthrough says 2/0/1; upstream's code and the rule say 1/1/1
    ((.9, .05, .05), (2, 0, 0)),    # upstream 2/1/0: a slot for an axis without evidence, which SKILL.md forbids
    ((.9, None, None), (2, 0, 0)),  # upstream 2/1/0, same reason
    ((None, .6, None), (0, 2, 0)),  # upstream 1/2/0, same reason
    ((.5, .5, 0), (1, 2, 0)),       # tie: memory before compute
    ((.2, .2, .9), (0, 1, 2)),
    ((.05, .05, .05), (1, 1, 1)),   # every gap under 0.10: one slot per known axis
    ((None, None, None), (0, 0, 0)),
    ((.05, None, .05), (1, 0, 1)),
    ((.10, .09, 0.0), (2, 0, 0)),   # 0.10 counts, 0.09 does not
])
def test_axis_budget_table(gaps, want) -> None:
    got = rf.axis_budget(dict(zip(rf.AXES, gaps)))
    assert tuple(got[a] for a in rf.AXES) == want
    assert sum(got.values()) <= rf.BUDGET_TOTAL and max(got.values()) <= rf.BUDGET_CAP


def test_gaps_from_real_full_set_export() -> None:
    """raw.csv: the vector add of h200-samples profiled with --set full."""
    launch = parse_ncu_csv((DATA / "raw.csv").read_text())[0]
    table = rf.metric_table(launch, REG)
    assert table["sm_throughput_pct"] == 40.611448
    assert table["dram_throughput_pct"] == 65.866286
    assert table["fp32_pipe_pct"] == 4.448594
    assert table["dram_bytes"] is None  # only .per_second exists in this export: missing, never 0
    g = rf.gaps(table, REG)
    assert g["compute"] == pytest.approx(1 - 0.40611448, abs=1e-12)
    assert g["memory"] == pytest.approx(1 - 0.65866286, abs=1e-12)
    shares = rf.stall_shares(table, REG)
    assert max(shares, key=shares.get) == "long_scoreboard"
    total = sum(v for n, v in table.items() if n.startswith("stall_") and v is not None and n != "stall_selected")
    assert g["latency"] == pytest.approx(54.451624 / total, rel=1e-12)
    assert rf.bound_of(g) == "latency"
    top = rf.top_metrics(table, REG, 2)
    assert [m["name"] for m in top["memory"]] == ["l2_throughput_pct", "dram_throughput_pct"]
    assert top["latency"][0]["name"] == "stall_long_scoreboard"


def test_missing_metrics_give_null_gaps_and_no_near_peak() -> None:
    table = {name: None for name in REG["metrics"]}
    table["dram_throughput_pct"] = 95.0
    doc = rf.roofline(table, REG, 1.0, {"flops": 0, "bytes_min": 1e9}, None)
    assert doc["delta_compute"] is None and doc["delta_latency"] is None
    assert doc["delta_memory"] == pytest.approx(0.05)
    assert doc["near_peak"] is False  # two gaps unknown
    assert doc["axis_budget"] == {"compute": 0, "memory": 1, "latency": 0}


def test_roofline_with_workload_model_and_peaks(tmp_path: Path) -> None:
    """Naive SGEMM 4096^3 at 25.5 ms on measured peaks: AI, achieved rates and % of the fp32 roofline."""
    table = {name: None for name in REG["metrics"]}
    table.update(sm_throughput_pct=64.5, fp32_pipe_pct=30.0, dram_throughput_pct=5.8, stall_long_scoreboard=3.0,
                 stall_wait=1.0)
    wm = {"flops": 2 * 4096**3, "bytes_min": 4 * 3 * 4096**2}
    peaks = {"dram_bytes_per_s": 4.0e12, "fp32_flops": 5.0e13, "bf16_flops": 7.5e14}
    doc = rf.roofline(table, REG, 25.5, wm, peaks)
    assert doc["method"] == "roofline"
    assert doc["arithmetic_intensity"] == pytest.approx(2 * 4096 / 12)
    assert doc["achieved_flops"] == pytest.approx(2 * 4096**3 / 0.0255)
    assert doc["floor_ms_fp32"] == pytest.approx(2 * 4096**3 / 5.0e13 * 1e3)
    assert doc["sol_pct_fp32"] == pytest.approx(100 * (2 * 4096**3 / 5.0e13 * 1e3) / 25.5)
    assert doc["roofline_bound"] == "compute"
    assert doc["delta_latency"] == pytest.approx(0.75)
    assert doc["near_peak"] is False
    pytest.importorskip("matplotlib")
    png = rf.plot({**doc, "label": "naive"}, [{**doc, "achieved_flops": 1e12, "label": "it0"}], tmp_path / "r.png")
    assert png is not None and (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_tensor_core_work_is_measured_against_the_tensor_peak() -> None:
    """The H200's fp16 Triton matmul, 4096^3 in 0.4176 ms: past the fp32 roofline (it runs on tensor cores), so
    ``sol_pct_best`` puts it against the measured bf16 peak (777 TFLOP/s): 137.4 GFLOP / 777e12 = 0.1769 ms,
    42.4% of 0.4176 ms."""
    table = {name: None for name in REG["metrics"]}
    wm = {"flops": 2 * 4096**3, "bytes_min": 2 * 2 * 4096**2 + 4 * 4096**2}
    peaks = {"dram_bytes_per_s": 4.0e12, "fp32_flops": 5.1e13, "bf16_flops": 7.77e14}
    doc = rf.roofline(table, REG, 0.4176, wm, peaks)
    assert doc["sol_pct_fp32"] == pytest.approx(100 * 2 * 4096**3 / 5.1e13 * 1e3 / 0.4176)
    assert doc["sol_pct_fp32"] > 100
    assert doc["sol_pct_best"] == pytest.approx(100 * 2 * 4096**3 / 7.77e14 * 1e3 / 0.4176)
    assert round(doc["sol_pct_best"], 1) == 42.4


def test_near_peak_needs_model_and_all_gaps_under_015() -> None:
    table = {name: None for name in REG["metrics"]}
    table.update(sm_throughput_pct=90.0, dram_throughput_pct=88.0, stall_long_scoreboard=1.0, stall_wait=9.0)
    assert rf.roofline(table, REG, 1.0, None, None)["near_peak"] is False  # no workload model
    doc = rf.roofline(table, REG, 1.0, {"flops": 1.0, "bytes_min": 1.0}, None)
    assert doc["delta_latency"] == pytest.approx(0.9)
    assert doc["near_peak"] is False
    table.update(stall_long_scoreboard=1.0, stall_wait=1.0, stall_barrier=1.0, stall_drain=1.0, stall_misc=1.0,
                 stall_mio_throttle=1.0, stall_lg_throttle=1.0, stall_no_instruction=1.0)
    doc = rf.roofline(table, REG, 1.0, {"flops": 1.0, "bytes_min": 1.0}, None)
    assert doc["delta_latency"] == pytest.approx(0.125) and doc["near_peak"] is True


def test_metric_registry_lint() -> None:
    """Every logical metric: non-empty alias list of ncu metric names (or section labels), a unit, a direction,
    a known axis; the two metric sets exist."""
    assert set(REG["metric_sets"]) == {"full", "light"}
    ncu_name = re.compile(r"^[a-z0-9]+__[a-z0-9_]+(\.[a-z0-9_]+)*$")
    for name, spec in REG["metrics"].items():
        assert re.match(r"^[a-z0-9_]+$", name), name
        assert spec["aliases"] and all(isinstance(a, str) for a in spec["aliases"]), name
        assert ncu_name.match(spec["aliases"][0]), (name, spec["aliases"][0])
        assert spec["unit"] and spec["direction"] in ("higher", "lower"), name
        assert spec["axis"] in (*rf.AXES, None), name
    stalls = [n for n, s in REG["metrics"].items() if s.get("stall")]
    assert len(stalls) >= 15 and "stall_long_scoreboard" in stalls


@pytest.mark.parametrize(("name", "kernel", "duration_ns", "sm", "dram", "gaps", "worst_stall"), [
    # naive SGEMM 4096^3, light set (> 10 ms), captured by the ncu gate on an H200
    ("h200_gemm_light_raw.csv", "sgemm_naive", 25352672.0, 64.858838, 6.026708, (0.3514, 0.9397, 0.7048),
     "long_scoreboard"),
    # Triton row softmax 4096x1024, full set, captured by the ncu gate on an H200
    ("h200_softmax_full_raw.csv", "softmax_kernel", 9472.0, 29.86912, 38.340039, (0.7013, 0.6166, 0.6118),
     "long_scoreboard"),
])
def test_gaps_from_h200_gate_exports(name, kernel, duration_ns, sm, dram, gaps, worst_stall) -> None:
    """Exports of this project's own ncu gate (NVTX range only: exactly one launch, the target kernel)."""
    from pytest_kopt.gates.ncu_csv import find_launch

    launches = parse_ncu_csv((DATA / name).read_text())
    assert len(launches) == 1
    table = rf.metric_table(find_launch(launches, kernel), REG)
    assert (table["duration"], table["sm_throughput_pct"], table["dram_throughput_pct"]) == (duration_ns, sm, dram)
    g = rf.gaps(table, REG)
    assert tuple(round(g[a], 4) for a in rf.AXES) == gaps
    shares = rf.stall_shares(table, REG)
    assert max(shares, key=shares.get) == worst_stall
    assert rf.axis_budget(g) == {"compute": 1, "memory": 1, "latency": 1}


def test_the_plotting_import_started_ahead_is_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """matplotlib's import runs in a daemon thread from a kernel's first item, once per process (the session's
    scheduler); wait_plotting (called before the roofline chart, the loop's charts and at the session's end)
    returns once it is done, so no second thread imports matplotlib meanwhile and the interpreter never finalizes
    inside that import."""
    import threading
    import time

    from pytest_kopt.gates import roofline
    from pytest_kopt.proc.pool import HarnessPool
    from pytest_kopt.scheduler import Scheduler

    done = threading.Event()
    calls: list[int] = []

    def slow_import() -> None:
        calls.append(1)
        time.sleep(0.3)
        done.set()

    monkeypatch.setattr(roofline, "import_plotting", slow_import)
    ahead = Scheduler(HarnessPool())
    ahead.wait_plotting()  # nothing started: returns at once
    ahead.import_plotting_ahead()
    ahead.import_plotting_ahead()
    assert not done.is_set()
    ahead.wait_plotting()
    assert done.is_set() and calls == [1] and ahead._plotting is not None
    assert not ahead._plotting.is_alive()


def test_the_chart_has_a_title_labelled_roofs_and_explains_the_gaps(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """What a reader needs without the docs: a title, each roof in the legend with its measured value (the DRAM
    roof too), each ridge labelled, and Δc/Δm/Δl spelt out."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    table = {name: None for name in REG["metrics"]}
    table.update(sm_throughput_pct=64.5, fp32_pipe_pct=30.0, dram_throughput_pct=5.8, stall_long_scoreboard=3.0)
    doc = rf.roofline(table, REG, 25.5, {"flops": 2 * 4096**3, "bytes_min": 4 * 3 * 4096**2},
                      {"dram_bytes_per_s": 4.0e12, "fp32_flops": 5.0e13, "bf16_flops": 7.5e14})
    figures: list = []
    close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: (figures.append(fig), close(fig)))
    assert rf.plot({**doc, "label": "naive"}, [], tmp_path / "r.png", title="gemm.cu: roofline at M=4096") is not None
    (ax,) = figures[0].axes
    assert ax.get_title() == "gemm.cu: roofline at M=4096"
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["DRAM roof (measured): 4.00 TB/s", "fp32 roof (measured): 50 TFLOP/s",
                      "bf16 tensor roof (measured): 750 TFLOP/s", "this kernel"]
    texts = [t.get_text() for t in ax.texts]
    assert "fp32 ridge 12.5 FLOP/B" in texts and "DRAM 4.00 TB/s" in texts
    assert any("Δm=0.94 (1 − DRAM throughput)" in t and "Δc=" in t and "Δl=" in t for t in texts), texts
