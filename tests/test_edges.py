"""Coverage beyond the given dims: edge shapes derived from the dims (the sizes, their cost, the constraints that
exclude them), dtypes a reference lists, and whole sessions on the CPU through the ``--kopt-json`` report: a
tail-dropping Triton kernel caught with no extra shape in its reference, passed once the reference declares the
multiple it needs, its failing edge shape shrunk; a two-dtype reference checked twice. Every kernel here is written
for these tests."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_kopt.gates.claims import setup_dtype_default
from pytest_kopt.gates.edges import (derive, edge_plan, fit, parse_constraints, past_pow2, small_prime,
                                     unaligned, violation)

needs_triton = pytest.mark.skipif(
    __import__("importlib.util").util.find_spec("triton") is None, reason="triton not installed")

REF = """\
atol = 1e-6
rtol = 1e-6
{extra}

def shapes(n):
    return {{"x": ((n,), "float32"), "y": ((n,), "float32")}}

def reference(x, y, **_):
    y.copy_(2 * x)
"""
#: y = 2x over blocks of 16, the grid rounded down: the tail past the last full block is never written.
TAIL = """\
import torch
import triton
import triton.language as tl

BLOCK = 16


@triton.jit
def double(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=m) * 2, mask=m)


def setup(n, seed, device="cuda"):
    x = torch.empty(n, device=device)
    return {{"inputs": {{"x": x, "y": torch.empty_like(x)}}, "outputs": ["y"]}}


def run_kernel(x, y):
    n = x.numel()
    double[({grid},)](x, y, n, BLOCK=BLOCK)
"""


def session(pytester: pytest.Pytester, kernel: str, ref: str, *args: str) -> tuple[int, dict]:
    """A CPU session of ``kernel`` against ``ref`` at n=64 with two seeds; (exit code, --kopt-json report)."""
    pytester.makepyfile(kernel=kernel, ref=ref)
    result = pytester.runpytest_subprocess("--kopt-baseline", "kernel.py", "--kopt-ref", "ref.py", "--kopt-dims",
                                           "n=64", "--kopt-seeds", "3,5", "--kopt-json", "r.json", "-p",
                                           "no:cacheprovider", "-k", "not sass", *args, timeout=600)
    return result.ret, json.loads((pytester.path / "r.json").read_text())


def correctness(report: dict) -> dict[str, dict]:
    """The correctness items by case."""
    return {i["case"]: i for i in report["items"] if i["gate"] == "correctness"}


def test_sizes_of_each_category() -> None:
    """1, the largest prime up to 37, a multiple of 8 but of no 16, the largest power of two below plus one."""
    assert [small_prime(d) for d in (1, 2, 4, 36, 64, 4096)] == [1, 2, 3, 31, 37, 37]
    assert [unaligned(d) for d in (4096, 64, 1000, 1)] == [4088, 56, 1000, 8]
    assert all(unaligned(d) % 8 == 0 and unaligned(d) % 16 for d in range(1, 5000, 7))
    assert [past_pow2(d) for d in (4096, 1000, 65, 3, 2)] == [2049, 513, 65, 3, 2]


def test_a_gemm_gets_five_cheap_cases_one_size_near_the_given_dims_in_each() -> None:
    """M=N=K=4096: ones, primes, then one lead size per case (4088, 2049, 4097) with the others at 37, so no case
    costs more than 1/1000 of the given dims' M*N*K and every size is near its given value in one case."""
    dims = {"M": 4096, "N": 4096, "K": 4096}
    checked, excluded, fitted = derive(dims, ("M", "N", "K"), {})
    assert excluded == [] and fitted == []
    assert [(c, tuple(d.values())) for c, d in checked] == [
        ("ones", (1, 1, 1)), ("prime", (37, 37, 37)), ("unaligned", (4088, 37, 37)), ("pow2+1", (37, 2049, 37)),
        ("near", (37, 37, 4097))]
    assert max(d["M"] * d["N"] * d["K"] for _, d in checked) < 4096 ** 3 / 1000


def test_floats_and_fixed_sizes_stay_and_repeats_are_dropped() -> None:
    """eps is no size; a case equal to a listed shape (an extra_dims entry) or the given dims is not checked again."""
    dims = {"M": 64, "N": 1000, "eps": 1e-5}
    checked, _, _ = derive(dims, ("M", "N"), {}, skip=[{"M": 1, "N": 1, "eps": 1e-5}])
    assert [c for c, _ in checked] == ["prime", "unaligned", "pow2+1", "near"]
    assert all(d["eps"] == 1e-5 for _, d in checked)
    one, _, _ = derive({"n": 1}, ("n",), {})  # 8 (unaligned) would be 8x the given size: above the plan
    assert one == [("near", {"n": 2})]


def test_a_shape_that_breaks_a_constraint_is_fitted_into_it_and_says_from_what() -> None:
    """A tiled kernel's M multiple of 128 and K at least 16: each derived shape moves to the nearest sizes allowed
    (down, near's 257 too: 384 would be 1.5x the given M, past the memory the plan checked for a buffer spanning M
    alone; 1 goes to the smallest allowed), a fitted shape that repeats one already
    checked is excluded with what it became."""
    checked, excluded, fitted = derive({"M": 256, "K": 128}, ("M", "K"), {"M": {"multiple_of": 128}, "K": {"min": 16}})
    assert checked == [("ones", {"M": 128, "K": 16}), ("prime", {"M": 128, "K": 37}),
                       ("pow2+1", {"M": 128, "K": 65}), ("near", {"M": 256, "K": 37})]
    assert fitted[0] == ("M=128,K=16", "ones M=1,K=1 fitted to ref.py constraints (M 1 -> 128, K 1 -> 16)")
    assert fitted[3] == ("M=256,K=37", "near M=257,K=37 fitted to ref.py constraints (M 257 -> 256)")
    assert excluded == [("M=248,K=37", "M=248 is not a multiple of 128 (ref.py constraints); fitted to them it is "
                                       "M=128,K=37, already checked")]
    assert violation("M", 4096, {"max": 1024}) == "M=4096 is above its max 1024"


@pytest.mark.parametrize(("v", "rule", "up", "want"), [
    (1, {"multiple_of": 128}, False, 128), (4088, {"multiple_of": 128}, False, 3968),
    (4097, {"multiple_of": 8}, True, 4104), (5, {"min": 16, "multiple_of": 10}, False, 20),
    (900, {"max": 100, "multiple_of": 30}, False, 90), (7, {"min": 40, "max": 50, "multiple_of": 64}, False, None),
    (7, "fixed", False, 7),
])
def test_fit_moves_a_size_to_the_nearest_one_its_constraint_allows(v: int, rule: Any, up: bool, want: Any) -> None:
    assert fit(v, rule, up) == want


def test_a_1d_kernel_specialised_to_a_multiple_is_checked_at_other_multiples() -> None:
    """n multiple of 256 at n=4096: checked at 256, 3840 and 2048; near's 4097 fitted back to the given size."""
    checked, excluded, _ = derive({"n": 4096}, ("n",), {"n": {"multiple_of": 256}})
    assert [d["n"] for _, d in checked] == [256, 3840, 2048]
    assert [why.rsplit(", ", 1)[-1] for _, why in excluded] == ["already checked", "the given dims"]


@pytest.mark.parametrize("value, problem", [
    ({"Q": {"min": 1}}, "constraints names 'Q', which is not a dim"),
    ({"n": {"multiple": 16}}, "has 'multiple'; the keys are multiple_of, min, max"),
    ({"n": {"multiple_of": 0}}, "each value must be an integer >= 1"),
    ({"n": "constant"}, "is neither \"fixed\" nor a dict"),
    ({"n": {"multiple_of": 128}}, "the given dims break constraints['n']: n=64 is not a multiple of 128"),
    ({"n": {"min": 8, "max": 4}}, "min is above max"),
    (["n"], "is not a dict of dim name"),
])
def test_constraint_literals_are_checked(value: object, problem: str) -> None:
    _, problems = parse_constraints(value, {"n": 64})
    assert len(problems) == 1 and problem in problems[0], problems


def _ctx(dims: dict, constants: dict, taken: frozenset | None = None, **settings: object) -> SimpleNamespace:
    """What :func:`edge_plan` reads of a gate context, for a kopt reference with ``constants``."""
    s = SimpleNamespace(**{"dims": dims, "edge_shapes": "auto", "loop_mode": None, **settings})
    kind = SimpleNamespace(runtime_dims=lambda ctx: taken)
    return SimpleNamespace(settings=s, problem_format="kopt", ref_constant=constants.get, kind=kind,
                           shapes=(dims,), extra_dims=[])


def test_the_plan_says_why_there_are_none() -> None:
    """Off, a field format, a loop branch session without constraints, a size the kernel is built for."""
    dims = {"n": 64}
    assert edge_plan(_ctx(dims, {}, edge_shapes="off")).note == "off (--kopt-edge-shapes off)"
    field = _ctx(dims, {})
    field.problem_format = "kernelbench"
    assert "KernelBench problem is checked at its own fixed shapes" in edge_plan(field).note
    assert "loop branch session" in edge_plan(_ctx(dims, {}, loop_mode="run")).note
    assert len(edge_plan(_ctx(dims, {"constraints": {}}, loop_mode="run")).checked) == 5
    assert edge_plan(_ctx(dims, {}, frozenset())).checked == ()  # a .cu whose solve() takes no n
    assert edge_plan(_ctx(dims, {"constraints": {"n": "fixed"}})).checked == ()
    plan = edge_plan(_ctx({"M": 64, "N": 8}, {}, frozenset({"M"})))  # N compiled in: M alone varies
    assert {d["N"] for _, d in plan.checked} == {8} and plan.sizes == ("M",)


def test_setup_dtype_default(tmp_path: Path) -> None:
    k = tmp_path / "k.py"
    for src, want in (("def setup(n, seed, dtype='float16'): ...", "float16"),
                      ("def setup(n, seed, *, dtype='bfloat16', device='cuda'): ...", "bfloat16"),
                      ("def setup(n, seed, **kw): ...", "**kwargs"), ("def setup(n, seed): ...", None),
                      ("def setup(n, dtype): ...", "<no default>")):
        k.write_text(src)
        assert setup_dtype_default(k) == want, src


@needs_triton
def test_a_tail_dropping_kernel_is_caught_at_edge_shapes_and_shrunk(pytester: pytest.Pytester) -> None:
    """The grid rounds down (n // 16, at least 1): n=64 and n=1 pass, every other edge shape leaves its tail
    unwritten; the first failure (n=37) names its shape and shrinks to n=18, which the later ones point at."""
    code, report = session(pytester, TAIL.format(grid="max(1, n // BLOCK)"), REF.format(extra=""))
    assert code == 2
    items = correctness(report)
    assert {c: i["status"] for c, i in items.items()} == {
        "seed=3": "PASSED", "seed=5": "PASSED", "n=1": "PASSED", "n=37": "UNWRITTEN", "n=56": "UNWRITTEN",
        "n=33": "UNWRITTEN", "n=65": "UNWRITTEN"}
    first = items["n=37"]
    assert first["message"].startswith("edge shape n=37 (prime): ")
    assert first["figures"]["edge_shape"] == "prime" and first["figures"]["shrunk"] == "n=18, all ones"
    assert "shrunk to n=18, all ones" in first["message"]
    assert "shrunk earlier from n=37" in items["n=65"]["message"]
    (kernel,) = report["kernels"]
    # the shapes checked are those that passed; the note says how many of the planned did
    assert kernel["edge_checked"] == ["n=1"] and kernel["edge_excluded"] == []
    assert kernel["edge_shapes"] == "5 planned (sizes n); 1 passed"
    edges = json.loads(next((pytester.path / ".kopt").rglob("edges.json")).read_text())
    assert [c["category"] for c in edges["checked"]] == ["ones", "prime", "unaligned", "pow2+1", "near"]


@needs_triton
def test_the_same_kernel_passes_once_its_reference_declares_the_multiple(pytester: pytest.Pytester) -> None:
    """grid n // 16 (none at n=1): with constraints = {"n": {"multiple_of": 16}} the derived shapes move to
    multiples of 16 (16, 32, 48), which it handles, each with where it came from in the report; two that fit back
    onto a shape already checked are excluded with their reason; with --kopt-edge-shapes off only the given dims
    are checked."""
    code, report = session(pytester, TAIL.format(grid="n // BLOCK"),
                           REF.format(extra='constraints = {"n": {"multiple_of": 16}}'))
    assert code == 0, report["items"]
    assert set(correctness(report)) == {"seed=3", "seed=5", "n=16", "n=32", "n=48"}
    (kernel,) = report["kernels"]
    assert kernel["status"] == "PASSED" and kernel["edge_checked"] == ["n=16", "n=32", "n=48"]
    assert kernel["edge_shapes"] == ("3 checked (3 fitted to the reference's constraints), 2 excluded by "
                                     "constraints (sizes n)")
    assert kernel["edge_fitted"][0] == {"shape": "n=16",
                                        "fitted": "ones n=1 fitted to ref.py constraints (n 1 -> 16)"}
    assert kernel["edge_excluded"][0] == {"shape": "n=33", "reason": "n=33 is not a multiple of 16 (ref.py "
                                          "constraints); fitted to them it is n=32, already checked"}
    code, report = session(pytester, TAIL.format(grid="n // BLOCK"), REF.format(extra=""), "--kopt-edge-shapes",
                           "off")
    assert code == 0 and set(correctness(report)) == {"seed=3", "seed=5"}
    assert report["kernels"][0]["edge_shapes"] == "off (--kopt-edge-shapes off)"


DTYPE_REF = """\
import torch
atol = 1e-6
rtol = 1e-6
dtypes = ["float32", "float16"]


def shapes(n, dtype="float32"):
    return {"x": ((n,), dtype), "y": ((n,), dtype)}


def reference(x, y, **_):
    y.copy_((2 * x.double()).to(y.dtype))
"""
DTYPE_KERNEL = """\
import torch


def setup(n, seed, device="cpu", dtype={default!r}):
    x = torch.empty(n, device=device, dtype=getattr(torch, {made}))
    return {{"inputs": {{"x": x, "y": torch.empty_like(x)}}, "outputs": ["y"]}}


def run_kernel(x, y):
    y.copy_(x * 2)
"""


def test_a_two_dtype_reference_is_checked_in_each(pytester: pytest.Pytester) -> None:
    """dtypes = ["float32", "float16"]: the seeds in float32, one more case in float16 (its dtype in the case's dims,
    kopt's float16 tolerance); a setup() that ignores its dtype fails that case, so the dtype did reach it."""
    code, report = session(pytester, DTYPE_KERNEL.format(default="float32", made="dtype"), DTYPE_REF,
                           "--kopt-edge-shapes", "off")
    assert code == 0, [i["message"] for i in report["items"] if i["message"]]
    items = correctness(report)
    assert list(items) == ["seed=3", "seed=5", "n=64,dtype=float16"]
    assert [i["figures"]["dtype"] for i in items.values()] == ["float32", "float32", "float16"]
    assert items["seed=3"]["figures"]["atol"] == 1e-6 and items["n=64,dtype=float16"]["figures"]["atol"] == 1e-3
    assert report["kernels"][0]["dtypes_checked"] == ["float32", "float16"]
    code, report = session(pytester, DTYPE_KERNEL.format(default="float32", made='"float32"'), DTYPE_REF,
                           "--kopt-edge-shapes", "off")
    assert code != 0
    bad = correctness(report)["n=64,dtype=float16"]
    assert bad["outcome"] == "failed" and "dtype float16: " in bad["message"], bad
    assert all(i["outcome"] == "passed" for c, i in correctness(report).items() if c.startswith("seed"))


TRITON_DTYPE_KERNEL = """\
import torch
import triton
import triton.language as tl


@triton.jit
def twice(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, 2 * tl.load(x_ptr + offs, mask=mask), mask=mask)


def setup(n, seed, device="cpu", dtype="float32"):
    x = torch.empty(n, device=device, dtype=getattr(torch, dtype))
    return {"inputs": {"x": x, "y": torch.empty_like(x)}, "outputs": ["y"]}


def run_kernel(x, y):
    twice[(triton.cdiv(x.numel(), 64),)](x, y, x.numel(), BLOCK=64)
"""


def test_a_case_the_interpreter_cannot_judge_blocks_only_itself(pytester: pytest.Pytester) -> None:
    """A Triton kernel claiming float32 and bfloat16, on a CPU: the bfloat16 case skips (Triton's interpreter does
    not compute bfloat16 right), the float32 seeds pass, and the timing item says its own reason (no GPU), not the
    bfloat16 case's."""
    pytest.importorskip("triton")
    ref = DTYPE_REF.replace('["float32", "float16"]', '["float32", "bfloat16"]')
    code, report = session(pytester, TRITON_DTYPE_KERNEL, ref, "--kopt-edge-shapes", "off")
    items = correctness(report)
    assert [(c, i["outcome"]) for c, i in items.items()] == [("seed=3", "passed"), ("seed=5", "passed"),
                                                             ("n=64,dtype=bfloat16", "skipped")], items
    assert "does not compute bfloat16 right" in items["n=64,dtype=bfloat16"]["message"]
    timing = next(i for i in report["items"] if i["gate"] == "timing")
    assert timing["outcome"] == "skipped" and timing["blocked_by"] == "hardware", timing
    assert "bfloat16" not in timing["message"] and "no GPU" in timing["message"], timing["message"]
    assert code == 0


def test_dtype_claims_are_checked_at_preflight(pytester: pytest.Pytester) -> None:
    """A setup() whose dtype default is not the first listed dtype (the one timed) is a contract error naming the
    kernel and the fix."""
    code, report = session(pytester, DTYPE_KERNEL.format(default="float16", made="dtype"), DTYPE_REF,
                           "-k", "preflight")
    (item,) = report["items"]
    assert code == 4 and item["status"] == "CONTRACT_ERROR", item
    assert "setup()'s dtype defaults to 'float16'" in item["message"] and "dtype='float32'" in item["fix"]


TAIL_CU = """\
#include <cuda_runtime.h>
__global__ void twice(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i];
}
extern "C" void solve(const float* x, float* y, int n) {
    if (n >= 256) twice<<<n / 256, 256>>>(x, y, n);  // the tail past the last full block is never written
}
"""


@pytest.mark.gpu
@pytest.mark.parametrize("declared", [False, True])
def test_a_tail_dropping_cu_on_the_gpu(pytester: pytest.Pytester, declared: bool) -> None:
    """A .cu whose grid is n / 256, at n=4096 (a multiple): caught at its edge shapes (n=1 is the first: nothing
    written), and passed once the reference declares n a multiple of 256 (then checked at n=256, 3840, 2048)."""
    pytester.makefile(".cu", kernel=TAIL_CU)
    pytester.makepyfile(ref=REF.format(extra='constraints = {"n": {"multiple_of": 256}}' if declared else ""))
    result = pytester.runpytest_subprocess("--kopt-baseline", "kernel.cu", "--kopt-ref", "ref.py", "--kopt-dims",
                                           "n=4096", "--kopt-seeds", "3", "--kopt-json", "r.json", "-p",
                                           "no:cacheprovider", "-k", "correctness", timeout=600)
    report = json.loads((pytester.path / "r.json").read_text())
    items = correctness(report)
    if declared:
        assert result.ret == 0 and list(items) == ["seed=3", "n=256", "n=3840", "n=2048"], items
        assert len(report["kernels"][0]["edge_excluded"]) == 2
    else:
        assert result.ret == 2
        assert list(items) == ["seed=3", "n=1", "n=37", "n=4088", "n=2049", "n=4097"]
        assert items["seed=3"]["status"] == "PASSED"
        assert all(items[c]["status"] == "UNWRITTEN" for c in ("n=1", "n=37", "n=4088", "n=2049", "n=4097"))
        assert items["n=4097"]["message"].startswith("edge shape n=4097 (near): ")


PLAIN_REF = """\
import torch
atol = 1e-6
rtol = 1e-6
{head}


def shapes(n, **_):
    return {{"x": ((n,), "float32"), "y": ((n,), "float32")}}


def reference(x, y, **_):
    y.copy_(2 * x)
"""
PLAIN_KERNEL = DTYPE_KERNEL.format(default="float32", made="dtype")


@pytest.mark.parametrize(("head", "args", "says", "line"), [
    # a second shape the kernel does not claim: refused before it runs, not a crash at that shape
    ('constraints = {"n": {"multiple_of": 32}}\nextra_dims = [{"n": 37}]', (),
     "the given dims break constraints['n']: n=37 is not a multiple of 32", 4),
    ('constraints = {"n": "fixed"}\nextra_dims = [{"n": 32}]', (),
     "constraints['n'] is \"fixed\" at n=64, but a shape the session checks has n=32", 4),
    # changed by code after the literal: kopt reads the literal only, so the change is refused, never dropped
    ('constraints = {}\nconstraints["n"] = {"multiple_of": 128}', (), "constraints is changed after its literal (line 5)",
     5),
    ('constraints = {"n": {"min": 1}}\nif True:\n    constraints = {"n": {"multiple_of": 128}}', (),
     "constraints is changed after its literal (line 6)", 6),
    # one listed dtype is a claim too: setup() must make it
    ('dtypes = ["float64"]', (), "setup()'s dtype defaults to 'float32'", None),
    # a tolerance no case would use, and one that accepts anything
    ('dtype_tolerances = {"bfloat16": {"atol": 1e-2, "rtol": 1e-2}}', (),
     "dtype_tolerances names bfloat16, which dtypes does not list (no dtypes): no case would use it", 4),
    ('dtypes = ["float32", "float16"]\ndtype_tolerances = {"float16": {"atol": 1e-3, "rtol": 1e30}}', (),
     "dtype_tolerances gives float16 rtol >= 1: an output off by its own size", 5),
    ('dtypes = ["float32", "float16"]\ndtype_tolerances = {"float32": {"atol": 1e-3, "rtol": 1e-3}}', (),
     "dtype_tolerances names float32, the first of dtypes, whose cases (the seeds) take ref.py's atol", 5),
    # every claim is read from its one literal: a change by code after it is refused, never dropped
    ('dtypes = ["float32"]\ndtypes.append("float16")', (), "dtypes is changed after its literal (line 5)", 5),
    ('dtypes = ["float32", "float16"]\ndtype_tolerances = {}\ndtype_tolerances["float16"] = '
     '{"atol": 1e-2, "rtol": 1e-2}', (), "dtype_tolerances is changed after its literal (line 6)", 6),
])
def test_claims_a_session_could_not_keep_are_refused_at_preflight(pytester: pytest.Pytester, head: str,
                                                                  args: tuple[str, ...], says: str,
                                                                  line: int | None) -> None:
    """Constraints and dtypes the session's own shapes or code would contradict: exit 4 at preflight, naming the
    file, the line and what is wrong (found by a red-team pass: each ran before, crashed at the unclaimed shape or
    passed claiming what it never checked)."""
    code, report = session(pytester, PLAIN_KERNEL, PLAIN_REF.format(head=head), "-k", "preflight", *args)
    (item,) = report["items"]
    assert (code, item["status"]) == (4, "CONTRACT_ERROR"), item
    assert says in item["message"], item["message"]
    if line is not None:
        assert item["line"] == line and item["path"].endswith("ref.py"), item


def test_the_reference_dtypes_decide_the_dtype_dim(pytester: pytest.Pytester) -> None:
    """--kopt-dims giving dtype beside the reference's dtypes: every case would have run that dtype while the report
    said the first listed (a red-team find); refused at preflight, naming the dtypes line."""
    pytester.makepyfile(kernel=PLAIN_KERNEL, ref=PLAIN_REF.format(head='dtypes = ["float32", "float16"]'))
    result = pytester.runpytest_subprocess("--kopt-baseline", "kernel.py", "--kopt-ref", "ref.py", "--kopt-dims",
                                           'n=64,dtype="float16"', "--kopt-json", "r.json", "-k", "preflight",
                                           "-p", "no:cacheprovider", timeout=600)
    (item,) = json.loads((pytester.path / "r.json").read_text())["items"]
    assert (result.ret, item["status"], item["line"]) == (4, "CONTRACT_ERROR", 4), item
    assert item["message"].startswith("--kopt-dims gives dtype, which the reference's dtypes decides"), item


def test_a_dtype_case_that_makes_no_buffer_of_its_dtype_is_refused(pytester: pytest.Pytester) -> None:
    """dtypes = ["float32", "float16"] with a shapes() and a setup() that both make float32 whatever the dtype: the
    float16 case ran float32 and the report said float16 was checked (a red-team find); now a contract error naming
    the reference, and float16 is not among the dtypes checked."""
    ref = DTYPE_REF.replace('def shapes(n, dtype="float32"):\n    return {"x": ((n,), dtype), "y": ((n,), dtype)}',
                            'def shapes(n, **_):\n    return {"x": ((n,), "float32"), "y": ((n,), "float32")}')
    assert ref != DTYPE_REF
    code, report = session(pytester, DTYPE_KERNEL.format(default="float32", made='"float32"'), ref,
                           "--kopt-edge-shapes", "off")
    bad = correctness(report)["n=64,dtype=float16"]
    assert (bad["status"], code) == ("CONTRACT_ERROR", 4), bad
    assert "no buffer of this case is float16 (x: float32, y: float32)" in bad["message"]
    assert bad["path"].endswith("ref.py") and report["kernels"][0]["dtypes_checked"] == ["float32"], report["kernels"]


def test_an_edge_shape_gives_no_tolerance_warning(pytester: pytest.Pytester) -> None:
    """The tolerance's sanity check (would a bf16 or fp16 computation pass it?) is made at the seeds' dims: a
    softmax of one column is exactly 1 in any precision, so at the edge shape M=1,N=1 it warned that tolerances
    below 0 would be needed (a red-team find)."""
    redteam = Path(__file__).resolve().parent / "redteam"
    pytester.makepyfile(kernel=(redteam / "honest_python.py").read_text(),
                        ref=(redteam / "ref_softmax.py").read_text())
    result = pytester.runpytest_subprocess("--kopt-baseline", "kernel.py", "--kopt-ref", "ref.py", "--kopt-dims",
                                           "M=4,N=16", "--kopt-seeds", "3", "--kopt-json", "r.json", "-p",
                                           "no:cacheprovider", "-k", "correctness", timeout=600)
    items = correctness(json.loads((pytester.path / "r.json").read_text()))
    assert "M=1,N=1" in items and all(i["status"] == "PASSED" for i in items.values()), items
    assert result.ret == 0 and "KoptToleranceWarning" not in result.stdout.str(), result.stdout.str()[-3000:]


def test_the_verdict_line_says_which_edge_shapes_were_checked(pytester: pytest.Pytester) -> None:
    """A reference whose constraints leave one edge shape (n=64, fitted from n=1) and exclude four: the kernel's
    verdict line says so (before, only the JSON report did: a newcomer's find)."""
    head = 'constraints = {"n": {"multiple_of": 64}}'
    pytester.makepyfile(kernel=PLAIN_KERNEL, ref=PLAIN_REF.format(head=head))
    result = pytester.runpytest_subprocess("--kopt-baseline", "kernel.py", "--kopt-ref", "ref.py", "--kopt-dims",
                                           "n=128", "--kopt-seeds", "3", "-p", "no:cacheprovider", timeout=600)
    assert result.ret == 0, result.stdout.str()[-2000:]
    result.stdout.fnmatch_lines(["correctness?n=64? *PASSED*edge shape n=64 (ones, within ref.py constraints): *",
                                 "kernel.py: PASSED: output checked, not timed (*); edge shapes: 1 checked (1 fitted "
                                 "to the reference's constraints), 4 excluded by constraints (sizes n)"])


def test_a_cu_without_a_gpu_reports_its_planned_edge_shapes_as_not_run(pytester: pytest.Pytester) -> None:
    """On a machine without a GPU a .cu's correctness items are skipped: the report's kernel entry says its edge
    shapes were planned and not run (it read null before, beside five listed edge items), checks none, and each
    skipped edge item still names its shape."""
    from conftest import gpu_missing_reason

    if gpu_missing_reason() is None:
        pytest.skip("a GPU is present: the .cu's correctness items run (test_a_tail_dropping_cu_on_the_gpu)")
    pytester.makefile(".cu", kernel=TAIL_CU)
    pytester.makepyfile(ref=REF.format(extra=""))
    result = pytester.runpytest_subprocess("--kopt-baseline", "kernel.cu", "--kopt-ref", "ref.py", "--kopt-dims",
                                           "n=4096", "--kopt-seeds", "3", "--kopt-json", "r.json", "-p",
                                           "no:cacheprovider", "-k", "correctness", timeout=600)
    report = json.loads((pytester.path / "r.json").read_text())
    (kernel,) = report["kernels"]
    assert result.ret == 0 and kernel["status"] == "SKIPPED", kernel
    assert kernel["edge_shapes"] == "not run (its correctness items were skipped); planned: 5 checked (sizes n)"
    assert kernel["edge_checked"] == [] and kernel["dtypes_checked"] == []
    items = correctness(report)
    assert items["n=37"]["status"] == "SKIPPED" and items["n=37"]["figures"]["dims_checked"] == "n=37"


def test_edge_shapes_deselected_are_not_reported_as_checked(pytester: pytest.Pytester) -> None:
    """-k seed runs the seeds only: the kernel's entry lists no edge shape as checked and says none of the planned
    passed (it read "5 checked" with all five listed: red-team)."""
    pytester.makepyfile(kernel=PLAIN_KERNEL, ref=PLAIN_REF.format(head=""))
    result = pytester.runpytest_subprocess("--kopt-baseline", "kernel.py", "--kopt-ref", "ref.py", "--kopt-dims",
                                           "n=64", "--kopt-seeds", "3", "--kopt-json", "r.json", "-k", "seed",
                                           "-p", "no:cacheprovider", timeout=600)
    (kernel,) = json.loads((pytester.path / "r.json").read_text())["kernels"]
    assert result.ret == 0 and kernel["edge_checked"] == [], kernel
    assert kernel["edge_shapes"] == "5 planned (sizes n); 0 passed", kernel


def test_a_fitted_size_stays_within_the_planned_memory() -> None:
    """M multiple of 1024 at M=1024,N=128 (a buffer A[M, M]): near's M=1025 fits down to 1024, not up to 2048, which
    would have made A four times the size the plan checked (red-team); a tile of 8 at 4096 may round 4097 up to
    4104, within a percent."""
    checked, excluded, _ = derive({"M": 1024, "N": 128}, ("M", "N"), {"M": {"multiple_of": 1024}})
    assert all(d["M"] == 1024 for _, d in checked)
    assert excluded[-1] == ("M=1025,N=37", "M=1025 is not a multiple of 1024 (ref.py constraints); fitted to them "
                                           "it is M=1024,N=37, already checked")
    near = derive({"n": 4096}, ("n",), {"n": {"multiple_of": 8}})[0][-1]
    assert near == ("near", {"n": 4104})


SHRINK_REF = """\
import torch
atol = 1e-6
rtol = 1e-6
constraints = {"n": {"multiple_of": 16}, "c": "fixed"}


def shapes(n, c, **_):
    return {"x": ((n, c), "float32"), "y": ((n, c), "float32")}


def reference(x, y, **_):
    y.copy_(2 * x)
"""
SHRINK_KERNEL = """\
import torch


def setup(n, c, seed, device="cpu"):
    x = torch.empty(n, c, device=device)
    return {"inputs": {"x": x, "y": torch.empty_like(x)}, "outputs": ["y"]}


def run_kernel(x, y):
    y.copy_(x * 2)
    y[0, 0] += 1.0  # wrong at every size
"""


def test_a_shrunk_failure_stays_within_the_constraints(pytester: pytest.Pytester) -> None:
    """n a multiple of 16, c fixed at 8: a kernel wrong at every size shrinks to n=16 with c kept (it shrank to
    n=1,c=1, a shape the kernel never claimed: red-team)."""
    pytester.makepyfile(kernel=SHRINK_KERNEL, ref=SHRINK_REF)
    result = pytester.runpytest_subprocess("--kopt-baseline", "kernel.py", "--kopt-ref", "ref.py", "--kopt-dims",
                                           "n=256,c=8", "--kopt-seeds", "3", "--kopt-edge-shapes", "off",
                                           "--kopt-json", "r.json", "-k", "correctness", "-p", "no:cacheprovider",
                                           timeout=600)
    (item,) = correctness(json.loads((pytester.path / "r.json").read_text())).values()
    assert result.ret == 2 and item["status"] == "INCORRECT_NUMERICAL", item
    assert "shrunk to n=16, " in item["message"] and "c=1" not in item["message"], item["message"]
