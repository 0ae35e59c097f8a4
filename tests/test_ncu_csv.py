"""Tests for pytest_kopt.gates.ncu_csv against real ncu 2025.3 CSV exports from an H200."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pytest_kopt.gates.ncu_csv import (
    NcuLaunch,
    NcuMetric,
    NcuParseError,
    find_launch,
    metric_value,
    parse_ncu_csv,
    to_base_unit,
)

DATA = Path(__file__).parent / "data" / "ncu"
IDENT = '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC"'
LONG_HEADER = IDENT + ',"Section Name","Metric Name","Metric Unit","Metric Value"\n'


def _load(name: str) -> list[NcuLaunch]:
    return parse_ncu_csv((DATA / name).read_text())


def _row(id_: int, kernel: str, name: str, unit: str, value: str) -> str:
    return (f'"{id_}","1","p","h","{kernel}","1","7","(1, 1, 1)","(1, 1, 1)","0","9.0",'
            f'"Command line profiler metrics","{name}","{unit}","{value}"\n')


def _launch(id_: int, kernel: str) -> NcuLaunch:
    return NcuLaunch(id_, kernel, "(1, 1, 1)", "(1, 1, 1)", "0", "9.0")


# ---- ncu_metrics.csv: long form from --metrics, with banner lines ----

def test_metrics_csv_launches_and_identity():
    launches = _load("ncu_metrics.csv")
    assert [(l.id, l.kernel_name) for l in launches] == [(0, "vadd"), (1, "vadd"), (2, "vadd")]
    first = launches[0]
    assert (first.block_size, first.grid_size, first.device, first.cc) == (
        "(256, 1, 1)", "(65536, 1, 1)", "0", "9.0")


def test_metrics_csv_values_and_units():
    m = _load("ncu_metrics.csv")[0].metrics
    assert m["dram__bytes.sum"] == NcuMetric("dram__bytes.sum", "byte", 189068032.0, "189,068,032")
    assert m["gpu__time_duration.sum"].value == 59936.0
    assert m["gpu__time_duration.sum"].unit == "ns"
    pct = m["dram__throughput.avg.pct_of_peak_sustained_elapsed"]
    assert (pct.value, pct.unit) == (65.61, "%")
    assert m["Command line profiler metrics/sm__throughput.avg.pct_of_peak_sustained_elapsed"].value == 40.30


def test_metrics_csv_last_launch_via_find_launch():
    launch = find_launch(_load("ncu_metrics.csv"), "vadd")
    assert launch.id == 2
    assert metric_value(launch, "gpu__time_duration.sum") == 59680.0
    assert metric_value(launch, "dram__bytes.sum") == 189062656.0


# ---- details.csv: --set full details page ----

def test_details_unit_conversions():
    launches = _load("details.csv")
    assert len(launches) == 3
    m = launches[0].metrics
    assert (m["SM Frequency"].value, m["SM Frequency"].unit) == (1.98e9, "Hz")  # "Ghz","1.98"
    assert m["DRAM Frequency"].value == 3.2e9  # "Ghz","3.20"
    assert (m["Duration"].value, m["Duration"].unit) == (59710.0, "ns")  # "us","59.71"
    assert m["Maximum Sampling Interval"].value == 1500.0  # "us","1.50"
    assert (m["Maximum Buffer Size"].value, m["Maximum Buffer Size"].unit) == (31e6, "byte")  # "Mbyte","31.00"
    assert m["L2 Persisting Size"].value == 11.8e6  # "Mbyte","11.80"
    assert m["Shared Memory Configuration Size"].value == 32770.0  # "Kbyte","32.77"
    assert m["Elapsed Cycles"] == NcuMetric("Elapsed Cycles", "cycle", 118176.0, "118,176")
    assert m["SM Active Cycles"].value == 111604.90  # "111,604.90"
    # compound per-block unit is left as-is
    assert (m["Driver Shared Memory Per Block"].unit, m["Driver Shared Memory Per Block"].value) == ("Kbyte/block", 1.02)


def test_details_duplicate_names_kept_per_section():
    m = _load("details.csv")[0].metrics
    sol = m["GPU Speed Of Light Throughput/Memory Throughput"]
    mwa = m["Memory Workload Analysis/Memory Throughput"]
    assert (sol.value, sol.unit) == (65.87, "%")
    assert (mwa.value, mwa.unit) == (3.17e12, "byte/second")  # "Tbyte/s","3.17"
    assert m["Memory Throughput"] is sol  # first occurrence wins for the plain name
    assert _load("details.csv")[2].metrics["Memory Workload Analysis/Memory Throughput"].value == 3.22e12


def test_details_rule_rows_are_not_metrics():
    m = _load("details.csv")[0].metrics
    assert "" not in m
    assert not any(k.startswith("SpeedOfLight/") for k in m)


# ---- raw.csv: wide form with a units row ----

def test_raw_identity_and_units_row():
    launches = _load("raw.csv")
    assert [(l.id, l.kernel_name, l.block_size) for l in launches] == [
        (0, "vadd", "(256, 1, 1)"), (1, "vadd", "(256, 1, 1)"), (2, "vadd", "(256, 1, 1)")]
    m = launches[0].metrics
    assert "ID" not in m and "Kernel Name" not in m
    assert (m["gpu__time_duration.sum"].value, m["gpu__time_duration.sum"].unit) == (59712.0, "ns")  # us 59.712000


def test_raw_byte_unit_conversions():
    m = _load("raw.csv")[0].metrics
    assert m["derived__lts__lts2xbar_bytes.sum.peak_sustained"] == NcuMetric(
        "derived__lts__lts2xbar_bytes.sum.peak_sustained", "byte", 6016.0, "6.016000")  # Kbyte
    assert m["derived__lts__lts2xbar_bytes.sum.per_second"].value == 2255886000000.0  # "Tbyte","2.255886"
    assert m["derived__lts__lts2xbar_bytes.sum.per_second"].unit == "byte"
    tput = m["dram__bytes.sum.per_second"]  # "Tbyte/s","3.167871"
    assert (tput.value, tput.unit) == (3167871000000.0, "byte/second")
    assert m["dram__bytes_write.sum.per_second"].value == 919987138000.0  # "Gbyte/s","919.987138"
    assert m["launch__shared_mem_config_size"].value == 32768.0  # "Kbyte","32.768000"
    mhz = m["lts__lts2xbar_cycles_active.avg.per_second"]  # "Mhz","749.962052"
    assert (mhz.value, mhz.unit) == (749962052.0, "Hz")


def test_raw_bare_name_alias():
    m = _load("raw.csv")[0].metrics
    full = "SM_B.TriageCompute.l1tex__t_sectors.sum"
    assert m["l1tex__t_sectors.sum"] is m[full]
    assert m[full].value == 6291456.0
    # prefixed column is blank in this export -> None, alias follows it
    dram = "FBSP.TriageCompute.dramc__throughput.avg.pct_of_peak_sustained_elapsed"
    assert m[dram].value is None and m[dram].unit == "%"
    assert m["dramc__throughput.avg.pct_of_peak_sustained_elapsed"] is m[dram]
    # a real column with the bare name wins over the alias of a prefixed column
    bare = "l1tex__throughput.avg.pct_of_peak_sustained_elapsed"
    assert m[bare].name == bare and m[bare].value == 18.06454
    assert m["SM_A.TriageCompute." + bare].value is None
    assert metric_value(launch := _load("raw.csv")[0], "SM_A.TriageCompute." + bare, bare) == 18.06454
    assert launch.id == 0


def test_raw_thousands_and_non_numeric_cells():
    m = _load("raw.csv")[0].metrics
    assert m["derived__l1tex__lsu_writeback_bytes_mem_lgds.sum.per_second"].value == 3371627009646.30
    assert m["device__attribute_max_gpu_frequency_khz"].value == 1980000.0  # no unit: unchanged
    assert m["derived_tempMetric4"].value is None and m["derived_tempMetric4"].raw == "nan"
    assert m["device__attribute_display_name"].value is None
    assert m["device__attribute_display_name"].raw == "NVIDIA H200"


# ---- ncu_triton.csv: Triton kernel with program stdout before the header ----

def test_triton_banner_skipped_and_find_launch():
    launches = _load("ncu_triton.csv")
    assert [l.id for l in launches] == list(range(14))
    assert {l.kernel_name for l in launches} == {"add_k"}
    launch = find_launch(launches, "add_k")
    assert launch.id == 13
    assert metric_value(launch, "gpu__time_duration.sum") == 46080.0
    assert launches[0].metrics["gpu__time_duration.sum"].value == 44672.0
    assert find_launch(launches, None) is launch


# ---- synthetic inputs ----

def test_blank_na_and_thousands_values():
    text = ("==PROF== Connected\nhello from the program\n" + LONG_HEADER
            + _row(0, "k", "a", "ns", "") + _row(0, "k", "b", "ns", "n/a")
            + _row(0, "k", "c", "ns", "N/A") + _row(0, "k", "d", "", "1,234.5")
            + _row(0, "k", "e", "byte", "5,376") + _row(0, "k", "f", "%", "1,5"))
    (launch,) = parse_ncu_csv(text)
    m = launch.metrics
    assert m["a"].value is None and m["b"].value is None and m["c"].value is None
    assert m["b"].raw == "n/a"
    assert m["d"].value == 1234.5
    assert m["e"].value == 5376.0
    assert m["f"].value == 15.0  # a comma is never a decimal point
    assert metric_value(launch, "a", "missing", "d") == 1234.5
    assert metric_value(launch, "a", "b") is None
    assert metric_value(launch) is None


def test_no_header_raises():
    with pytest.raises(NcuParseError, match="no CSV header row found"):
        parse_ncu_csv("==PROF== Connected to process 1\n==ERROR== something failed\n")
    with pytest.raises(NcuParseError, match='"ID"'):
        parse_ncu_csv("")


def test_header_but_zero_metric_rows_raises():
    with pytest.raises(NcuParseError, match="zero metric rows"):
        parse_ncu_csv("==PROF== Disconnected\n" + LONG_HEADER)
    with pytest.raises(NcuParseError, match="zero metric rows"):
        parse_ncu_csv(LONG_HEADER + '"0","1","p","h","k","1","7","(1, 1, 1)","(1, 1, 1)","0","9.0","S","","",""\n')
    assert issubclass(NcuParseError, ValueError)


def test_wide_form_synthetic_columns_by_name():
    text = ('"ID","X.Y.dram__bytes.sum","CC","gpu__time_duration.sum","Kernel Name"\n'
            '"","Kbyte","","msecond",""\n'
            '"4","1,024.5","9.0","2","k"\n')
    (launch,) = parse_ncu_csv(text)
    assert (launch.id, launch.kernel_name, launch.cc, launch.block_size) == (4, "k", "9.0", "")
    assert launch.metrics["dram__bytes.sum"].value == 1024500.0
    assert launch.metrics["X.Y.dram__bytes.sum"].unit == "byte"
    assert launch.metrics["gpu__time_duration.sum"].value == 2e6


def test_rows_grouped_by_id_in_order():
    text = LONG_HEADER + _row(5, "b", "m", "", "1") + _row(3, "a", "m", "", "2") + _row(5, "b", "n", "", "3")
    launches = parse_ncu_csv(text)
    assert [(l.id, sorted(k for k in l.metrics if "/" not in k)) for l in launches] == [
        (5, ["m", "n"]), (3, ["m"])]


@pytest.mark.parametrize(
    ("value", "unit", "expected"),
    [
        (1.98, "Ghz", (1.98e9, "Hz")),
        (2.0, "GHZ", (2e9, "Hz")),
        (749.962052, "Mhz", (749962052.0, "Hz")),
        (3.0, "khz", (3000.0, "Hz")),
        (59.71, "us", (59710.0, "ns")),
        (1.5, "usecond", (1500.0, "ns")),
        (2.0, "msecond", (2e6, "ns")),
        (1.0, "second", (1e9, "ns")),
        (7.0, "ns", (7.0, "ns")),
        (32.77, "Kbyte", (32770.0, "byte")),
        (1.0, "KiB", (1024.0, "byte")),
        (2.0, "MiB", (2097152.0, "byte")),
        (3.17, "Tbyte/s", (3.17e12, "byte/second")),
        (1.5, "Gbyte/second", (1.5e9, "byte/second")),
        (591.639871, "Mbyte/s", (591639871.0, "byte/second")),
        (65.87, "%", (65.87, "%")),
        (3.0, "cycle/usecond", (3.0, "cycle/usecond")),
        (1.02, "Kbyte/block", (1.02, "Kbyte/block")),
        (4.0, "", (4.0, "")),
    ],
)
def test_to_base_unit(value, unit, expected):
    assert to_base_unit(value, unit) == expected


def test_to_base_unit_float_inputs_approx():
    got, unit = to_base_unit(0.1 + 0.2, "Gbyte")
    assert unit == "byte" and got == pytest.approx(0.3e9, rel=1e-12)


def test_find_launch_template_demangling_and_last_match():
    launches = [
        _launch(0, "void gemm_naive<128>(const float*, const float*, float*, int)"),
        _launch(1, "void ns::gemm_naive<64, (bool)1>(const float*, int)"),
        _launch(2, "void other_kernel(float*)"),
        _launch(3, "void gemm_naive<128>(const float*, const float*, float*, int)"),
    ]
    assert find_launch(launches, "gemm_naive").id == 3
    assert find_launch(launches, "ns::gemm_naive").id == 1
    assert find_launch(launches, "other_kernel").id == 2
    assert find_launch(launches, "other").id == 2  # containment
    assert find_launch(launches, "void other_kernel(float*)").id == 2  # exact full name


def test_find_launch_errors_list_names():
    launches = [_launch(0, "vadd"), _launch(1, "vsub"), _launch(2, "add_k")]
    with pytest.raises(NcuParseError, match="no launch matches kernel 'mul'.*'vadd'.*'vsub'.*'add_k'"):
        find_launch(launches, "mul")
    with pytest.raises(NcuParseError, match="ambiguous.*'vadd'.*'add_k'"):
        find_launch(launches, "add")
    with pytest.raises(NcuParseError, match="several kernel names.*'vadd'.*'vsub'"):
        find_launch(launches, None)
    with pytest.raises(NcuParseError, match="no launches"):
        find_launch([], "vadd")


def test_dataclasses_frozen():
    launch = _launch(0, "k")
    assert launch.metrics == {}
    with pytest.raises(dataclasses.FrozenInstanceError):
        launch.id = 1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        NcuMetric("a", "ns", 1.0, "1").value = 2.0  # type: ignore[misc]
