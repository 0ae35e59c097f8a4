"""``@triton.autotune`` without a GPU checks every config (issue #41): the build compiles each one ahead of time, and
correctness runs each in turn under the interpreter, so a config that computes wrong fails, naming itself. The
kernels are written here: a tile copy-and-scale whose second config unrolls two tiles per program."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from pytest_kopt.gates.correctness import config_pins

pytest.importorskip("triton")

TILED = '''\
import torch
import triton
import triton.language as tl


@triton.autotune(configs=[triton.Config({"BLOCK": 64, "UNROLL": 1}, num_warps=1),
                          triton.Config({"BLOCK": 64, "UNROLL": 2}, num_warps=2)], key=["n"])
@triton.jit
def tile_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr, UNROLL: tl.constexpr):
    base = tl.program_id(0) * BLOCK * UNROLL
    for u in tl.static_range(UNROLL):
        offs = base + OFFSET + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(y_ptr + offs, 3.0 * tl.load(x_ptr + offs, mask=mask), mask=mask)


def setup(n, seed, device="cuda"):
    return {"inputs": {"x": torch.empty(n, device=device)}, "outputs": ["y"]}


def run_kernel(x):
    y = torch.empty_like(x)
    n = x.numel()
    tile_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"] * meta["UNROLL"]),)](x, y, n)
    return y
'''
REF = "def reference(x, **_):\n    return 3 * x\n"


def session(pytester: pytest.Pytester, offset: str) -> tuple[dict, int]:
    pytester.makepyfile(ref=REF, k=TILED.replace("OFFSET", offset))
    result = pytester.runpytest_subprocess("--kopt-baseline", "k.py", "--kopt-ref", "ref.py", "--kopt-dims", "n=500",
                                           "--kopt-seeds", "2", "-k", "correctness", "--kopt-json", "r.json",
                                           "-p", "no:cacheprovider", timeout=600)
    doc = json.loads((pytester.path / "r.json").read_text())
    (item,) = [i for i in doc["items"] if "correctness" in i["nodeid"]]
    return item, result.ret


def test_a_broken_second_config_fails_and_is_named(pytester: pytest.Pytester) -> None:
    """The second config forgets the unrolled tile's offset (``u * BLOCK``): the first config is right, the second
    writes the first half of each pair of tiles twice and leaves the second half unwritten. Before, correctness ran
    the first config only and the session exited 0."""
    item, ret = session(pytester, "0")
    assert item["outcome"] == "failed" and item["status"] in ("UNWRITTEN", "INCORRECT_NUMERICAL"), item
    assert item["message"].startswith("with config 2 of 2 (tile_kernel: BLOCK=64, UNROLL=2, num_warps=2"), item
    assert ret == 2


def test_every_right_config_passes(pytester: pytest.Pytester) -> None:
    item, ret = session(pytester, "u * BLOCK")
    assert (item["outcome"], item["status"]) == ("passed", "PASSED"), item
    assert item["summary"].endswith("; every config checked in turn (tile_kernel: 2)"), item["summary"]
    assert item["figures"]["configs_checked"] == 2 and ret == 0


def test_config_pins_cover_every_config_of_every_kernel_on_the_cpu_only() -> None:
    """Two autotuned kernels of 3 and 2 configs: three runs, each kernel's configs in turn (the shorter list
    wraps); on a GPU the tuned config alone; a build recorded without the list, its pin alone."""
    res = SimpleNamespace(autotune={"a": {"config": {"B": 1}, "all": [{"B": 1}, {"B": 2}, {"B": 3}]},
                                    "b": {"config": {"W": 1}, "all": [{"W": 1}, {"W": 2}]}})
    assert config_pins(res, "cpu") == [{"a": {"B": 1}, "b": {"W": 1}}, {"a": {"B": 2}, "b": {"W": 2}},
                                       {"a": {"B": 3}, "b": {"W": 1}}]
    assert config_pins(res, "cuda") == [None]
    assert config_pins(SimpleNamespace(autotune={"a": {"config": {"B": 1}}}), "cpu") == [None]
    assert config_pins(SimpleNamespace(autotune={}), "cpu") == [None]
