"""What a newcomer's first session runs into, checked through the ``--kopt-json`` report: a reference whose
``shapes()`` dtypes contradict the kernel, dims the reference does not take, and the messages those give."""

from __future__ import annotations

import json
import textwrap

import pytest

CU = """\
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
template <typename T>
__global__ void copy(const T* __restrict__ x, T* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i];
}
extern "C" void solve(const CTYPE* __restrict__ x, CTYPE* y, int n) {
    copy<<<(n + 255) / 256, 256>>>(x, y, n);
}
"""
REF = """\
import torch
def shapes(n):
    return {"x": ((n,), DTYPE), "y": ((n,), DTYPE)}
def reference(x, y, n, **_):
    y.copy_(x)
"""


def run_json(pytester: pytest.Pytester, *args: str) -> tuple[pytest.RunResult, dict]:
    """pytest in a subprocess with ``--kopt-json r.json``; the result and the parsed report."""
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *args, "--kopt-json", "r.json", timeout=600)
    return result, json.loads((pytester.path / "r.json").read_text())


def item(report: dict, gate: str) -> dict:
    """The report's item of ``gate``."""
    return next(i for i in report["items"] if i["gate"] == gate)


@pytest.mark.parametrize("ctype, dtype, status", [
    ("float", '"float33"', "CONTRACT_ERROR"),         # no dtype at all
    ("float", '"float16"', "CONTRACT_ERROR"),         # a dtype that contradicts the pointer
    ("__half", "torch.float32", "CONTRACT_ERROR"),
    ("__half", '"float16"', "PASSED"),
    ("half", '"half"', "PASSED"),                     # torch's alias names the same dtype
    ("__nv_bfloat16", "torch.bfloat16", "PASSED"),
    ("int", '"int32"', "PASSED"),
    ("unsigned int", '"int32"', "CONTRACT_ERROR"),    # uint32 is not int32
])
def test_shapes_dtype_must_be_solves(pytester: pytest.Pytester, ctype: str, dtype: str, status: str) -> None:
    """A ``.cu`` kernel's buffers take their dtype from ``solve()``'s pointer types; a ``shapes()`` dtype that is
    not a dtype, or another one, is a contract error at plan (exit 4) naming the reference, its line, the buffer,
    both dtypes and the fix, never a silent pass."""
    pytester.makefile(".cu", k=CU.replace("CTYPE", ctype))
    pytester.makepyfile(ref=REF.replace("DTYPE", dtype))
    result, report = run_json(pytester, "--kopt-baseline", "k.cu", "--kopt-ref", "ref.py", "--kopt-dims", "n=1000",
                              "-k", "preflight or plan")
    plan = item(report, "plan")
    assert plan["status"] == status, plan
    if status == "PASSED":
        assert result.ret == 0
        return
    assert result.ret == 4 and report["exit_code"] == 4
    assert plan["path"].endswith("ref.py") and plan["line"] == 2  # the line of `def shapes`
    if "33" in dtype:
        assert "'x'" in plan["message"] and "'float33'" in plan["message"] and "not a torch dtype" in plan["message"]
        assert "float32, float16" in plan["fix"]
    else:
        shown = {"float": "float16", "__half": "float32", "unsigned int": "int32"}[ctype]
        want = {"float": "float32", "__half": "float16", "unsigned int": "uint32"}[ctype]
        assert f"buffer 'x' dtype {shown}, but solve() takes it as a {ctype}* ({want})" in plan["message"], plan
        assert f"give x as '{want}' in shapes() of ref.py" in plan["fix"], plan
    # the failure line names the reference once, with its line
    text = result.stdout.str()
    assert text.count("ref.py") >= 1 and "ref.py:2: ref.py" not in text and "ref.py: /" not in text


def test_dim_the_reference_does_not_take(pytester: pytest.Pytester) -> None:
    """A dim no function of the reference takes (``Q=3`` for a GEMM) fails at preflight, before anything runs:
    exit 4 naming the dim, the function, the parameters it takes and the fix."""
    pytester.makefile(".cu", k=CU.replace("CTYPE", "float"))
    pytester.makepyfile(ref=REF.replace("DTYPE", '"float32"'))
    result, report = run_json(pytester, "--kopt-baseline", "k.cu", "--kopt-ref", "ref.py", "--kopt-dims",
                              "n=1000,Q=3", "-k", "preflight or plan")
    pre = item(report, "preflight")
    assert result.ret == 4 and pre["status"] == "CONTRACT_ERROR", pre
    assert pre["message"] == "--kopt-dims gives Q, which shapes() in ref.py does not take (its parameters: n)"
    assert pre["path"].endswith("ref.py") and pre["line"] == 2
    assert pre["fix"] == "leave Q out of --kopt-dims, or add it to shapes()'s parameters (or accept **kwargs) in ref.py"
    assert item(report, "plan")["status"] == "SKIPPED"
    result.stdout.fnmatch_lines(["k.cu: CONTRACT_ERROR at preflight"])  # the kernel's verdict line


def test_a_dim_typed_wrong_is_named_with_the_one_meant(pytester: pytest.Pytester) -> None:
    """``n`` typed ``nn``: the dim the reference does take is suggested (difflib's closest, at its default cutoff),
    for the kernel's setup() and for the reference's functions alike."""
    pytester.makefile(".cu", k=CU.replace("CTYPE", "float"))
    pytester.makepyfile(ref=REF.replace("DTYPE", '"float32"'))
    result, report = run_json(pytester, "--kopt-baseline", "k.cu", "--kopt-ref", "ref.py", "--kopt-dims",
                              "nn=1000", "-k", "preflight")
    pre = item(report, "preflight")
    assert result.ret == 4 and pre["message"].endswith(" (--kopt-dims gives `nn`: meant `n`?)"), pre
    pytester.makepyfile(mine="def setup(n, seed, device='cpu'):\n    pass\n\n\ndef run_kernel(**_):\n    pass\n")
    result, report = run_json(pytester, "--kopt-baseline", "mine.py", "--kopt-ref", "ref.py", "--kopt-dims",
                              "nn=1000", "-k", "preflight")
    pre = item(report, "preflight")
    assert result.ret == 4 and pre["message"] == "setup() has no parameter `nn` (did you mean `n`?)", pre


def test_dim_taken_through_kwargs_passes(pytester: pytest.Pytester) -> None:
    """A reference whose functions accept ``**kwargs`` takes any dim: an extra one only warns (a typo?)."""
    pytester.makefile(".cu", k=CU.replace("CTYPE", "float"))
    pytester.makepyfile(ref=textwrap.dedent(REF.replace("DTYPE", '"float32"')).replace("def shapes(n):",
                                                                                     "def shapes(n, **_):"))
    result, report = run_json(pytester, "--kopt-baseline", "k.cu", "--kopt-ref", "ref.py", "--kopt-dims",
                              "n=1000,Q=3", "-k", "preflight or plan")
    assert result.ret == 0, result.stdout.str()
    assert "Q not named" in item(report, "preflight")["summary"]
    assert item(report, "plan")["status"] == "PASSED"


SOFTMAX = "examples/softmax_triton"


@pytest.mark.parametrize("selection", ["plan", "compile"])
def test_run_kernel_names_are_the_contract(pytester: pytest.Pytester, example, selection: str) -> None:
    """``run_kernel`` is called with setup()'s inputs by name: parameters named otherwise are a contract error
    (exit 4) at plan, or at compile when the plan is deselected, naming both sides' names, the line of
    ``def run_kernel`` and the fix; never a COMPILE_ERROR that points at a traceback no one is shown."""
    ex = example("softmax_triton")
    src = (ex / "softmax.py").read_text()
    (ex / "softmax.py").write_text(src.replace("def run_kernel(x, y):", "def run_kernel(inp, y):\n    x = inp"))
    line = 1 + src.splitlines().index("def run_kernel(x, y):")
    result, report = run_json(pytester, "--kopt-baseline", str(ex / "softmax.py"), "--kopt-ref", str(ex / "ref.py"),
                              "--kopt-dims", "M=4,N=16", "--kopt-seeds", "1", "-k", selection)
    it = item(report, selection)
    assert result.ret == 4 and it["status"] == "CONTRACT_ERROR", it
    assert it["message"] == ("run_kernel(inp, y) does not take setup()'s inputs (x, y) by name: setup() gives x, "
                             "which it has no parameter for; it needs inp, which setup() does not give (or not by "
                             "name)")
    assert it["path"].endswith("softmax.py") and it["line"] == line
    assert it["fix"] == ("name run_kernel()'s parameters after setup()'s inputs (def run_kernel(x, y)), or take "
                         "them as **inputs")


def test_a_passing_triton_kernel_gets_a_verdict_line(pytester: pytest.Pytester, example) -> None:
    """The terminal summary ends each kernel with a verdict line, whatever its kind: a passing Triton kernel on a
    machine without a GPU reads PASSED with its output checked and why it was not timed (a ``.cu`` reads
    NOT_CHECKED, a failing kernel its status and gate: :func:`test_dim_the_reference_does_not_take`)."""
    ex = example("softmax_triton")
    result, report = run_json(pytester, "--kopt-baseline", str(ex / "softmax.py"), "--kopt-ref", str(ex / "ref.py"),
                              "--kopt-dims", "M=4,N=16", "--kopt-seeds", "1")
    (verdict,) = report["kernels"]
    assert result.ret == 0 and verdict["status"] == "PASSED", verdict
    if report["env"]["gpu_available"]:
        result.stdout.fnmatch_lines(["softmax_triton/softmax.py: PASSED: median * ms, *x the reference"])
    else:
        assert not verdict["timed"]
        result.stdout.fnmatch_lines(["softmax_triton/softmax.py: PASSED: output checked, not timed (blocked by "
                                     "hardware: no GPU*)"])


@pytest.mark.parametrize("text, limit, want", [
    ("short text", 40, "short text"),
    ("blocked by hardware: no GPU, and reference.py asks for CUDA", 30, "blocked by hardware: no GPU…"),
    ("x" * 50, 20, "x" * 19 + "…"),  # one word longer than the limit: cut inside it, the only way
])
def test_clip_cuts_at_a_word(text: str, limit: int, want: str) -> None:
    """Lines the terminal summary shortens end at a whole word with an ellipsis, never mid-word."""
    from pytest_kopt.errors import clip

    assert clip(text, limit) == want and len(want) <= limit


def test_a_late_failure_reports_its_own_figures(pytester: pytest.Pytester, example) -> None:
    """A kernel right on its first correctness call and wrong on a later one (here: from its third call in a
    process on) fails with the figures of the comparison that failed (every element off), never those of the
    first call, which passed (max abs err ~1e-8, 0 mismatched)."""
    ex = example("softmax_triton")
    src = (ex / "softmax.py").read_text()
    src = src.replace("def run_kernel(x, y):\n", "CALLS = [0]\n\n\ndef run_kernel(x, y):\n    CALLS[0] += 1\n")
    src = src.replace("num_warps=4 if BLOCK <= 2048 else 8)", "num_warps=4 if BLOCK <= 2048 else 8)\n"
                      "    if CALLS[0] > 2:\n        y.mul_(1.5)")
    (ex / "softmax.py").write_text(src)
    result, report = run_json(pytester, "--kopt-baseline", str(ex / "softmax.py"), "--kopt-ref", str(ex / "ref.py"),
                              "--kopt-dims", "M=4,N=16", "--kopt-seeds", "1", "-k", "correctness")
    it = item(report, "correctness")
    assert result.ret == 2 and it["status"] in ("NONDETERMINISTIC", "INCORRECT_NUMERICAL"), it
    assert it["figures"]["mismatched"] == 4 * 16, it["figures"]
    assert it["figures"]["max_abs_err"] > 1e-2, it["figures"]  # half of the largest softmax value of a row


POSONLY_KERNEL = """\
import torch


def setup(n, seed, device="cpu"):
    x = torch.empty(n, device=device)
    return {{"inputs": {{"x": x, "y": torch.empty_like(x)}}, "outputs": ["y"]}}


def run_kernel({run}):
    y.copy_(x * 2)
"""
POSONLY_REF = """\
atol = 1e-6
rtol = 1e-6


def shapes(n, **_):
    return {{"x": ((n,), "float32"), "y": ((n,), "float32")}}


def reference({ref}):
    y.copy_(2 * x)
"""


@pytest.mark.parametrize(("run", "ref", "where", "says"), [
    ("x, y, /", "x, y, n", ("kernel.py", 9), "run_kernel() takes x, y positional-only (before its '/')"),
    ("x, y", "x, y, /, n", ("ref.py", 9), "reference() takes x, y positional-only (before its '/')"),
])
def test_a_positional_only_parameter_kopt_passes_by_name_is_refused_at_preflight(
        pytester: pytest.Pytester, run: str, ref: str, where: tuple[str, int], says: str) -> None:
    """run_kernel(x, y, /) got a message contradicting itself at the plan gate ("gives x, y, which it has no
    parameter for; needs x, y"); reference(x, y, /, n) passed preflight and failed every case alike (red-team).
    Both are a CONTRACT_ERROR at preflight naming the def line and the '/' to remove."""
    pytester.makepyfile(kernel=POSONLY_KERNEL.format(run=run), ref=POSONLY_REF.format(ref=ref))
    result = pytester.runpytest_subprocess("--kopt-baseline", "kernel.py", "--kopt-ref", "ref.py", "--kopt-dims",
                                           "n=64", "--kopt-json", "r.json", "-k", "preflight", "-p",
                                           "no:cacheprovider", timeout=600)
    (item,) = json.loads((pytester.path / "r.json").read_text())["items"]
    assert (result.ret, item["status"]) == (4, "CONTRACT_ERROR"), item
    assert item["message"].startswith(says) and item["fix"].startswith("remove the '/'"), item
    assert item["path"].endswith(where[0]) and item["line"] == where[1], item


def test_the_def_python_keeps_is_the_one_checked_and_an_async_def_is_refused(pytester: pytest.Pytester) -> None:
    """A later def run_kernel(x, y) replaces an earlier positional-only one (Python keeps the last): it passes
    preflight; an async def run_kernel is refused there (it returned a coroutine and failed later with another
    message: red-team)."""
    kernel = POSONLY_KERNEL.format(run="x, y, /") + "\n\ndef run_kernel(x, y):\n    y.copy_(x * 2)\n"
    pytester.makepyfile(kernel=kernel, ref=POSONLY_REF.format(ref="x, y, n"))
    args = ("--kopt-baseline", "kernel.py", "--kopt-ref", "ref.py", "--kopt-dims", "n=64", "--kopt-json", "r.json",
            "-k", "preflight", "-p", "no:cacheprovider")
    assert pytester.runpytest_subprocess(*args, timeout=600).ret == 0
    pytester.makepyfile(kernel=POSONLY_KERNEL.format(run="x, y").replace("def run_kernel", "async def run_kernel"))
    result = pytester.runpytest_subprocess(*args, timeout=600)
    (item,) = json.loads((pytester.path / "r.json").read_text())["items"]
    assert (result.ret, item["status"], item["line"]) == (4, "CONTRACT_ERROR", 9), item
    assert item["message"].startswith("run_kernel() is an async def"), item
