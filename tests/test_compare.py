"""Tests for pytest_kopt.child.verdict: |out - ref| <= atol + rtol*|ref| on small hand-made arrays."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pytest_kopt.child.verdict import Comparison, compare


def test_identical_arrays_pass():
    ref = np.arange(12, dtype=np.float32).reshape(3, 4)
    c = compare("C", ref.copy(), ref, atol=0.0, rtol=0.0)
    assert c == Comparison(name="C", shape=(3, 4), ok=True, max_abs_err=0.0, max_rel_err=0.0, mismatched=0,
                           mismatch_pct=0.0, nonfinite=0, first_bad=(), max_ref_abs=11.0)


def test_exact_errors_and_first_bad():
    ref = np.array([[1.0, 2.0, 4.0], [8.0, -16.0, 0.5]])
    out = np.array([[1.0, 2.5, 4.0], [8.0, -15.0, 0.5]])
    # errors: 0.5 at (0,1) (bound 0.1 + 0.01*2 = 0.12), 1.0 at (1,1) (bound 0.1 + 0.16 = 0.26)
    c = compare("y", out, ref, atol=0.1, rtol=0.01)
    assert c.ok is False
    assert c.shape == (2, 3)
    assert c.max_abs_err == 1.0
    assert c.max_rel_err == 0.25  # 0.5/2 beats 1/16
    assert c.mismatched == 2
    assert c.mismatch_pct == pytest.approx(100.0 * 2 / 6)
    assert c.nonfinite == 0
    assert c.first_bad == ((0, 1), (1, 1))


def test_tolerance_boundary_is_inclusive():
    ref = np.array([0.0, 4.0])
    out = np.array([0.25, 4.75])  # exactly atol + rtol*|ref| = 0.25 + 0.125*{0, 4} = {0.25, 0.75}
    c = compare("y", out, ref, atol=0.25, rtol=0.125)
    assert c.ok is True
    assert c.mismatched == 0
    assert c.max_abs_err == 0.75
    assert c.max_rel_err == 0.75 / 4.0  # the element with ref 0 has no relative error


def test_rule_is_asymmetric_in_ref():
    # |out-ref| = 1; bound uses |ref|: ref=10 -> 0.1*10 = 1 passes, ref=9 -> 0.9 fails
    assert compare("y", np.array([9.0]), np.array([10.0]), atol=0.0, rtol=0.1).ok is True
    assert compare("y", np.array([10.0]), np.array([9.0]), atol=0.0, rtol=0.1).ok is False


def test_first_bad_keeps_five_in_c_order():
    ref = np.zeros((3, 4), dtype=np.float32)
    out = ref.copy()
    out[0, 3] = out[1, 0] = out[1, 2] = out[2, 0] = out[2, 1] = out[2, 3] = 1.0
    c = compare("C", out, ref, atol=1e-3, rtol=0.0)
    assert c.mismatched == 6
    assert c.mismatch_pct == 50.0
    assert c.first_bad == ((0, 3), (1, 0), (1, 2), (2, 0), (2, 1))
    assert all(type(i) is int for idx in c.first_bad for i in idx)
    assert c.max_rel_err == 0.0  # every ref is 0: no finite relative error


def test_nonzero_error_over_zero_ref_emits_no_warning():
    with np.errstate(all="raise"):  # numpy would raise FloatingPointError for any unsuppressed warning
        c = compare("y", np.array([1.0, 0.0, 2.0]), np.array([0.0, 0.0, 1.0]), atol=0.0, rtol=0.0)
    assert c.mismatched == 2
    assert c.max_abs_err == 1.0
    assert c.max_rel_err == 1.0


def test_nan_in_output_fails():
    ref = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    out = np.array([1.0, np.nan, 3.0], dtype=np.float32)
    c = compare("out", out, ref, atol=1.0, rtol=1.0)
    assert c.ok is False
    assert c.mismatched == 1
    assert c.nonfinite == 1
    assert c.first_bad == ((1,),)
    assert c.max_abs_err == math.inf
    assert c.max_rel_err == 0.0


def test_inf_in_output_fails():
    c = compare("out", np.array([np.inf, 1.0]), np.array([1.0, 1.0]), atol=1e30, rtol=0.0)
    assert c.ok is False
    assert c.nonfinite == 1
    assert c.max_abs_err == math.inf


def test_matching_nan_and_inf_pass():
    ref = np.array([np.nan, np.inf, -np.inf, 1.0])
    out = np.array([np.nan, np.inf, -np.inf, 1.5])
    c = compare("out", out, ref, atol=0.5, rtol=0.0)
    assert c.ok is True
    assert c.mismatched == 0
    assert c.nonfinite == 0
    assert c.max_abs_err == 0.5
    assert c.max_rel_err == 0.5


@pytest.mark.parametrize("out_value", [-np.inf, np.nan, 5.0])
def test_non_finite_ref_needs_the_same_value(out_value):
    c = compare("out", np.array([out_value]), np.array([np.inf]), atol=1e9, rtol=1e9)
    assert c.ok is False
    assert c.mismatched == 1
    assert c.nonfinite == 0  # counted only where the reference is finite


def test_shape_mismatch_raises():
    with pytest.raises(ValueError, match=r"output C: shape \[2, 3\] but reference \[3, 2\]"):
        compare("C", np.zeros((2, 3)), np.zeros((3, 2)), atol=0.0, rtol=0.0)


def test_same_size_different_rank_is_a_mismatch():
    with pytest.raises(ValueError, match=r"shape \[6\] but reference \[1, 6\]"):
        compare("C", np.zeros(6), np.zeros((1, 6)), atol=0.0, rtol=0.0)


def _to_bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 precision (round to nearest even on the top 16 bits), kept as float32."""
    bits = x.astype(np.float32).view(np.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32)


def test_bf16_like_values_within_bf16_tolerance():
    ref = np.array([1.0, 3.14159265, -2.71828183, 1000.1], dtype=np.float32)
    out = _to_bf16(ref)
    assert out.tolist() == [1.0, 3.140625, -2.71875, 1000.0]
    c = compare("y", out, ref, atol=0.0, rtol=2.0**-8)
    assert c.ok is True
    assert c.max_abs_err == float(np.float32(1000.1)) - 1000.0 == 0.0999755859375
    # the same data fail a float32-grade tolerance on the three rounded elements
    strict = compare("y", out, ref, atol=1e-6, rtol=1e-6)
    assert strict.mismatched == 3
    assert strict.first_bad == ((1,), (2,), (3,))


def test_int_arrays_exact():
    ref = np.array([[1, 2], [3, 4]], dtype=np.int32)
    out = np.array([[1, 2], [3, 7]], dtype=np.int32)
    c = compare("idx", out, ref, atol=0.0, rtol=0.0)
    assert c.ok is False
    assert c.max_abs_err == 3.0
    assert c.max_rel_err == 0.75
    assert c.mismatched == 1
    assert c.mismatch_pct == 25.0
    assert c.first_bad == ((1, 1),)


def test_unsigned_ints_do_not_wrap():
    c = compare("u", np.array([0], dtype=np.uint8), np.array([255], dtype=np.uint8), atol=0.0, rtol=0.0)
    assert c.max_abs_err == 255.0
    assert c.max_rel_err == 1.0


def test_scalar_arrays():
    c = compare("s", np.array(2.0), np.array(1.0), atol=0.0, rtol=0.0)
    assert c.shape == ()
    assert c.mismatched == 1
    assert c.mismatch_pct == 100.0
    assert c.first_bad == ((),)


def test_empty_arrays_pass():
    c = compare("e", np.zeros((0, 4)), np.zeros((0, 4)), atol=0.0, rtol=0.0)
    assert c.ok is True
    assert c.max_abs_err == 0.0
    assert c.mismatch_pct == 0.0


def test_describe_failure_text():
    ref = np.array([[1.0, 2.0, 4.0], [8.0, -16.0, 0.5]])
    out = np.array([[1.0, 2.5, 4.0], [8.0, -15.0, np.nan]])
    c = compare("y", out, ref, atol=0.1, rtol=0.01)
    text = c.describe(0.1, 0.01)
    assert text == ("output y [2, 3]: 3/6 elements (50%) outside atol=0.1 + rtol=0.01*|ref|; "
                    "max abs err inf, max rel err 0.25 over the elements finite on both sides; "
                    "1 NaN/Inf where the reference is finite (unwritten or overflowed); "
                    "NaN/Inf: output 1/0, reference 0/0; "
                    "first bad indices [0, 1], [1, 1], [1, 2]")


def test_describe_passing_text_has_zero_counts():
    ref = np.ones(4, dtype=np.float32)
    text = compare("z", ref, ref, atol=1e-5, rtol=1e-5).describe(1e-5, 1e-5)
    assert text == ("output z [4]: 0/4 elements (0%) outside atol=1e-05 + rtol=1e-05*|ref|; "
                    "max abs err 0, max rel err 0")


def test_finite_blocks_in_scratch_buffers_agree_with_the_general_path(monkeypatch) -> None:
    """Blocks of 1000 (most finite, taking the scratch-buffer path; one holding NaN and Inf) give the figures of one
    block through the general path: counts, maxima, the first bad indices in element order (planted in the last,
    partial block and in the first ones)."""
    from pytest_kopt.child import verdict

    rng = np.random.default_rng(3)
    ref = rng.standard_normal(10_500).astype(np.float32)
    ref[100] = 0.0  # |ref| = 0: no relative error there
    out = ref.copy()
    out[[10_400, 10_401]] += 1.0
    out[[7, 2_500, 2_501]] -= 0.5
    out[5_000] = np.nan
    ref[6_000] = out[6_000] = np.inf
    whole = verdict.compare("y", out.reshape(105, 100), ref.reshape(105, 100), 1e-3, 1e-3)
    monkeypatch.setattr(verdict, "CHUNK", 1000)
    blocks = verdict.compare("y", out.reshape(105, 100), ref.reshape(105, 100), 1e-3, 1e-3)
    assert blocks == whole
    assert blocks.mismatched == 6 and blocks.nonfinite == 1 and blocks.nan_out == 1
    assert blocks.inf_out == 1 and blocks.inf_ref == 1 and blocks.max_abs_err == float("inf")
    assert blocks.first_bad == ((0, 7), (25, 0), (25, 1), (50, 0), (104, 0))
    out[5_000], ref[6_000], out[6_000] = ref[5_000], 1.0, 1.0  # all finite: every block on the scratch path
    finite = verdict.compare("y", out, ref, 1e-3, 1e-3)
    err = np.abs(out.astype(np.float64) - ref.astype(np.float64))
    assert finite.max_abs_err == err.max() and finite.mismatched == 5
    absr = np.abs(ref.astype(np.float64))
    assert finite.max_rel_err == (err[absr > 0] / absr[absr > 0]).max()
    assert finite.max_ref_abs == absr.max()
