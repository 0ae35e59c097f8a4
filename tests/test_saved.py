"""Saved baselines: written in pytest-benchmark's format, read back by its own loader, keyed by GPU model."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pytest_benchmark")

from pytest_kopt import saved  # noqa: E402
from pytest_kopt.prgate import verdict  # noqa: E402


def test_save_load_roundtrip_and_gpu_keying(tmp_path: Path) -> None:
    samples = [1.0, 1.1, 0.9, 1.05, 0.95]
    entry = saved.benchmark_entry("gemm", samples, {"dims": {"M": 64}})
    assert entry["stats"]["median"] == pytest.approx(0.001) and entry["stats"]["rounds"] == 5
    assert entry["stats"]["min"] == pytest.approx(0.0009) and entry["stats"]["max"] == pytest.approx(0.0011)
    f1 = saved.save(tmp_path, "main", "NVIDIA H200", [entry], {"gpu": "NVIDIA H200"})
    f2 = saved.save(tmp_path, "main", "NVIDIA H200", [saved.benchmark_entry("gemm", [2.0] * 5, {})], {})
    assert f1.name == "0001_main.json" and f2.name == "0002_main.json" and f1.parent.name == "kopt-NVIDIA_H200"
    latest = saved.load_latest(tmp_path, "main", "NVIDIA H200")
    assert latest == {"gemm": pytest.approx([2.0] * 5)}
    assert saved.load_latest(tmp_path, "main", "NVIDIA H100 80GB HBM3") is None  # never across GPU models
    # pytest-benchmark's own loader reads the file (it normalises the stats of every entry)
    from pytest_benchmark.storage.file import FileStorage

    loaded = list(FileStorage(tmp_path, saved.LOG).load("kopt-NVIDIA_H200/0001_main"))
    assert loaded and loaded[0][1]["benchmarks"][0]["name"] == "gemm"
    assert verdict(latest["gemm"], samples, 3.0)["verdict"] == "FASTER"
