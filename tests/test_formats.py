"""Kernels as people write them: outputs returned by ``run_kernel`` (and by ``reference``), operations that change
an input in place, and the wrong ways to do each, judged through the ``--kopt-json`` report on the CPU."""

from __future__ import annotations

import json

import pytest

RET_REF = """\
atol = 1e-6
rtol = 1e-6
def reference(x, **_):
    return 2 * x
"""
RET_KERNEL = """\
import torch
def setup(n, seed, device="cuda"):
    x = torch.empty(n, device=device)
    return {{"inputs": {{"x": x}}, "outputs": {outputs}}}
def run_kernel(x):
{body}
"""


def session(pytester: pytest.Pytester, *args: str) -> tuple[pytest.RunResult, dict[str, dict]]:
    """A subprocess session; its JSON report's items by node id (the kernel file's name included)."""
    result = pytester.runpytest_subprocess(*args, "--kopt-json", "r.json", "-p", "no:cacheprovider", timeout=600)
    path = pytester.path / "r.json"
    assert path.is_file(), result.stdout.str()[-3000:] + result.stderr.str()[-2000:]
    return result, {i["nodeid"]: i for i in json.loads(path.read_text())["items"]}


def correctness(pytester: pytest.Pytester, ref: str, **kernels: str) -> tuple[pytest.RunResult, dict[str, dict]]:
    """Write ``ref.py`` and the kernels (the first is the baseline), run correctness on two seeds at n=64."""
    pytester.makepyfile(ref=ref, **kernels)
    names = [f"{k}.py" for k in kernels]
    args = ["--kopt-baseline", names[0]]
    for extra in names[1:]:
        args += ["--kopt-candidate", extra]
    return session(pytester, *args, "--kopt-ref", "ref.py", "--kopt-dims", "n=64", "--kopt-seeds", "1,2",
                   "-k", "correctness or plan")


def test_outputs_returned_by_the_kernel_and_the_reference_are_compared(pytester: pytest.Pytester) -> None:
    """``"outputs": ["y"]`` with no ``y`` among the inputs: ``run_kernel`` returns y. Right is PASSED on both seeds
    with the output named y; a wrong value is INCORRECT_NUMERICAL on y."""
    result, items = correctness(
        pytester, RET_REF,
        good=RET_KERNEL.format(outputs='["y"]', body="    return 2 * x"),
        wrong=RET_KERNEL.format(outputs='["y"]', body="    return 2 * x + (x > 1)"))
    for seed in (1, 2):
        good = items[f"good.py::correctness[seed={seed}]"]
        assert (good["outcome"], good["status"]) == ("passed", "PASSED"), good
    wrong = items["wrong.py::correctness[seed=1]"]
    assert (wrong["outcome"], wrong["status"]) == ("failed", "INCORRECT_NUMERICAL"), wrong
    assert wrong["details"].startswith("output y [64]:"), wrong["details"]
    assert (wrong["path"], wrong["fix"]) == ("wrong.py", "fix the kernel; the indices above show "
                                                                            "where it is wrong"), wrong
    assert result.ret == 2


def test_several_returned_outputs_without_an_outputs_list_are_named_by_position(pytester: pytest.Pytester) -> None:
    """No ``"outputs"`` in setup(): the return value names the outputs; a tuple (y, z) from both sides is compared
    element by element, and swapping them is caught."""
    ref = RET_REF.replace("return 2 * x", "return 2 * x, x - 1")
    kernel = RET_KERNEL.replace(', "outputs": {outputs}', "")
    result, items = correctness(pytester, ref, good=kernel.format(body="    return x + x, x - 1"),
                                swapped=kernel.format(body="    return x - 1, x + x"))
    good = items["good.py::correctness[seed=1]"]
    assert good["status"] == "PASSED", good
    assert items["swapped.py::correctness[seed=1]"]["status"] == "INCORRECT_NUMERICAL"
    assert result.ret == 2


def test_a_kernel_that_returns_nothing_is_told_what_to_return(pytester: pytest.Pytester) -> None:
    """setup() promises a returned ``y`` and run_kernel returns None: a CONTRACT_ERROR naming y and the fix (before,
    a returned output could not be declared at all), exit 4."""
    result, items = correctness(pytester, RET_REF,
                                base=RET_KERNEL.format(outputs='["y"]', body="    y = 2 * x"))
    item = items["base.py::correctness[seed=1]"]
    assert (item["outcome"], item["status"]) == ("failed", "CONTRACT_ERROR"), item
    assert "returned nothing, but y should come back" in item["message"], item["message"]
    assert result.ret == 4


def test_a_reference_that_forgets_to_return_or_write_is_named(pytester: pytest.Pytester) -> None:
    """The kernel returns y, the reference computes ``y = 2 * x`` and drops it: a CONTRACT_ERROR naming ref.py's
    reference(), never a comparison against nothing."""
    result, items = correctness(pytester, RET_REF.replace("return 2 * x", "y = 2 * x"),
                                base=RET_KERNEL.format(outputs='["y"]', body="    return 2 * x"))
    item = items["base.py::correctness[seed=1]"]
    assert item["status"] == "CONTRACT_ERROR", item
    assert "ref.py: reference() returned nothing" in item["message"], item["message"]
    assert result.ret == 4


def test_a_value_returned_by_an_in_place_kernel_is_an_error_not_ignored(pytester: pytest.Pytester) -> None:
    """Every output is in place (y among the inputs) and run_kernel returns a new tensor instead of writing y: that
    value would be dropped, so it is a CONTRACT_ERROR with the copy_ fix, not an UNWRITTEN puzzle. ``return y``
    after writing y is fine."""
    ref = "def reference(x, y, **_):\n    y.copy_(2 * x)\n"
    kernel = """\
import torch
def setup(n, seed, device="cuda"):
    x, y = torch.empty(n, device=device), torch.empty(n, device=device)
    return {{"inputs": {{"x": x, "y": y}}, "outputs": ["y"]}}
def run_kernel(x, y):
{body}
"""
    result, items = correctness(pytester, ref, base=kernel.format(body="    y.copy_(2 * x)\n    return y"),
                                dropped=kernel.format(body="    return 2 * x"))
    assert items["base.py::correctness[seed=1]"]["status"] == "PASSED"
    item = items["dropped.py::correctness[seed=1]"]
    assert item["status"] == "CONTRACT_ERROR", item
    assert "written in place, so the returned value would be ignored" in item["message"], item["message"]
    assert "y.copy_(result)" in item["fix"], item


def test_a_returned_result_cached_across_calls_is_caught(pytester: pytest.Pytester) -> None:
    """A kernel that computes once and returns the same tensor on every later call (the inputs change between
    calls): not PASSED. Returned memory is poisoned after each copy, so the cached tensor is NaN by call 2."""
    body = ("    global CACHE\n    if CACHE is None:\n        CACHE = 2 * x\n    return CACHE")
    result, items = correctness(pytester, RET_REF,
                                base=RET_KERNEL.format(outputs='["y"]', body="    return 2 * x"),
                                cached="CACHE = None\n" + RET_KERNEL.format(outputs='["y"]', body=body))
    item = items["cached.py::correctness[seed=1]"]
    assert item["outcome"] == "failed" and item["status"] != "PASSED", item
    assert result.ret == 2


INPLACE_REF = """\
inplace = ["x"]
def reference(x, **_):
    x.clamp_(min=0)
"""
INPLACE_KERNEL = """\
import torch
def setup(n, seed, device="cuda"):
    x = torch.empty(n, device=device)
    return {{"inputs": {{"x": x}}, "outputs": ["x"]}}
def run_kernel(x):
    {body}
"""


def test_an_operation_in_place_reads_its_input_and_is_checked_on_it(pytester: pytest.Pytester) -> None:
    """``inplace = ["x"]`` in ref.py: x is drawn (not poisoned) before each call, the kernel changes it, and its
    result is compared. Clamping the wrong side is INCORRECT_NUMERICAL; both seeds of the right one pass."""
    result, items = correctness(pytester, INPLACE_REF, good=INPLACE_KERNEL.format(body="x.clamp_(min=0)"),
                                wrong=INPLACE_KERNEL.format(body="x.clamp_(max=0)"))
    for seed in (1, 2):
        assert items[f"good.py::correctness[seed={seed}]"]["status"] == "PASSED", items
    assert items["wrong.py::correctness[seed=1]"]["status"] == "INCORRECT_NUMERICAL"
    assert result.ret == 2


def test_inplace_must_be_a_list_of_names(pytester: pytest.Pytester) -> None:
    """``inplace = "x"`` (a string, not a list): preflight CONTRACT_ERROR at ref.py's line, exit 4."""
    result, items = correctness(pytester, INPLACE_REF.replace('["x"]', '"x"'),
                                base=INPLACE_KERNEL.format(body="x.clamp_(min=0)"))
    item = items["base.py::plan"]
    assert item["status"] == "CONTRACT_ERROR" and "inplace = 'x' is not a list" in item["message"], item
    assert result.ret == 4


needs_triton = pytest.mark.skipif(__import__("importlib.util").util.find_spec("triton") is None,
                                  reason="triton not installed")
AUTOTUNED = '''\
import torch
import triton
import triton.language as tl

@triton.autotune(configs=[triton.Config({"BLOCK": b}, num_warps=w) for b, w in ((64, 1), (128, 2), (256, 4), (512, 4))],
                 key=["n"])
@triton.jit
def scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, 2.0 * tl.load(x_ptr + offs, mask=mask), mask=mask)

def setup(n, seed, device="cuda"):
    return {"inputs": {"x": torch.empty(n, device=device)}, "outputs": ["y"]}

def run_kernel(x):
    y = torch.empty_like(x)
    n = x.numel()
    scale_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, n)
    return y
'''


@needs_triton
def test_an_autotuned_triton_kernel_compiles_every_config_and_is_checked_on_the_first(
        pytester: pytest.Pytester) -> None:
    """A returning Triton kernel with ``@triton.autotune`` over 4 configs, on the CPU: preflight says what will
    happen, compile builds all 4 ahead of time and pins the first, correctness runs that config under the
    interpreter, SASS disassembles the pinned cubin only (one function, not four). Before, compile failed with the
    driver's "0 active drivers" and every later gate retried it."""
    pytester.makepyfile(ref=RET_REF.replace("1e-6", "1e-5"), k=AUTOTUNED)
    result, items = session(pytester, "--kopt-baseline", "k.py", "--kopt-ref", "ref.py", "--kopt-dims", "n=1000",
                            "--kopt-seeds", "1", "-k", "not timing and not ncu and not roofline")
    pre, comp, corr, sass = (items[f"k.py::{g}"] for g in ("preflight", "compile", "correctness[seed=1]", "sass"))
    assert "@triton.autotune scale_kernel: every config compiled ahead of time, correctness on the first" \
        in pre["summary"], pre
    assert pre["figures"]["tuned_scale_kernel"] == "autotune"
    assert comp["status"] == "PASSED" and "4 of 4 configs compiled, the first stated" in comp["summary"], comp
    assert comp["figures"]["autotune_scale_kernel"].startswith("BLOCK=64, num_warps=1"), comp["figures"]
    assert corr["status"] == "PASSED" and "pinned config scale_kernel: BLOCK=64, num_warps=1" in corr["summary"]
    assert sass["status"] == "PASSED" and sass["figures"]["functions"] == 1, sass
    assert result.ret == 0


BF16 = '''\
import torch
import triton
import triton.language as tl

@triton.jit
def scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, 2.0 * tl.load(x_ptr + offs, mask=mask), mask=mask)

def setup(n, seed, device="cuda"):
    x = torch.empty(n, device=device, dtype=torch.bfloat16)
    return {"inputs": {"x": x, "y": torch.empty_like(x)}, "outputs": ["y"]}

def run_kernel(x, y):
    scale_kernel[(triton.cdiv(x.numel(), 256),)](x, y, x.numel(), BLOCK=256)
'''


@needs_triton
def test_a_bf16_triton_kernel_is_not_judged_by_the_interpreter(pytester: pytest.Pytester) -> None:
    """An honest bf16 Triton kernel on the CPU: correctness is skipped, blocked by hardware with the interpreter's
    reason, never a RUNTIME_ERROR or INCORRECT_NUMERICAL that says "fix the kernel"; it still compiles and its SASS
    is checked, and the session exits 0."""
    pytester.makepyfile(ref="atol = 1e-2\nrtol = 1e-2\ndef reference(x, y, **_):\n    y.copy_(2 * x)\n", k=BF16)
    result, items = session(pytester, "--kopt-baseline", "k.py", "--kopt-ref", "ref.py", "--kopt-dims", "n=1000",
                            "--kopt-seeds", "1")
    corr = items["k.py::correctness[seed=1]"]
    assert (corr["outcome"], corr["status"], corr["blocked_by"]) == ("skipped", "SKIPPED", "hardware"), corr
    assert "Triton's interpreter does not compute bfloat16 right" in corr["message"]
    assert items["k.py::compile"]["status"] == items["k.py::sass"]["status"] == "PASSED"
    assert result.ret == 0
