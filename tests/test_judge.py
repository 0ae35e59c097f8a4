"""The judge's fast path (pytest_kopt.child.judge) against the numpy verdict it stands in for, and the descriptors of
arrays shared between harness processes (pytest_kopt.child.share).

The fast path runs in torch on whatever device holds the arrays; here on CPU tensors, which run the same code a GPU
does. Whenever it reports a pass, the numpy judge must pass the same arrays with the same figures, bit for bit; and
on ordinary arrays (no overflow, no denormal references) it must not decline a case the numpy judge passes.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_kopt.child.inputs import SECOND_POISON
from pytest_kopt.child.judge import HostArrays, compare_fast, judge_fast, tolerance_scale_fast
from pytest_kopt.child.share import ShareError, check_descriptor
from pytest_kopt.child.verdict import compare, judge, tolerance_scale

torch = pytest.importorskip("torch")

DTYPES = {"float32": (np.float32, torch.float32), "float64": (np.float64, torch.float64),
          "float16": (np.float16, torch.float16), "int32": (np.int32, torch.int32)}


@st.composite
def cases(draw: st.DrawFn) -> tuple[dict[str, np.ndarray], dict[str, tuple[float, float]], dict[str, float | None]]:
    """Arrays of one output as the judge receives them: the reference, four candidate calls derived from it with
    planted faults (noise around the tolerance, NaN/Inf on one or both sides, the second poison left in place, a
    constant output, a stale set B), and the tolerances."""
    dtype = draw(st.sampled_from(sorted(DTYPES)))
    npt = DTYPES[dtype][0]
    n = draw(st.integers(1, 64))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    scale = draw(st.sampled_from([1e-3, 1.0, 1e3]))
    ref = (rng.standard_normal(n) * scale).astype(npt) if dtype != "int32" else rng.integers(-9, 9, n).astype(npt)
    atol = draw(st.sampled_from([0.0, 1e-5, 1e-3, 1e-1]))
    rtol = draw(st.sampled_from([0.0, 1e-5, 1e-3, 1e-1]))
    noise = draw(st.sampled_from([0.0, 1e-6, 1e-4, 1e-2, 1.0]))
    c1 = (ref.astype(np.float64) + rng.standard_normal(n) * noise * scale).astype(npt) if dtype != "int32" \
        else ref.copy()
    fault = draw(st.sampled_from(["none", "nan_both", "nan_out", "inf_both", "inf_ref", "poison", "constant",
                                  "stale_b", "nondet", "zero_ref"]))
    refb = (ref.astype(np.float64) + 1).astype(npt)
    cb = (c1.astype(np.float64) + 1).astype(npt)
    c2 = c1.copy()
    floating = dtype != "int32"
    if floating and fault in ("nan_both", "nan_out"):
        c1[0] = c2[0] = np.nan
        if fault == "nan_both":
            ref[0] = np.nan
    elif floating and fault == "inf_both":
        c1[-1] = c2[-1] = ref[-1] = np.inf
    elif floating and fault == "inf_ref":
        ref[0] = -np.inf
    elif floating and fault == "poison" and dtype in SECOND_POISON:
        c1[0] = np.nan
        c2[0] = np.float64(SECOND_POISON[dtype]).astype(npt)
    elif fault == "constant" and n > 1:
        c1[:] = c1[0]
        c2[:] = c1[0]
    elif fault == "stale_b":
        cb = c1.copy()
    elif fault == "nondet" and n > 1:
        c2 = c2[::-1].copy()
    elif fault == "zero_ref":
        ref[:] = 0
        c1 = c1 * 0
        c2 = c1.copy()
    arrays = {"ref__y": ref, "refB__y": refb, "cand1__y": c1, "cand2__y": c2, "candB__y": cb, "candC__y": cb.copy()}
    poison = {"y": SECOND_POISON.get(dtype)}
    return arrays, {"y": (atol, rtol)}, poison


@settings(max_examples=600, deadline=None)
@given(cases())
def test_a_fast_pass_is_the_numpy_judges_pass_with_its_figures(case) -> None:
    arrays, tols, poison = case
    tensors = {k: torch.from_numpy(v.copy()) for k, v in arrays.items()}
    fast = judge_fast(torch, ["y"], tensors, tols, poison)
    slow = judge(["y"], arrays, tols, check_tolerance=False, second_poison=poison)
    if fast is not None:
        assert slow.ok, (slow.status, slow.message)
        assert fast == slow.figures
    else:
        assert not slow.ok, "the fast path declined a case the numpy judge passes"


@settings(max_examples=300, deadline=None)
@given(cases())
def test_compare_fast_agrees_with_compare(case) -> None:
    arrays, tols, _ = case
    atol, rtol = tols["y"]
    for a, b in (("cand1__y", "ref__y"), ("candB__y", "refB__y"), ("cand2__y", "ref__y")):
        c = compare("y", arrays[a], arrays[b], atol, rtol)
        f = compare_fast(torch, torch.from_numpy(arrays[a]), torch.from_numpy(arrays[b]), atol, rtol)
        assert (f is not False) == c.ok or f is None
        if isinstance(f, dict):
            assert f == {"max_abs_err": c.max_abs_err, "max_rel_err": c.max_rel_err, "max_ref_abs": c.max_ref_abs,
                         "nan_out": c.nan_out, "inf_out": c.inf_out, "nan_ref": c.nan_ref, "inf_ref": c.inf_ref}
        if c.ok and not c.nonfinite and np.isfinite(arrays[b].astype(np.float64)).all():
            s = tolerance_scale(arrays[a], arrays[b], atol, rtol)
            assert tolerance_scale_fast(torch, torch.from_numpy(arrays[a]), torch.from_numpy(arrays[b]), atol, rtol) == s


def test_the_fast_path_declines_where_numpys_two_block_paths_differ() -> None:
    """An error that overflows float64 (two float64 values near the range's ends), or a relative error that does
    (a denormal reference), is left to the numpy judge."""
    big = np.array([1e308, 1.0])
    assert compare_fast(torch, torch.from_numpy(-big), torch.from_numpy(big), 0.0, 10.0) is None
    tiny = np.array([1e-320, 1.0])
    assert compare_fast(torch, torch.from_numpy(tiny + 1e-3), torch.from_numpy(tiny), 1.0, 0.0) is None
    assert compare_fast(torch, torch.ones(3, dtype=torch.complex64), torch.ones(3, dtype=torch.complex64), 0, 0) is None
    assert compare_fast(torch, torch.ones(3), torch.ones(4), 0.0, 0.0) is None


def test_bf16_is_judged_as_float32_on_both_paths() -> None:
    """bf16 arrays reach the numpy judge as float32 (every bf16 value exactly); the fast path reads them so too,
    and the poison left by an unwritten element compares in that dtype."""
    ref = torch.tensor([1.0, 2.5, -3.0], dtype=torch.bfloat16)
    cand = ref.clone()
    arrays = {"ref__y": ref, "cand1__y": cand, "cand2__y": cand.clone(), "candB__y": cand + 1, "refB__y": ref + 1}
    host = HostArrays(torch, arrays)
    assert host["ref__y"].dtype == np.float32 and "cand1__y" in host and len(host) == 5
    fig = judge_fast(torch, ["y"], arrays, {"y": (0.0, 0.0)}, {"y": SECOND_POISON["bfloat16"]})
    assert fig == judge(["y"], host, {"y": (0.0, 0.0)}, check_tolerance=False).figures
    holed = dict(arrays, cand1__y=torch.tensor([float("nan"), 2.5, -3.0], dtype=torch.bfloat16),
                 cand2__y=torch.tensor([SECOND_POISON["bfloat16"], 2.5, -3.0], dtype=torch.bfloat16))
    assert judge_fast(torch, ["y"], holed, {"y": (0.0, 0.0)}, {"y": SECOND_POISON["bfloat16"]}) is None
    v = judge(["y"], HostArrays(torch, holed), {"y": (0.0, 0.0)}, check_tolerance=False,
              second_poison={"y": SECOND_POISON["bfloat16"]})
    assert v.status == "UNWRITTEN"


def test_a_later_call_of_another_shape_fails_as_incorrect_shape() -> None:
    """A call that returns another shape than the first is INCORRECT_SHAPE on both paths (before, the numpy judge
    raised ValueError from compare)."""
    a = np.arange(4, dtype=np.float32)
    arrays = {"ref__y": a, "cand1__y": a, "cand2__y": a[:3], "candB__y": a, "refB__y": a}
    v = judge(["y"], arrays, {"y": (0.0, 0.0)}, check_tolerance=False)
    assert v.status == "INCORRECT_SHAPE" and "cand2 [3]" in v.message
    assert judge_fast(torch, ["y"], {k: torch.from_numpy(x) for k, x in arrays.items()}, {"y": (0.0, 0.0)}) is None


def test_an_array_descriptor_must_add_up() -> None:
    """A descriptor from another process is data: a 64-byte handle, a known dtype, a shape of non-negative ints
    and the byte count they make; anything else is refused before the driver sees it."""
    good = {"handle": "ab" * 64, "nbytes": 24, "dtype": "float32", "shape": [2, 3]}
    assert check_descriptor(good) == (bytes.fromhex("ab" * 64), 24, "float32", [2, 3])
    assert check_descriptor({"handle": "", "nbytes": 0, "dtype": "float32", "shape": [0]})[1] == 0
    for bad in ({**good, "nbytes": 25}, {**good, "dtype": "object"}, {**good, "shape": [-2, -3]},
                {**good, "handle": "ab" * 63}, {**good, "handle": "zz"}, {"handle": "ab" * 64}, None, "x",
                {**good, "shape": "23"}):
        with pytest.raises(ShareError):
            check_descriptor(bad)


@pytest.mark.gpu
def test_arrays_cross_between_processes_by_cuda_ipc(tmp_path) -> None:
    """On a GPU: a child exports three arrays (fp32, int32, a transposed bf16 view) and stays stopped (SIGSTOP, as
    the pool leaves a candidate's process between requests) while this process imports them; a descriptor that
    claims more bytes than its mapping holds, and a handle the driver does not know, are refused."""
    import json
    import os
    import signal
    import subprocess
    import sys

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from pytest_kopt.child import share

    prog = ("import json, sys, torch\nfrom pytest_kopt.child import share\n"
            "a = torch.full((512, 512), 3.0, device='cuda')\nb = torch.arange(1000, device='cuda', dtype=torch.int32)\n"
            "c = torch.ones(7, 5, device='cuda', dtype=torch.bfloat16).t()\n"
            "print(json.dumps({k: share.export(torch, v)[0] for k, v in (('a', a), ('b', b), ('c', c))}), flush=True)\n"
            "sys.stdin.readline()\nshare.release()\n")
    child = subprocess.Popen([sys.executable, "-c", prog], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        descs = json.loads(child.stdout.readline())
        os.kill(child.pid, signal.SIGSTOP)
        a, b, c = (share.import_copy(torch, descs[k]) for k in "abc")
        assert float(a.double().sum()) == 3.0 * 512 * 512 and a.dtype == torch.float32
        assert b.tolist() == list(range(1000)) and c.shape == (5, 7) and c.dtype == torch.bfloat16
        with pytest.raises(ShareError, match="mapping holds"):
            share.import_copy(torch, {**descs["a"], "nbytes": 4 * 2048 * 512, "shape": [2048, 512]})
        with pytest.raises(ShareError, match="cuIpcOpenMemHandle"):
            share.import_copy(torch, {**descs["b"], "handle": "ab" * 64})
    finally:
        os.kill(child.pid, signal.SIGCONT)
        child.communicate("\n", timeout=60)


def test_an_inf_output_fails_even_where_the_bound_overflows() -> None:
    """atol + rtol*|ref| past float64's range is inf, and inf <= inf: an Inf output where the reference is finite
    failed nowhere (the numpy judge passed it with max abs err inf, the fast path with 0); it fails on both paths."""
    out, ref = np.array([np.inf, 2.0]), np.array([1.0, 2.0])
    c = compare("y", out, ref, 1e308, 1e308)
    assert not c.ok and c.nonfinite == 1
    assert compare_fast(torch, torch.from_numpy(out), torch.from_numpy(ref), 1e308, 1e308) is False
