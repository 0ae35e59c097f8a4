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
    assert (wrong["path"], wrong["fix"]) == ("wrong.py", "fix the kernel; details shows where it is wrong (the "
                                                         "outputs and first bad indices)"), wrong
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
    # a return only on a path not taken: preflight cannot see it, the call's None is named
    result, items = correctness(pytester, RET_REF,
                                base=RET_KERNEL.format(outputs='["y"]', body="    if x.numel() < 0:\n        return x\n"
                                                                              "    y = 2 * x"))
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
#: a Triton kernel writing y = 2 * x, BLOCK elements per program; the Triton tests decorate and call it
SCALE_TRITON = '''\
import torch
import triton
import triton.language as tl

{decorator}@triton.jit
def scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, 2.0 * tl.load(x_ptr + offs, mask=mask), mask=mask)
'''
AUTOTUNED = SCALE_TRITON.format(decorator='''\
@triton.autotune(configs=[triton.Config({"BLOCK": b}, num_warps=w) for b, w in ((64, 1), (128, 2), (256, 4), (512, 4))],
                 key=["n"])
''') + '''

def setup(n, seed, device="cuda"):
    return {"inputs": {"x": torch.empty(n, device=device)}, "outputs": ["y"]}

def run_kernel(x):
    y = torch.empty_like(x)
    n = x.numel()
    scale_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, n)
    return y
'''


@needs_triton
def test_an_autotuned_triton_kernel_compiles_every_config_and_is_checked_on_each(
        pytester: pytest.Pytester) -> None:
    """A returning Triton kernel with ``@triton.autotune`` over 4 configs, on the CPU: preflight says what will
    happen, compile builds all 4 ahead of time and pins the first, correctness runs each config in turn under the
    interpreter (issue #41: it ran the first only, so a broken second config passed), SASS disassembles the pinned
    cubin only (one function, not four). Before, compile failed with the driver's "0 active drivers" and every
    later gate retried it."""
    pytester.makepyfile(ref=RET_REF.replace("1e-6", "1e-5"), k=AUTOTUNED)
    result, items = session(pytester, "--kopt-baseline", "k.py", "--kopt-ref", "ref.py", "--kopt-dims", "n=1000",
                            "--kopt-seeds", "1", "-k", "not timing and not ncu and not roofline")
    pre, comp, corr, sass = (items[f"k.py::{g}"] for g in ("preflight", "compile", "correctness[seed=1]", "sass"))
    assert "@triton.autotune scale_kernel: every config compiled ahead of time, correctness on each in turn" \
        in pre["summary"], pre
    assert pre["figures"]["tuned_scale_kernel"] == "autotune"
    assert comp["status"] == "PASSED" and "4 of 4 configs compiled, the first stated" in comp["summary"], comp
    assert comp["figures"]["autotune_scale_kernel"].startswith("BLOCK=64, num_warps=1"), comp["figures"]
    assert corr["status"] == "PASSED" and "with the config scale_kernel: BLOCK=64, num_warps=1" in corr["summary"]
    assert corr["summary"].endswith("; every config checked in turn (scale_kernel: 4)"), corr["summary"]
    assert corr["figures"]["configs_checked"] == 4
    assert sass["status"] == "PASSED" and sass["figures"]["functions"] == 1, sass
    assert result.ret == 0


BF16 = SCALE_TRITON.format(decorator="") + '''

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
    assert corr["fix"].startswith("run the session on a machine with an NVIDIA GPU"), corr
    assert items["k.py::compile"]["status"] == items["k.py::sass"]["status"] == "PASSED"
    assert result.ret == 0


def test_three_shapes_give_per_shape_items(pytester: pytest.Pytester) -> None:
    """ref.py's ``dims = [...]`` with three shapes and two seeds: six correctness items named by shape and seed,
    three timing items named by shape (``-k`` friendly), the report's ``shapes`` listing all three and ``dims``
    the first; every correctness item ran at its own shape (its summary says so)."""
    pytester.makepyfile(ref='dims = [{"n": 64}, {"n": 1000}, {"n": 4097}]\n' + RET_REF,
                        k=RET_KERNEL.format(outputs='["y"]', body="    return 2 * x"))
    result, items = session(pytester, "--kopt-baseline", "k.py", "--kopt-ref", "ref.py", "--kopt-seeds", "1,2")
    doc = json.loads((pytester.path / "r.json").read_text())
    assert doc["shapes"] == [{"n": 64}, {"n": 1000}, {"n": 4097}] and doc["dims"] == {"n": 64}
    for n in (64, 1000, 4097):
        for seed in (1, 2):
            item = items[f"k.py::correctness[n={n},seed={seed}]"]
            assert item["status"] == "PASSED" and item["summary"].startswith(f"n={n},seed={seed} "), item
        timing = items[f"k.py::timing[n={n}]"]
        assert timing["outcome"] == "skipped" and timing["blocked_by"] == "hardware", timing
        # a Python candidate's output was compared on the CPU: the fix says what a GPU adds, no more
        assert "NVIDIA GPU and its driver to time and profile" in timing["fix"], timing
        assert "nothing compares" not in timing["fix"], timing
    assert "k.py::timing" not in items and result.ret == 0


def test_repeated_dims_on_the_command_line_are_shapes_and_must_name_the_same_dims(pytester: pytest.Pytester) -> None:
    """``--kopt-dims n=64 --kopt-dims n=128``: two shapes; shapes naming different dims are a usage error (exit 4)
    naming both sets."""
    pytester.makepyfile(ref=RET_REF, k=RET_KERNEL.format(outputs='["y"]', body="    return 2 * x"))
    result, items = session(pytester, "--kopt-baseline", "k.py", "--kopt-ref", "ref.py", "--kopt-seeds", "1",
                            "--kopt-dims", "n=64", "--kopt-dims", "n=128", "-k", "correctness")
    assert {k for k in items if "correctness" in k} == {"k.py::correctness[n=64,seed=1]",
                                                          "k.py::correctness[n=128,seed=1]"}
    assert all(i["status"] == "PASSED" for i in items.values() if "correctness" in i["nodeid"])
    bad = pytester.runpytest_subprocess("--kopt-baseline", "k.py", "--kopt-ref", "ref.py", "--kopt-dims", "n=64",
                                        "--kopt-dims", "m=128", "-p", "no:cacheprovider")
    assert bad.ret == 4
    bad.stderr.fnmatch_lines(["*the shapes name different dims (m vs n)*"])


def test_a_malformed_benchmarks_list_fails_preflight(pytester: pytest.Pytester) -> None:
    """``benchmarks = [64, 128]`` (numbers, not dicts of dims): preflight CONTRACT_ERROR at ref.py's line with the
    form to write, exit 4."""
    pytester.makepyfile(ref="benchmarks = [64, 128]\n" + RET_REF,
                        k=RET_KERNEL.format(outputs='["y"]', body="    return 2 * x"))
    result, items = session(pytester, "--kopt-baseline", "k.py", "--kopt-ref", "ref.py", "--kopt-dims", "n=64",
                            "--kopt-seeds", "1")
    item = items["k.py::preflight"]
    assert item["status"] == "CONTRACT_ERROR" and item["line"] == 1, item
    assert "benchmarks = [64, 128] is not a list of shapes" in item["message"] and '"M": 1024' in item["fix"]
    assert result.ret == 4


KB_PROBLEM = '''\
import torch
import torch.nn as nn

batch, features_in, features_out = 16, 32, 8


class Model(nn.Module):
    """A linear layer followed by a ReLU."""

    def __init__(self, features_in, features_out):
        super().__init__()
        self.fc = nn.Linear(features_in, features_out)

    def forward(self, x):
        return torch.relu(self.fc(x))


def get_inputs():
    return [torch.randn(batch, features_in)]


def get_init_inputs():
    return [features_in, features_out]
'''
KB_NEW = '''\
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, features_in, features_out):
        super().__init__()
        self.fc = nn.Linear(features_in, {width})

    def forward(self, x):
        return {body}
'''


def test_a_kernelbench_problem_runs_as_is(pytester: pytest.Pytester) -> None:
    """A KernelBench-format problem (Model with an nn.Linear, get_inputs, get_init_inputs) and three ModelNew
    candidates, no --kopt-dims: the right one PASSES on both seeds (its weights are Model's, drawn from the same
    seed), one with the bias dropped is INCORRECT_NUMERICAL, one whose layer has another shape is judged as
    KernelBench judges it (INCORRECT_SHAPE: its output has another shape), its details naming the parameters it was
    not given and both shapes (before: a CONTRACT_ERROR, exit 4, for what KernelBench runs)."""
    pytester.makepyfile(problem=KB_PROBLEM,
                        new=KB_NEW.format(width="features_out",
                                          body="torch.clamp_min(x @ self.fc.weight.t() + self.fc.bias, 0)"),
                        nobias=KB_NEW.format(width="features_out", body="torch.clamp_min(x @ self.fc.weight.t(), 0)"),
                        wide=KB_NEW.format(width="2 * features_out", body="torch.relu(self.fc(x))"))
    result, items = session(pytester, "--kopt-baseline", "new.py", "--kopt-candidate", "nobias.py",
                            "--kopt-candidate", "wide.py", "--kopt-ref", "problem.py", "--kopt-seeds", "1,2")
    assert "KernelBench (Model/ModelNew) format, run as is" in items["new.py::preflight"]["summary"]
    for seed in (1, 2):
        assert items[f"new.py::correctness[seed={seed}]"]["status"] == "PASSED", items[f"new.py::correctness[seed={seed}]"]
    assert items["nobias.py::correctness[seed=1]"]["status"] == "INCORRECT_NUMERICAL"
    wide = items["wide.py::correctness[seed=1]"]
    assert wide["status"] == "INCORRECT_SHAPE", wide
    assert wide["message"].startswith("seed=1 (the problem's get_inputs()): output out has shape [16, 16], the "
                                      "reference [16, 8]"), wide["message"]
    assert ("0 of its 2 parameters and buffers were copied from Model by name; its own: fc.weight [16, 32] (Model's "
            "is [8, 32]), fc.bias [16] (Model's is [8])") in wide["details"], wide["details"]
    assert result.ret == 2  # both fail at correctness: the first failing item of the earliest gate decides


GPUMODE_REFERENCE = '''\
import torch


def generate_input(size: int, seed: int):
    gen = torch.Generator(device="{device}").manual_seed(seed)
    a = torch.randn(size, size, generator=gen, device="{device}")
    return a, torch.empty(size, size, device="{device}")


def ref_kernel(data):
    a, out = data
    out.copy_(torch.tril(a) * 2)
    return out
'''
GPUMODE_TASK = """\
tests:
  - {size: 8, seed: 101}
  - {size: 33, seed: 102}
  - {size: 64, seed: 103}
benchmarks:
  - {size: 1024, seed: 201}
  - {size: 2048, seed: 202}
"""
GPUMODE_SUBMISSION = '''\
import torch


def custom_kernel(data):
    a, out = data
    {body}
    return out
'''


def test_a_gpu_mode_problem_runs_on_every_test_shape(pytester: pytest.Pytester) -> None:
    """A GPU MODE-format problem (reference.py with generate_input/ref_kernel whose data carries the output
    buffer, task.yml with 3 test and 2 benchmark shapes) and a custom_kernel submission, no --kopt-dims: every
    seed on every test shape (seeds from kopt, not task.yml), one timing item per benchmark shape; a submission
    that forgets the factor 2 is INCORRECT_NUMERICAL on each shape."""
    pytester.makepyfile(reference=GPUMODE_REFERENCE.format(device="cpu"),
                        submission=GPUMODE_SUBMISSION.format(body="out.copy_(torch.tril(a) + torch.tril(a))"),
                        wrong=GPUMODE_SUBMISSION.format(body="out.copy_(torch.tril(a))"))
    (pytester.path / "task.yml").write_text(GPUMODE_TASK)
    result, items = session(pytester, "--kopt-baseline", "submission.py", "--kopt-candidate", "wrong.py",
                            "--kopt-ref", "reference.py", "--kopt-seeds", "1")
    doc = json.loads((pytester.path / "r.json").read_text())
    assert doc["shapes"] == [{"size": 8}, {"size": 33}, {"size": 64}]
    for size in (8, 33, 64):
        good = items[f"submission.py::correctness[size={size},seed=1]"]
        assert good["status"] == "PASSED", good
        assert items[f"wrong.py::correctness[size={size},seed=1]"]["status"] == "INCORRECT_NUMERICAL"
    assert {k.split("::")[1] for k in items if k.startswith("submission.py::timing")} == {"timing[size=1024]",
                                                                                       "timing[size=2048]"}
    assert result.ret == 2


def test_a_gpu_mode_problem_that_hard_codes_cuda_is_one_clear_skip(pytester: pytest.Pytester) -> None:
    """generate_input with device="cuda" on a machine without a GPU: the plan item is skipped, blocked by
    hardware with the reason (the problem's code asks for CUDA), and so is everything after it; nothing fails."""
    pytester.makepyfile(reference=GPUMODE_REFERENCE.format(device="cuda"),
                        submission=GPUMODE_SUBMISSION.format(body="out.copy_(torch.tril(a) * 2)"))
    (pytester.path / "task.yml").write_text(GPUMODE_TASK)
    result, items = session(pytester, "--kopt-baseline", "submission.py", "--kopt-ref", "reference.py",
                            "--kopt-seeds", "1")
    plan = items["submission.py::plan"]
    assert (plan["outcome"], plan["blocked_by"]) == ("skipped", "hardware"), plan
    assert plan["message"] == ('blocked by hardware: no GPU, and reference.py: generate_input() asks for CUDA '
                               '(device="cuda" in the problem\'s code)'), plan
    assert "in generate_input" in plan["details"], plan  # the error itself, where the problem's code asked
    assert not [i for i in items.values() if i["outcome"] == "failed"]
    assert result.ret == 0


ROWS = '''\
import torch
def setup(m, n, seed, device="cuda"):
    return {{"inputs": {{"x": torch.empty(m, n, device=device)}}, "outputs": {outputs}}}
{deco}
def run_kernel(x):
    return {body}
'''


@pytest.mark.parametrize(("ref", "kernel", "status", "words"), [
    # a name of the candidate's choosing must not pick a looser tolerance (before: PASSED at the default 1e-3)
    ('atol = {"y": 1e-6}\nrtol = {"y": 1e-6}\ndef reference(x, **_):\n    return x.sin()\n',
     ROWS.format(outputs='["z"]', deco="", body="x.sin() + 5e-4"), "CONTRACT_ERROR", "output 'z' has no atol"),
    # ... nor judge one output under another's name and tolerance (before: PASSED under var's 0.1)
    ('outputs = ["mean", "var"]\natol = {"mean": 1e-6, "var": 0.1}\nrtol = {"mean": 1e-6, "var": 0.1}\n'
     'def reference(x, **_):\n    return x.mean(-1), x.var(-1)\n',
     ROWS.format(outputs='["var", "mean"]', deco="", body="x.mean(-1) + 0.05, x.var(-1)"), "INCORRECT_NUMERICAL",
     "output differs"),
    # a tuple in the same order as ref.py's outputs is right (before: named in sorted order, INCORRECT)
    ('outputs = ["var", "mean"]\ndef reference(x, **_):\n    return x.var(-1), x.mean(-1)\n',
     ROWS.format(outputs='["var", "mean"]', deco="", body="x.var(-1), x.mean(-1)"), "PASSED", ""),
    # a returned view of the input is right (before: its memory, the input's, was poisoned: NONDETERMINISTIC)
    ("def reference(x, **_):\n    return x.t()\n", ROWS.format(outputs='["y"]', deco="", body="x.t()"), "PASSED", ""),
    # a result made under inference_mode is right (before: RUNTIME_ERROR from the harness's own poisoning)
    ("def reference(x, **_):\n    return torch.relu(x)\nimport torch\n",
     ROWS.format(outputs='["y"]', deco="@torch.inference_mode()", body="torch.relu(x)"), "PASSED", ""),
    # outputs named differently are one clear contract error (before: "the candidate's process returned no ...")
    ('def reference(x, **_):\n    return {"y": x * 2, "z": x * 3}\n',
     ROWS.format(outputs='["y"]', deco="", body="x * 2"), "CONTRACT_ERROR",
     "the candidate's outputs are y but the reference's are y, z"),
])
def test_returned_outputs_are_named_by_the_reference(pytester: pytest.Pytester, ref: str, kernel: str, status: str,
                                                     words: str) -> None:
    """The red team's cases: the reference names its outputs (dict keys, ref.py's outputs = [...], else out0...),
    per-output tolerances must name every output, and the harness's poisoning of returned memory leaves inputs and
    inference tensors alone."""
    pytester.makepyfile(ref=ref, k=kernel)
    result, items = session(pytester, "--kopt-baseline", "k.py", "--kopt-ref", "ref.py", "--kopt-dims", "m=8,n=16",
                            "--kopt-seeds", "1", "-k", "correctness or plan")
    item = items["k.py::correctness[seed=1]"]
    assert item["status"] == status and words in (item["message"] or ""), item


def test_an_empty_second_shape_is_a_contract_error(pytester: pytest.Pytester) -> None:
    """``--kopt-dims n=4 --kopt-dims n=0``: the n=0 items are CONTRACT_ERROR (no elements), as a single n=0 is at
    plan; before, a wrong kernel PASSED there with nothing compared."""
    pytester.makepyfile(ref=RET_REF, k=RET_KERNEL.format(outputs='["y"]', body="    return x.cos()"))
    result, items = session(pytester, "--kopt-baseline", "k.py", "--kopt-ref", "ref.py", "--kopt-dims", "n=4",
                            "--kopt-dims", "n=0", "--kopt-seeds", "1", "-k", "correctness")
    assert items["k.py::correctness[n=4,seed=1]"]["status"] == "INCORRECT_NUMERICAL"
    empty = items["k.py::correctness[n=0,seed=1]"]
    assert empty["status"] == "CONTRACT_ERROR" and "has no elements" in empty["message"], empty


def test_gpu_mode_nested_data_and_a_zeroed_output_buffer(pytester: pytest.Pytester) -> None:
    """GPU MODE data as (x, {"w": w}, {"scale": 2.0}) with a zeroed output buffer that the kernel writes only in
    part (its lower triangle, relying on the zeros): rebuilt for every call and regenerated before the second, so
    the honest kernel PASSES (before: CONTRACT_ERROR blaming the reference, then NONDETERMINISTIC)."""
    pytester.makepyfile(reference='''\
import torch
def generate_input(size: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(size, size, generator=g), torch.randn(size, generator=g)
    return x, {"w": w}, {"scale": 2.0}, torch.zeros(size, size)
def ref_kernel(data):
    x, p, c, out = data
    out.copy_(torch.tril(x * p["w"]) * c["scale"])
    return out
''', submission='''\
import torch
def custom_kernel(data):
    x, p, c, out = data
    n = x.shape[0]
    rows, cols = torch.tril_indices(n, n)
    out[rows, cols] = (x * p["w"])[rows, cols] * c["scale"]
    return out
''')
    (pytester.path / "task.yml").write_text("tests:\n  - {size: 16, seed: 1}\n  - {size: 33, seed: 2}\n")
    result, items = session(pytester, "--kopt-baseline", "submission.py", "--kopt-ref", "reference.py",
                            "--kopt-seeds", "1", "-k", "correctness")
    for size in (16, 33):
        item = items[f"submission.py::correctness[size={size},seed=1]"]
        assert item["status"] == "PASSED", item


@pytest.mark.gpu
def test_timing_reports_the_kernels_own_time_beside_the_events(pytester: pytest.Pytester) -> None:
    """On a GPU: bench.json's kernel_time (CUPTI activity records, through cupti-python where it is installed, else
    torch's profiler) is the span of the call's own kernels, one kernel per call here, above zero and not above the
    event median (which also holds the launch gap and the flush's tail); it names the client that recorded it."""
    pytester.makepyfile(ref=RET_REF, k=RET_KERNEL.format(outputs='["y"]', body="    return 2 * x"))
    result, items = session(pytester, "--kopt-baseline", "k.py", "--kopt-ref", "ref.py", "--kopt-dims",
                            "n=16777216", "--kopt-seeds", "1", "-k", "correctness or timing")
    timing = items["k.py::timing"]
    assert timing["status"] == "PASSED", timing
    bench = json.loads(next(pytester.path.glob(".kopt/**/k.py/bench.json")).read_text())
    kt = bench["kernel_time"]
    assert kt["method"] == "cupti" and kt["kernels_per_call"] == [1] and kt["empty_calls"] == 0, kt
    assert 0 < kt["median_us"] <= bench["median_ms"] * 1e3 * 1.02, (kt, bench["median_ms"])
    assert "kernel-only (CUPTI)" in timing["summary"] and kt["split"] == "launch"
    import importlib.util

    expected = "cupti-python" if importlib.util.find_spec("cupti") else "torch.profiler"
    assert kt["backend"] == expected, kt


@pytest.mark.gpu
def test_kernel_time_counts_a_call_that_launches_the_flushs_own_kernel(pytester: pytest.Pytester) -> None:
    """On a GPU: the L2 flush is a torch.sum; a call that launches one too (here beside its multiply) keeps both of
    its kernels in its kernel-only time. Told apart by name, every such call read as flushes: 'no kernel of the call
    was recorded' (sum_4M in benchmarks/timing_fidelity.py on the H200, 2026-12-02)."""
    body = "    s = torch.sum(x, dim=0)\n    return 2 * x"
    pytester.makepyfile(ref=RET_REF, k=RET_KERNEL.format(outputs='["y"]', body=body))
    result, items = session(pytester, "--kopt-baseline", "k.py", "--kopt-ref", "ref.py", "--kopt-dims",
                            "n=4194304", "--kopt-seeds", "1", "-k", "correctness or timing")
    assert items["k.py::timing"]["status"] == "PASSED", items["k.py::timing"]
    kt = json.loads(next(pytester.path.glob(".kopt/**/k.py/bench.json")).read_text())["kernel_time"]
    # the sum, the multiply and the harness's copy of the returned tensor into the output buffer: 3 on an H200
    assert kt["split"] == "launch" and len(kt["kernels_per_call"]) == 1 and kt["kernels_per_call"][0] >= 2, kt
    assert any("reduce" in name for name in kt["kernels"]) and kt["empty_calls"] == 0 and kt["median_us"] > 0, kt


def test_kernelbench_sizes_are_set_by_dims_named_like_its_globals(pytester: pytest.Pytester) -> None:
    """A KernelBench problem's sizes are module globals (here a batch far too large for a CPU run): --kopt-dims
    batch_size=4 sets them for get_inputs and get_init_inputs in every process, and no "typo?" warning names them
    (before, the dims were ignored and warned about, and the run timed out)."""
    big = KB_PROBLEM.replace("batch, features_in, features_out = 16, 32, 8",
                             "batch_size, features_in, features_out = 10_000_000, 32, 8")
    pytester.makepyfile(problem=big.replace("torch.randn(batch, features_in)", "torch.randn(batch_size, features_in)"),
                        new=KB_NEW.format(width="features_out", body="torch.relu(self.fc(x))"))
    result, items = session(pytester, "--kopt-baseline", "new.py", "--kopt-ref", "problem.py", "--kopt-dims",
                            "batch_size=4", "--kopt-seeds", "1", "-k", "correctness or preflight")
    assert items["new.py::correctness[seed=1]"]["status"] == "PASSED"
    assert "typo" not in (items["new.py::preflight"]["summary"] or "")


def test_inplace_naming_no_output_is_a_contract_error(pytester: pytest.Pytester) -> None:
    """``inplace = ["z"]`` where the candidate has no output z: a CONTRACT_ERROR naming z and the buffers (before,
    "reference() left output 'x' unwritten"), and a failed correctness item carries its figures and record path."""
    pytester.makepyfile(ref=INPLACE_REF.replace('["x"]', '["z"]'), k=INPLACE_KERNEL.format(body="x.clamp_(min=0)"),
                        wrong=INPLACE_KERNEL.format(body="x.clamp_(max=0)"))
    result, items = session(pytester, "--kopt-baseline", "k.py", "--kopt-ref", "ref.py", "--kopt-dims", "n=64",
                            "--kopt-seeds", "1", "-k", "correctness")
    item = items["k.py::correctness[seed=1]"]
    assert item["status"] == "CONTRACT_ERROR" and "names 'z', which is no output of the candidate's" in item["message"]
    pytester.makepyfile(ref=INPLACE_REF)
    result, items = session(pytester, "--kopt-baseline", "k.py", "--kopt-candidate", "wrong.py", "--kopt-ref",
                            "ref.py", "--kopt-dims", "n=64", "--kopt-seeds", "1", "-k", "correctness")
    wrong = items["wrong.py::correctness[seed=1]"]
    assert wrong["status"] == "INCORRECT_NUMERICAL" and wrong["figures"]["mismatched"] > 0, wrong
    assert wrong["figures"]["seed"] == 1 and wrong["figures"]["record"].endswith("correctness/seed=1.json")


def test_a_run_kernel_that_cannot_return_its_output_fails_preflight(pytester: pytest.Pytester) -> None:
    """setup() promises a returned y and run_kernel has no return with a value: preflight CONTRACT_ERROR at
    run_kernel's line, once, before any seed runs (before: the same error on every seed at correctness)."""
    pytester.makepyfile(ref=RET_REF, k=RET_KERNEL.format(outputs='["y"]', body="    y = 2 * x"))
    result, items = session(pytester, "--kopt-baseline", "k.py", "--kopt-ref", "ref.py", "--kopt-dims", "n=64",
                            "--kopt-seeds", "1")
    pre = items["k.py::preflight"]
    assert pre["status"] == "CONTRACT_ERROR" and pre["line"] == 5, pre
    assert "run_kernel() has no return with a value" in pre["message"] and pre["fix"].startswith("return y")
    assert items["k.py::correctness[seed=1]"]["blocked_by"] == "preflight" and result.ret == 4
