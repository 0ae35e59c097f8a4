"""Gaps of Triton's interpreter are a skip with the reason, never a kernel failure (issue #41): a kernel that calls
``libdevice.asin`` cannot run in the interpreter (triton 3.9's libdevice functions are stubs there), and its
correctness items on a machine without a GPU say so, blocked by hardware; a kernel's own error raised in its own
line is still its failure. The kernels are written here and run in the interpreter in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("triton")

ASIN_KERNEL = '''\
"""The arc sine of each element, through libdevice."""
import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice


@triton.jit
def arcsin_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, libdevice.asin(x), mask=mask)


def setup(n, seed, device="cuda"):
    return {"inputs": {"x": torch.empty(n, device=device), "y": torch.empty(n, device=device)}, "outputs": ["y"]}


def run_kernel(x, y):
    n = x.numel()
    arcsin_kernel[(triton.cdiv(n, 128),)](x, y, n, BLOCK=128)
'''
ASIN_REF = """\
import torch
regimes = ["uniform"]
def shapes(n):
    return {"x": ((n,), "float32"), "y": ((n,), "float32")}
def reference(x, y, **_):
    y.copy_(torch.asin(x))
"""

PROBE = """\
import sys, torch, triton, triton.language as tl
from triton.language.extra import libdevice
from pytest_kopt.child.interpreter import interpreter_gap

@triton.jit
def asin_k(x_ptr, y_ptr, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(y_ptr + i, libdevice.asin(tl.load(x_ptr + i)))

@triton.jit
def asm_k(x_ptr, y_ptr, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i)
    y = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1)
    tl.store(y_ptr + i, y)

@triton.jit
def typo_k(x_ptr, y_ptr, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i) * tl.sqrt_rn_typo(2.0))

@triton.jit
def wrong_store_k(x_ptr, y_ptr, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i), mask=i)

x, y = torch.rand(16), torch.empty(16)
for k in (asin_k, asm_k, typo_k, wrong_store_k):
    try:
        k[(1,)](x, y, BLOCK=16)
        print(k.__name__, "ran")
    except Exception as exc:
        print(k.__name__, "->", interpreter_gap(exc))
"""


def test_the_interpreters_own_gaps_are_told_from_the_kernels_errors(tmp_path: Path) -> None:
    """In the interpreter: libdevice.asin and an inline assembly block are the interpreter's gaps, named; a
    misspelt tl function (AttributeError in the kernel's own line) and a bad store mask (an error Triton would
    raise on a GPU too) are the kernel's."""
    probe = tmp_path / "probe.py"  # a file: the gap is read from the kernel's own source line
    probe.write_text(PROBE)
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, str(probe)], capture_output=True, text=True, timeout=300, env=env)
    lines = dict(line.split(" -> ", 1) for line in out.stdout.splitlines() if " -> " in line)
    assert lines == {"asin_k": "Triton's interpreter lacks libdevice.asin",
                     "asm_k": "Triton's interpreter lacks inline_asm_elementwise",
                     "typo_k": "None", "wrong_store_k": "None"}, out.stdout + out.stderr[-3000:]


def test_a_kernel_calling_libdevice_is_blocked_by_hardware_with_the_reason(pytester: pytest.Pytester) -> None:
    """On a machine without a GPU: the correctness items of a libdevice.asin kernel are skipped (blocked by
    hardware) with "Triton's interpreter lacks libdevice.asin; checked on a GPU"; exit 0, where it failed at
    correctness with exit 2 ("the kernel raised an error")."""
    pytester.makepyfile(k=ASIN_KERNEL, ref=ASIN_REF)
    result = pytester.runpytest_subprocess("--kopt-baseline", "k.py", "--kopt-ref", "ref.py", "--kopt-dims", "n=300",
                                           "--kopt-seeds", "4,9", "-k", "correctness", "--kopt-json", "r.json",
                                           "-p", "no:cacheprovider", timeout=600)
    doc = json.loads((pytester.path / "r.json").read_text())
    items = {i["nodeid"].split("::", 1)[1]: i for i in doc["items"] if "correctness" in i["nodeid"]}
    assert sorted(items) == ["correctness[seed=4]", "correctness[seed=9]"]
    for item in items.values():
        assert (item["outcome"], item["status"]) == ("skipped", "SKIPPED"), item
        assert item["blocked_by"] == "hardware", item
        assert "Triton's interpreter lacks libdevice.asin; checked on a GPU" in item["message"], item
    assert doc["exit_code"] == result.ret == 0, textwrap.shorten(result.stdout.str(), 3000)
