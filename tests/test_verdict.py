"""Tests for pytest_kopt.child.verdict: each guard's status from hand-built arrays, figures, and tolerance warnings."""

from __future__ import annotations

import numpy as np
import pytest

from pytest_kopt.child.verdict import Verdict, judge, tolerance_scale

NO_NONFINITE = {"nan_out": 0, "inf_out": 0, "nan_ref": 0, "inf_ref": 0}
TOLS = {"y": (1e-3, 1e-3)}
REF = np.array([1.0, 2.0, 4.0, 8.0], dtype=np.float32)
REF_B = np.array([3.0, 5.0, 6.0, 7.0], dtype=np.float32)


def honest(name: str = "y") -> dict[str, np.ndarray]:
    """A candidate that matches the reference on every call (separate copies, as loaded from an npz)."""
    return {f"cand1__{name}": REF.copy(), f"cand2__{name}": REF.copy(), f"candB__{name}": REF_B.copy(),
            f"candC__{name}": REF_B.copy(), f"ref__{name}": REF.copy(), f"refB__{name}": REF_B.copy()}


def with_(arrays: dict[str, np.ndarray], **replace: np.ndarray) -> dict[str, np.ndarray]:
    return {**arrays, **replace}


# -- PASSED --------------------------------------------------------------------------------------------------------

def test_honest_candidate_passes():
    v = judge(["y"], honest(), TOLS)
    assert isinstance(v, Verdict)
    assert v.status == "PASSED"
    assert v.ok
    assert (v.message, v.details, v.warnings) == ("", (), ())
    assert v.figures == {"max_abs_err": 0.0, "max_rel_err": 0.0, "mismatched": 0, **NO_NONFINITE}


def test_passes_within_tolerance():
    # |err| 0.004 <= 1e-3 + 1e-3*4 = 0.005 at the element 4.0
    c1 = REF.astype(np.float64) + np.array([0.0, 0.0, 0.004, 0.0])
    v = judge(["y"], with_(honest(), cand1__y=c1), TOLS)
    assert v.status == "PASSED"
    assert v.figures["max_abs_err"] == pytest.approx(0.004, rel=1e-9)
    assert v.figures["mismatched"] == 0


def test_passes_with_only_the_first_call():
    v = judge(["y"], {"cand1__y": REF.copy(), "ref__y": REF.copy()}, TOLS)
    assert v.status == "PASSED"


def test_constant_reference_and_equal_constant_output_pass():
    # the reference itself is constant: a constant output is right, not CONSTANT_OUTPUT
    z = np.zeros(4, dtype=np.float32)
    v = judge(["y"], {"cand1__y": z.copy(), "ref__y": z.copy()}, TOLS)
    assert v.status == "PASSED"


# -- INCORRECT_SHAPE -----------------------------------------------------------------------------------------------

def test_incorrect_shape():
    v = judge(["y"], with_(honest(), cand1__y=REF.reshape(2, 2).copy()), TOLS)
    assert v.status == "INCORRECT_SHAPE"
    assert not v.ok
    assert "[2, 2]" in v.message and "[4]" in v.message


# -- CONSTANT_OUTPUT -----------------------------------------------------------------------------------------------

def test_constant_output():
    v = judge(["y"], with_(honest(), cand1__y=np.zeros(4, dtype=np.float32)), TOLS)
    assert v.status == "CONSTANT_OUTPUT"
    assert len(v.details) == 1


def test_constant_output_even_within_a_loose_tolerance():
    # all-zero output, small varying reference: atol=1 passes every element, the guard still fails it
    ref = np.array([1e-3, 2e-3, 3e-3, 4e-3])
    zero = np.zeros(4)
    arrays = {"cand1__y": zero, "cand2__y": zero.copy(), "ref__y": ref}
    v = judge(["y"], arrays, {"y": (1.0, 0.0)})
    assert v.status == "CONSTANT_OUTPUT"
    assert v.figures["mismatched"] == 0  # numerically it would have passed


# -- INCORRECT_NUMERICAL -------------------------------------------------------------------------------------------

def test_one_element_off():
    c1 = REF.copy()
    c1[2] = 4.5
    v = judge(["y"], with_(honest(), cand1__y=c1), TOLS)
    assert v.status == "INCORRECT_NUMERICAL"
    assert v.message == "output differs from the reference"
    assert v.figures == {"max_abs_err": 0.5, "max_rel_err": 0.125, "mismatched": 1, **NO_NONFINITE}
    assert len(v.details) == 1 and "1/4 elements" in v.details[0]


def test_nan_element():
    c1 = REF.copy()
    c1[1] = np.nan
    v = judge(["y"], with_(honest(), cand1__y=c1), TOLS)
    assert v.status == "INCORRECT_NUMERICAL"
    assert v.figures["mismatched"] == 1


def test_inf_element():
    c1 = REF.copy()
    c1[0] = np.inf
    v = judge(["y"], with_(honest(), cand1__y=c1), TOLS)
    assert v.status == "INCORRECT_NUMERICAL"


# -- NONDETERMINISTIC ----------------------------------------------------------------------------------------------

def test_unwritten_elements_are_caught_where_the_reference_is_nan():
    """The NaN policy: NaN where the reference is NaN, and only there. An element left unwritten keeps the poison of
    each call (NaN, then the second poison), so it is caught even where the reference is NaN; a written NaN there
    passes, and the pass record counts it."""
    ref = REF.copy()
    ref[2] = np.nan
    hole = REF.copy()
    hole[2] = np.nan
    poisoned = hole.copy()
    poisoned[2] = -1.7014117331926443e38
    arrays = {**honest(), "ref__y": ref, "refB__y": honest()["refB__y"], "cand1__y": hole, "cand2__y": poisoned}
    v = judge(["y"], arrays, TOLS, second_poison={"y": -1.7014117331926443e38})
    assert v.status == "UNWRITTEN" and "1 element(s) left unwritten" in v.message
    assert v.details == ("output y: unwritten at [2] (the reference is NaN there too)",)
    written = judge(["y"], {**arrays, "cand2__y": hole.copy()}, TOLS, second_poison={"y": -1.7014117331926443e38})
    assert written.ok and (written.figures["nan_out"], written.figures["nan_ref"]) == (1, 1)


def test_finite_where_the_reference_is_nan_says_so():
    """A finite output where the reference is NaN fails, and says so (not "max abs err 0" alone)."""
    ref = REF.copy()
    ref[1] = np.nan
    v = judge(["y"], {**honest(), "ref__y": ref}, TOLS)
    assert v.status == "INCORRECT_NUMERICAL"
    assert "1 finite where the reference is NaN/Inf" in v.details[0] and "reference 1/0" in v.details[0]


def test_nondeterministic_second_call():
    c2 = REF.copy()
    c2[3] = 9.0
    v = judge(["y"], with_(honest(), cand2__y=c2), TOLS)
    assert v.status == "NONDETERMINISTIC"
    assert v.details[0].startswith("second call: ")
    # figures are the failing comparison's (the second call: 1 element off by 1.0), not the exact first call's
    assert v.figures == {"max_abs_err": 1.0, "max_rel_err": 0.125, "mismatched": 1, **NO_NONFINITE}


# -- set B: STALE_OUTPUT, INPUT_INDEPENDENT, INCORRECT_NUMERICAL ---------------------------------------------------

def test_stale_output_replays_set_a():
    # same buffers give set A's answer again, new buffers give the right one: a result cached by address
    v = judge(["y"], with_(honest(), candB__y=REF.copy()), TOLS)
    assert v.status == "STALE_OUTPUT"
    assert v.details[0].startswith("new values, same buffers: ")


def test_stale_output_any_wrong_value():
    v = judge(["y"], with_(honest(), candB__y=REF_B + 1.0), TOLS)
    assert v.status == "STALE_OUTPUT"


def test_input_independent():
    # set B's output bit-identical to set A's although the reference changed, in new buffers too
    v = judge(["y"], with_(honest(), candB__y=REF.copy(), candC__y=REF.copy()), TOLS)
    assert v.status == "INPUT_INDEPENDENT"


def test_input_independent_without_candc():
    arrays = honest()
    del arrays["candC__y"]
    v = judge(["y"], with_(arrays, candB__y=REF.copy()), TOLS)
    assert v.status == "INPUT_INDEPENDENT"


def test_input_independent_needs_bit_identity():
    # set A's output plus a tiny change: no longer identical, so plainly wrong on set B
    near = REF.copy()
    near[0] = np.nextafter(near[0], np.float32(2.0))
    v = judge(["y"], with_(honest(), candB__y=near, candC__y=near.copy()), TOLS)
    assert v.status == "INCORRECT_NUMERICAL"


def test_wrong_second_set_neither_stale_nor_independent():
    wrong = REF_B + 1.0
    v = judge(["y"], with_(honest(), candB__y=wrong, candC__y=wrong.copy()), TOLS)
    assert v.status == "INCORRECT_NUMERICAL"
    assert "second set" in v.message
    # the figures of the comparison that failed (set B: every element off by 1), not set A's exact pass
    assert v.figures == {"max_abs_err": 1.0, "max_rel_err": pytest.approx(1 / 3), "mismatched": 4, **NO_NONFINITE}


def test_set_b_skipped_without_refb():
    arrays = honest()
    del arrays["refB__y"]
    v = judge(["y"], with_(arrays, candB__y=REF_B + 1.0), TOLS)
    assert v.status == "PASSED"


# -- several outputs -----------------------------------------------------------------------------------------------

def two_outputs() -> dict[str, np.ndarray]:
    """Output ``x`` nondeterministic, output ``y`` numerically wrong on the first call."""
    arrays = {**honest("x"), **honest("y")}
    arrays["cand2__x"] = REF + 1.0
    c1 = REF.copy()
    c1[0] = 3.0
    arrays["cand1__y"] = c1
    return arrays


@pytest.mark.parametrize(("order", "status"), [
    (["x", "y"], "NONDETERMINISTIC"),
    (["y", "x"], "INCORRECT_NUMERICAL"),
])
def test_first_failing_output_decides(order, status):
    tols = {"x": (1e-3, 1e-3), "y": (1e-3, 1e-3)}
    v = judge(order, two_outputs(), tols)
    assert v.status == status
    assert len(v.details) == 2  # both findings are reported


def test_per_output_tolerances():
    # y is off by 0.5 at 4.0: fails at atol 1e-3, passes at atol 1
    arrays = honest()
    arrays["cand1__y"] = REF + np.array([0.0, 0.0, 0.5, 0.0], dtype=np.float32)
    assert judge(["y"], arrays, {"y": (1e-3, 1e-3)}).status == "INCORRECT_NUMERICAL"
    assert judge(["y"], arrays, {"y": (1.0, 0.0)}).status == "PASSED"


def test_figures_worst_over_outputs():
    # x: errs 0 0.5 0 1 vs 1 2 4 8 -> abs 1.0, rel 0.25 (0.5/2), 2 mismatched
    # y: errs 0 0 2 0 vs 1 2 4 8 -> abs 2.0, rel 0.5, 1 mismatched
    arrays = {**honest("x"), **honest("y")}
    arrays["cand1__x"] = np.array([1.0, 2.5, 4.0, 7.0], dtype=np.float32)
    arrays["cand1__y"] = np.array([1.0, 2.0, 6.0, 8.0], dtype=np.float32)
    v = judge(["x", "y"], arrays, {"x": (1e-3, 1e-3), "y": (1e-3, 1e-3)})
    assert v.figures == {"max_abs_err": 2.0, "max_rel_err": 0.5, "mismatched": 3, **NO_NONFINITE}


def test_figures_exact_for_one_output():
    arrays = honest()
    arrays["cand1__y"] = np.array([1.0, 2.5, 4.0, 7.0], dtype=np.float32)
    v = judge(["y"], arrays, TOLS)
    assert v.figures == {"max_abs_err": 1.0, "max_rel_err": 0.25, "mismatched": 2, **NO_NONFINITE}


# -- tolerance warnings --------------------------------------------------------------------------------------------

#: atol 0.01, rtol 0.02. low errs: 0.005 at 2 (bound 0.05, ratio 0.1), 0.0225 at 4 (bound 0.09, ratio 0.25).
WARN_TOLS = {"y": (0.01, 0.02)}
LOW = np.array([1.0, 2.005, 4.0225, 8.0])


def test_tolerance_scale_on_the_warning_example():
    assert tolerance_scale(LOW, REF, 0.01, 0.02) == pytest.approx(0.25, rel=1e-9)


def test_tolerance_scale_exact():
    # err 0.5 at ref 2 over 0.25 + 0.125*2 = 0.5 -> 1.0; err 0.25 at ref 4 over 0.75 -> 1/3
    low = np.array([1.0, 2.5, 4.25])
    ref = np.array([1.0, 2.0, 4.0])
    assert tolerance_scale(low, ref, 0.25, 0.125) == 1.0


def test_tolerance_scale_above_one_when_low_fails():
    assert tolerance_scale(REF + 1.0, REF, 0.25, 0.0) == 4.0


def test_tolerance_scale_ignores_nan():
    low = np.array([np.nan, 2.5])
    ref = np.array([1.0, 2.0])
    assert tolerance_scale(low, ref, 0.5, 0.0) == 1.0


def test_tolerance_scale_exact_match_with_zero_tolerance():
    # an exact match fits any tolerance: 0, not inf (0/0), so the suggested tolerances are 0, not nan
    ref = np.array([1, 2, 3], dtype=np.int64)
    assert tolerance_scale(ref.copy(), ref, 0.0, 0.0) == 0.0


def test_bf16_warning_with_suggested_tolerances():
    v = judge(["y"], with_(honest(), low_bf16__y=LOW), WARN_TOLS)
    assert v.status == "PASSED"  # a warning, never a failure
    assert len(v.warnings) == 1
    w = v.warnings[0]
    assert "output y" in w and "bf16" in w and "fp16" not in w
    assert "passes atol=0.01, rtol=0.02" in w
    # scale 0.25: 0.01*0.25, 0.02*0.25
    assert w.endswith("tolerances below atol=0.0025, rtol=0.005 would reject it")


def test_fp16_warning():
    v = judge(["y"], with_(honest(), low_fp16__y=LOW), WARN_TOLS)
    assert len(v.warnings) == 1
    assert "fp16" in v.warnings[0] and "bf16" not in v.warnings[0]


def test_both_low_precisions_warn():
    v = judge(["y"], with_(honest(), low_bf16__y=LOW, low_fp16__y=LOW.copy()), WARN_TOLS)
    assert len(v.warnings) == 2
    assert "bf16" in v.warnings[0] and "fp16" in v.warnings[1]


def test_no_warning_when_low_precision_fails():
    low = LOW.copy()
    low[3] = 8.5  # bound at 8 is 0.17
    v = judge(["y"], with_(honest(), low_bf16__y=low, low_fp16__y=low.copy()), WARN_TOLS)
    assert v.status == "PASSED"
    assert v.warnings == ()


def test_warning_for_exact_match_with_zero_tolerance_has_no_nan():
    ref = np.array([1, 2, 3], dtype=np.int64)
    v = judge(["i"], {"cand1__i": ref.copy(), "ref__i": ref, "low_bf16__i": ref.copy()}, {"i": (0.0, 0.0)})
    assert len(v.warnings) == 1
    assert "nan" not in v.warnings[0]
    assert v.warnings[0].endswith("atol=0, rtol=0 would reject it")


def test_a_nan_in_the_reference_is_pointed_at():
    """A finite answer where the reference is NaN fails (matching NaNs are the only pass), and the details say the
    reference is NaN there, so the fix is looked for in ref.py first."""
    ref = REF.copy()
    ref[2] = np.nan
    v = judge(["y"], with_(honest(), ref__y=ref), TOLS)
    assert v.status == "INCORRECT_NUMERICAL"
    assert v.details[-1] == "output y: the reference itself is NaN/Inf at [2]; check the reference (ref.py) before " \
                            "the kernel"
    both = REF.copy()
    both[2] = np.nan
    assert judge(["y"], with_(honest(), ref__y=ref, cand1__y=both, cand2__y=both.copy()), TOLS).status == "PASSED"


def test_a_near_miss_says_to_check_the_tolerance_before_the_kernel() -> None:
    """A sequential fp32 sum errs by ~2e-5 of the output's scale (the layer norm on the H200: 3.0e-4 on outputs of
    ~15, against atol 1e-4): the message names it a near miss and points at the tolerance; a wrong element (error of
    the output's own size) gets no such hint."""
    import numpy as np

    from pytest_kopt.child.verdict import compare

    ref = np.linspace(-15, 15, 4096).astype(np.float32)
    out = ref.copy()
    out[2048] += 3.0e-4  # where the reference is near 0, as in the layer norm's cancelling outputs
    c = compare("y", out, ref, 1e-4, 1e-4)
    assert not c.ok and c.near_miss and c.max_ref_abs == 15.0
    assert "a near miss: the worst error is 2e-05 of the output's largest value (15)" in c.describe(1e-4, 1e-4)
    out[9] = 3.0
    wrong = compare("y", out, ref, 1e-4, 1e-4)
    assert not wrong.near_miss and "near miss" not in wrong.describe(1e-4, 1e-4)
    assert compare("y", ref, ref, 1e-4, 1e-4).ok and not compare("y", ref, ref, 1e-4, 1e-4).near_miss


def test_a_complex_output_is_compared_with_its_imaginary_part() -> None:
    """A returned complex tensor is judged by the modulus of the difference, never by its real part alone: a wrong
    imaginary part fails (float64 arithmetic would drop it and pass), NaN blocks and finite blocks alike."""
    from pytest_kopt.child.verdict import compare

    ref = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    out = np.array([1 + 5j, 2, 3], dtype=np.complex64)
    c = compare("y", out, ref, 1e-3, 1e-3)
    assert (c.ok, c.mismatched, c.first_bad, c.max_abs_err) == (False, 1, ((0,),), 5.0)
    out[2] = np.nan
    c = compare("y", out, ref, 1e-3, 1e-3)
    assert (c.mismatched, c.nonfinite, c.max_abs_err) == (2, 1, float("inf"))
    same = np.array([1 + 0j, 2, 3], dtype=np.complex128)
    assert compare("y", same, ref, 0.0, 0.0).ok


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1e-3, "loose"])
def test_a_tolerance_the_reference_computes_must_be_finite_and_non_negative(value) -> None:
    """A tolerance that preflight's literal check cannot see (computed, or from a format adapter) is checked where
    it is read: NaN would pass every finite element (err > NaN is False), inf any error."""
    import types

    from pytest_kopt.child import HarnessError
    from pytest_kopt.child.reference import tolerances

    ref = types.SimpleNamespace(atol={"y": value}, rtol=1e-3, __file__="/p/ref.py")
    with pytest.raises(HarnessError) as info:
        tolerances(ref, "y", None, None)
    assert "/p/ref.py: atol for output 'y'" in str(info.value) and "finite number >= 0" in str(info.value)
    assert tolerances(types.SimpleNamespace(atol=0, rtol=2e-3), "y", None, None)["rtol"] == 2e-3


def test_a_call_equal_to_its_twin_is_not_saved_and_reads_as_its_twin(tmp_path) -> None:
    """The candidate's process leaves out cand2 equal to cand1 and candC equal to candB (NaN never counts as
    equal, so an element left unwritten keeps both); the judge reads the twin's values under the left-out name,
    and honours no other alias (an alias to another output, to a reference array, or over a saved name)."""
    import torch

    from pytest_kopt.child.candidate import Keeper
    from pytest_kopt.child.correctness import candidate_arrays

    a = np.arange(6, dtype=np.float32)
    nan = a.copy()
    nan[2] = np.nan
    t = torch.from_numpy
    keep = Keeper(torch, "cpu")
    keep.add("cand1", {"y": t(a), "z": t(nan)})
    keep.add("cand2", {"y": t(a.copy()), "z": t(nan.copy())})
    keep.add("candB", {"y": t(a + 1), "z": t(a.astype(np.float64))})
    keep.add("candC", {"y": t(a + 2), "z": t(a)})
    # candC__y differs, NaN in z, candC__z's dtype differs from candB__z's
    assert keep.same_as == {"cand2__y": "cand1__y"}
    shared = keep.result(str(tmp_path / "c"), {})
    assert shared["transport"] == "npz" and shared["arrays"] == {}
    with np.load(shared["npz"]) as z:
        assert sorted(z.files) == ["cand1__y", "cand1__z", "cand2__z", "candB__y", "candB__z", "candC__y", "candC__z"]
    bogus = {**keep.same_as, "cand2__z": "cand1__y", "candC__y": "ref__y", "cand1__y": "cand2__y", "x": 1}
    got, why = candidate_arrays(torch, {"cand": {"npz": shared["npz"], "same_as": bogus}}, "cpu")
    assert why is None and sorted(got) == sorted(["cand1__y", "cand2__y", "candB__y", "candC__y", "cand1__z",
                                                  "cand2__z", "candB__z", "candC__z"])
    assert np.array_equal(got["cand2__y"], a) and np.array_equal(got["candC__y"], a + 2)
    assert np.array_equal(got["cand2__z"], nan, equal_nan=True)
    for odd in (["cand2__y"], "cand2__y", 7, None):  # a result the kernel rewrote: no alias, never a crash
        got_odd, _ = candidate_arrays(torch, {"cand": {"npz": shared["npz"], "same_as": odd}}, "cpu")
        assert "cand2__y" not in got_odd
    v = judge(["y"], {**got, "ref__y": a, "refB__y": a + 1}, {"y": (1e-3, 1e-3)}, check_tolerance=False)
    assert v.ok, v.message