"""The correctness verdict: element-wise comparison (|out - ref| <= atol + rtol*|ref|) and the guards that turn the
candidate's and the reference's arrays into one status (FIELD.md §2).

Plain numpy, in the judge: the reference's harness process, where the candidate's arrays arrive and the reference's
never leave (:func:`pytest_kopt.child.correctness.mode_judge`; its fast path on the GPU is
:mod:`pytest_kopt.child.judge`). The candidate's process produces arrays, never the verdict. Arrays are keyed
``<tag>__<output>`` with tags ``cand1`` (first call), ``cand2`` (second call, same inputs), ``candB`` (new values
in the same input buffers), ``candC`` (set B's values in new buffers), ``ref``/``refB`` (reference on those
inputs) and ``low_bf16``/``low_fp16`` (reference on inputs rounded to that precision).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, NamedTuple

import numpy as np


@dataclass(frozen=True, slots=True)
class Comparison:
    """Result for one output tensor: errors in the output's units; ``mismatch_pct`` in % of elements;
    ``first_bad`` holds up to 5 multi-indices of failing elements."""

    name: str
    shape: tuple[int, ...]
    ok: bool
    max_abs_err: float
    max_rel_err: float
    mismatched: int
    mismatch_pct: float
    nonfinite: int
    first_bad: tuple[tuple[int, ...], ...]
    #: elements that are finite in the output where the reference is NaN or Inf
    missed_nonfinite: int = 0
    #: NaN and Inf counts of each side
    nan_out: int = 0
    inf_out: int = 0
    nan_ref: int = 0
    inf_ref: int = 0
    #: the largest finite |reference| value: the output's scale
    max_ref_abs: float = 0.0

    @property
    def near_miss(self) -> bool:
        """A failure where every value is finite and the worst error is within 10x the tolerance at the output's
        scale and under ``NEAR_MISS_SCALE`` of that scale: what an fp32 sum in another order than the
        reference's reaches over a few thousand terms (eps 1.2e-7 x 4096 = 4.9e-4), not what a wrong index or an
        unwritten element gives."""
        return (not self.ok and not self.nonfinite and not self.missed_nonfinite and self.max_ref_abs > 0
                and self.max_abs_err <= NEAR_MISS_SCALE * self.max_ref_abs)

    def describe(self, atol: float, rtol: float) -> str:
        """One paragraph for a failure message."""
        total = int(np.prod(self.shape)) if self.shape else 1
        over = " over the elements finite on both sides" if self.nonfinite or self.missed_nonfinite else ""
        text = (f"output {self.name} {list(self.shape)}: {self.mismatched}/{total} elements "
                f"({self.mismatch_pct:.4g}%) outside atol={atol:g} + rtol={rtol:g}*|ref|; "
                f"max abs err {self.max_abs_err:.6g}, max rel err {self.max_rel_err:.6g}{over}")
        if self.nonfinite:
            text += f"; {self.nonfinite} NaN/Inf where the reference is finite (unwritten or overflowed)"
        if self.missed_nonfinite:
            text += (f"; {self.missed_nonfinite} finite where the reference is NaN/Inf (the output must be NaN where "
                     "the reference is NaN, and only there)")
        if self.nan_out or self.nan_ref or self.inf_out or self.inf_ref:
            text += (f"; NaN/Inf: output {self.nan_out}/{self.inf_out}, reference {self.nan_ref}/{self.inf_ref}")
        if self.first_bad:
            text += "; first bad indices " + ", ".join(str(list(i)) for i in self.first_bad)
        if self.near_miss and self.max_abs_err <= 10 * (atol + rtol * self.max_ref_abs):
            text += (f"; a near miss: the worst error is {self.max_abs_err / self.max_ref_abs:.2g} of the output's "
                     f"largest value ({self.max_ref_abs:.6g}), as an fp32 sum in another order than the reference's "
                     "can give: check that an honest fp32 implementation meets this tolerance before changing the "
                     "kernel")
        return text


#: A near miss (:attr:`Comparison.near_miss`) errs by at most this fraction of the output's largest value: fp32
#: rounding summed over ~4,000 terms in one direction (measured on an H200, 2026-12-02: a sequential fp32 layer
#: norm over rows of 4096 small integers erred by 3.0e-4 on outputs of about 15, 2e-5 of the scale).
NEAR_MISS_SCALE = 1e-3

#: Elements per block: the comparison runs block by block so its float64 temporaries stay small (8 MB each).
CHUNK = 1 << 20


class _Block(NamedTuple):
    """Figures of one block of :func:`compare`, merged in block order."""

    max_abs: float
    max_rel: float
    max_ref: float
    n_bad: int
    nonfinite: int
    missed: int
    counts: tuple[int, int, int, int]  # NaN out, Inf out, NaN ref, Inf ref
    err_all_finite: bool
    first_bad: np.ndarray  # flat indices of up to 5 failing elements


def _block(o_all: np.ndarray, r_all: np.ndarray, start: int, atol: float, rtol: float,
           scratch: tuple[np.ndarray, ...]) -> _Block:
    """One block of ``CHUNK`` elements from ``start``: where both sides are real and finite, the comparison in
    float64 in ``scratch`` (three float64 buffers and one bool buffer of ``CHUNK`` elements); otherwise the general
    path with the NaN/Inf rules, in float64 or complex128."""
    max_abs = max_rel = max_ref = 0.0
    nonfinite = missed = 0
    counts = [0, 0, 0, 0]
    err_all_finite = True
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        o_in, r_in = o_all[start:start + CHUNK], r_all[start:start + CHUNK]
        wide = np.complex128 if np.iscomplexobj(o_in) or np.iscomplexobj(r_in) else np.float64
        if wide is np.float64 and np.isfinite(o_in).all() and np.isfinite(r_in).all():
            # both sides finite: the rule in float64 in the scratch buffers (the difference of two float32 values
            # is exact in float64), six passes instead of the general path's dozen temporaries
            m = o_in.size
            err, absr, tmp, bad = (b[:m] for b in scratch)
            np.subtract(o_in, r_in, out=err, dtype=np.float64)
            np.abs(err, out=err)
            np.abs(r_in, out=absr, dtype=np.float64)
            np.multiply(absr, rtol, out=tmp)
            tmp += atol
            np.greater(err, tmp, out=bad)
            n_bad = int(np.count_nonzero(bad))
            first = start + np.flatnonzero(bad)[:5] if n_bad else np.empty(0, dtype=np.intp)
            if m:
                max_ref, max_abs = float(absr.max()), float(err.max())
                tmp.fill(0.0)
                np.divide(err, absr, out=tmp, where=absr > 0)
                max_rel = float(tmp.max())
            return _Block(max_abs, max_rel, max_ref, n_bad, 0, 0, (0, 0, 0, 0), True, first)
        # complex values keep their imaginary part: the error is the modulus of the difference
        o, r = o_in.astype(wide), r_in.astype(wide)
        fo, fr = np.isfinite(o), np.isfinite(r)
        err = np.abs(o - r)
        absr = np.abs(r)
        if fr.any():
            max_ref = float(absr[fr].max())
        same_nonfinite = ~fo & ~fr & ((o == r) | (np.isnan(o) & np.isnan(r)))
        # the tolerance applies where both sides are finite (a bound that overflows to inf, atol + rtol*|ref| past
        # 1.8e308, must not pass an Inf output); elsewhere only the same non-finite value passes
        bad = ~(((err <= atol + rtol * absr) & fr & fo) | same_nonfinite)
        nonfinite = int(np.count_nonzero(~fo & fr))
        missed = int(np.count_nonzero(fo & ~fr))
        for j, (side, fin) in enumerate(((o, fo), (r, fr))):
            nan = int(np.count_nonzero(np.isnan(side)))
            counts[2 * j] = nan
            counts[2 * j + 1] = int(np.count_nonzero(~fin)) - nan
        finite = np.isfinite(err)
        err_all_finite = bool(finite.all())
        if finite.any():
            max_abs = float(err[finite].max())
        rel = err / absr  # where |ref| = 0: inf or NaN, left out below
        relf = np.isfinite(rel)
        if relf.any():
            max_rel = float(rel[relf].max())
        n_bad = int(np.count_nonzero(bad))
        first = start + np.flatnonzero(bad)[:5] if n_bad else np.empty(0, dtype=np.intp)
    return _Block(max_abs, max_rel, max_ref, n_bad, nonfinite, missed, tuple(counts), err_all_finite, first)


def compare(name: str, out: np.ndarray, ref: np.ndarray, atol: float, rtol: float) -> Comparison:
    """Compare ``out`` with ``ref`` (same shape; any numeric dtype, compared in float64, or complex128 when either
    side is complex, with |out - ref| the modulus).

    An element passes when |out - ref| <= atol + rtol*|ref| (numpy.isclose's rule, asymmetric in ref). NaN or Inf
    in ``out`` fails unless ``ref`` holds the same non-finite value there. Evaluated in blocks of ``CHUNK``
    elements, in reused buffers where both sides are finite, with the general path (NaN and Inf rules) for the
    other blocks. Raises ValueError on a shape mismatch.
    """
    if out.shape != ref.shape:
        raise ValueError(f"output {name}: shape {list(out.shape)} but reference {list(ref.shape)}")
    o_all, r_all = out.reshape(-1), ref.reshape(-1)
    m = min(CHUNK, o_all.size)
    scratch = (np.empty(m), np.empty(m), np.empty(m), np.empty(m, dtype=bool))
    blocks = [_block(o_all, r_all, s, atol, rtol, scratch) for s in range(0, o_all.size, CHUNK)]
    n_bad = sum(b.n_bad for b in blocks)
    nonfinite = sum(b.nonfinite for b in blocks)
    max_abs = max((b.max_abs for b in blocks), default=0.0)
    counts = [sum(b.counts[j] for b in blocks) for j in range(4)]
    first: tuple[tuple[int, ...], ...] = ()
    if n_bad:
        flat = np.concatenate([b.first_bad for b in blocks])[:5]
        first = tuple(tuple(int(x) for x in np.unravel_index(i, out.shape)) for i in flat) if out.shape else ((),)
    if nonfinite and not all(b.err_all_finite for b in blocks):
        max_abs = float("inf")
    return Comparison(name=name, shape=tuple(out.shape), ok=n_bad == 0, max_abs_err=max_abs,
                      max_rel_err=max((b.max_rel for b in blocks), default=0.0), mismatched=n_bad,
                      mismatch_pct=100.0 * n_bad / max(1, out.size), nonfinite=nonfinite, first_bad=first,
                      missed_nonfinite=sum(b.missed for b in blocks), nan_out=counts[0], inf_out=counts[1],
                      nan_ref=counts[2], inf_ref=counts[3], max_ref_abs=max((b.max_ref for b in blocks), default=0.0))


@dataclass(frozen=True, slots=True)
class Verdict:
    """``status`` is PASSED or the first guard that failed; ``details`` one line per finding; ``figures`` the
    worst errors over all outputs, each output's from the comparison that decided it (the first call's, or the
    later one that failed: the second call on the same inputs, or the new values); ``warnings`` tolerance-sanity
    notes (never a failure)."""

    status: str
    message: str = ""
    details: tuple[str, ...] = ()
    figures: dict[str, float] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """True when every guard passed."""
        return self.status == "PASSED"


def _constant(a: np.ndarray) -> bool:
    if a.size < 2:
        return False
    flat = a.reshape(-1)
    return bool(np.all(flat == flat[0]))


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """The same values element by element, NaN equal to NaN (``np.array_equal(..., equal_nan=True)``, whose NaN masks cost
    ten plain comparisons, taken only when the plain comparison fails on a floating-point array)."""
    return np.array_equal(a, b) or (a.dtype.kind in "fc" and np.array_equal(a, b, equal_nan=True))


def tolerance_scale(low: np.ndarray, ref: np.ndarray, atol: float, rtol: float) -> float:
    """The largest error of ``low`` against ``ref`` as a multiple of the tolerance: max |low - ref| / (atol +
    rtol*|ref|). Tolerances scaled by less than this reject ``low``."""
    with np.errstate(invalid="ignore", divide="ignore"):
        r = ref.astype(np.float64)
        err = np.abs(low.astype(np.float64) - r)
        # an exact match fits any tolerance, even atol = rtol = 0 (0/0 would make the scale inf, the advice nan)
        ratio = np.where(err == 0, 0.0, err / (atol + rtol * np.abs(r)))
    finite = ratio[np.isfinite(ratio)]
    return float(finite.max()) if finite.size else float("inf")


def judge(outputs: list[str], arrays: Mapping[str, np.ndarray], tols: Mapping[str, tuple[float, float]],
          check_tolerance: bool = True, second_poison: Mapping[str, float] | None = None) -> Verdict:
    """Apply the guards in order and return the first failure, else PASSED.

    Order, per output: INCORRECT_SHAPE; UNWRITTEN (an element that still holds the poison after both calls on set A:
    NaN after the first, ``second_poison[output]`` after the second; caught even where the reference is NaN);
    CONSTANT_OUTPUT (all elements equal while the reference's are not: catches
    all-zero output that a loose atol would pass); INCORRECT_NUMERICAL (|out - ref| <= atol + rtol*|ref|, NaN/Inf
    fails); NONDETERMINISTIC (the second call on the same inputs fails: uninitialised reads, races); then set B
    (new values in the same buffers) must pass, else STALE_OUTPUT when the same values in new buffers (``candC``)
    pass (a result cached by address), INPUT_INDEPENDENT when the output is bit-identical to set A's while the
    reference's changed, INCORRECT_NUMERICAL otherwise. Tolerance warnings (``check_tolerance``, for outputs that
    passed; see :func:`tolerance_warnings`): the reference itself on inputs rounded to bf16/fp16 passes the
    tolerance, so a lower-precision kernel would too.
    """
    details: list[str] = []
    warnings: list[str] = []
    # per output, the comparison its figures come from: the first call's, or the later one that failed
    decided: dict[str, Comparison] = {}
    status = "PASSED"
    message = ""

    def fail(st: str, msg: str) -> None:
        nonlocal status, message
        if status == "PASSED":
            status, message = st, msg

    for name in outputs:
        atol, rtol = tols[name]
        c1, r = arrays[f"cand1__{name}"], arrays[f"ref__{name}"]
        if c1.shape != r.shape:
            fail("INCORRECT_SHAPE", f"output {name} has shape {list(c1.shape)}, the reference {list(r.shape)}")
            continue
        first: Comparison = compare(name, c1, r, atol, rtol)
        decided[name] = first
        c2 = arrays.get(f"cand2__{name}")
        if c2 is not None and (second_poison or {}).get(name) is not None and c2.shape == c1.shape:
            holes = np.isnan(c1) & (c2 == np.float64(second_poison[name]).astype(c2.dtype))  # type: ignore[index]
            if holes.any():
                idx = [list(map(int, np.unravel_index(i, c1.shape))) for i in np.flatnonzero(holes)[:5]]
                fail("UNWRITTEN", f"output {name}: {int(holes.sum())} element(s) left unwritten (the poison is still "
                     "there after two calls with different poisons), or accumulated into without being zeroed "
                     "(y += ... on the poison)")
                details.append(f"output {name}: unwritten at {', '.join(map(str, idx))}"
                               f"{' (the reference is NaN there too)' if np.isnan(r[tuple(idx[0])]) else ''}")
                continue
        if _constant(c1) and not _constant(r):
            fail("CONSTANT_OUTPUT", f"output {name}: every element is {c1.reshape(-1)[0]!r} but the reference's vary")
            details.append(f"output {name}: constant {c1.reshape(-1)[0]!r} ({first.describe(atol, rtol)})")
            continue
        if not first.ok:
            fail("INCORRECT_NUMERICAL", "output differs from the reference")
            details.append(first.describe(atol, rtol))
            at_ref_nan = [list(i) for i in first.first_bad if not np.isfinite(r[i])]
            if at_ref_nan:  # a kernel with a finite answer where the reference has none: suspect the reference
                details.append(f"output {name}: the reference itself is NaN/Inf at {', '.join(map(str, at_ref_nan))}"
                               "; check the reference (ref.py) before the kernel")
            continue
        later = [(tag, arrays[f"{tag}__{name}"].shape) for tag in ("cand2", "candB", "candC")
                 if f"{tag}__{name}" in arrays]
        odd = [f"{tag} {list(shape)}" for tag, shape in later if shape != r.shape]
        if odd:  # a call that returned another shape than the first (and the reference's)
            fail("INCORRECT_SHAPE", f"output {name} has shape {list(r.shape)} on the first call but "
                 f"{', '.join(odd)} on a later one")
            continue
        if f"cand2__{name}" in arrays and not _same(arrays[f"cand2__{name}"], c1):
            second = compare(name, arrays[f"cand2__{name}"], r, atol, rtol)
            if not second.ok:
                fail("NONDETERMINISTIC", f"output {name}: a second call on the same inputs is wrong "
                     "(reads of uninitialised memory or a race?)")
                decided[name] = second
                details.append("second call: " + second.describe(atol, rtol))
                continue
        if f"candB__{name}" in arrays and f"refB__{name}" in arrays:
            cb, rb = arrays[f"candB__{name}"], arrays[f"refB__{name}"]
            third = compare(name, cb, rb, atol, rtol)
            if not third.ok:
                decided[name] = third
                cc = arrays.get(f"candC__{name}")
                if cc is not None and compare(name, cc, rb, atol, rtol).ok:
                    fail("STALE_OUTPUT", f"output {name}: wrong after new values were written into the same input "
                         "buffers, right in new buffers (a result cached by address)")
                elif _same(cb, c1) and not _same(rb, r):
                    fail("INPUT_INDEPENDENT", f"output {name}: new input values give the identical output "
                         "(the result does not depend on the inputs, or was computed once and replayed)")
                else:
                    fail("INCORRECT_NUMERICAL", f"output {name}: wrong on a second set of input values")
                details.append("new values, same buffers: " + third.describe(atol, rtol))
                continue
        if check_tolerance:
            warnings += tolerance_warnings([name], arrays, tols)
    worst = {"max_abs_err": 0.0, "max_rel_err": 0.0, "mismatched": 0, "nan_out": 0, "inf_out": 0, "nan_ref": 0,
             "inf_ref": 0}
    for c in decided.values():
        worst["max_abs_err"] = max(worst["max_abs_err"], c.max_abs_err)
        worst["max_rel_err"] = max(worst["max_rel_err"], c.max_rel_err)
        for key in ("mismatched", "nan_out", "inf_out", "nan_ref", "inf_ref"):
            worst[key] += getattr(c, key)
    return Verdict(status=status, message=message, details=tuple(details), figures=worst, warnings=tuple(warnings))


def tolerance_warnings(outputs: list[str], arrays: Mapping[str, np.ndarray],
                       tols: Mapping[str, tuple[float, float]]) -> list[str]:
    """Tolerance sanity: for each output whose ``low_bf16__``/``low_fp16__`` array (the reference on inputs rounded
    to that precision) passes the tolerance against ``ref__``, a warning naming the tolerances that would reject it
    (scaled by :func:`tolerance_scale`). Depends on the reference and the inputs only, so it can be computed once
    per reference run and reused for every candidate."""
    warnings: list[str] = []
    for name in outputs:
        atol, rtol = tols[name]
        r = arrays[f"ref__{name}"]
        for tag, label in (("low_bf16", "bf16"), ("low_fp16", "fp16")):
            low = arrays.get(f"{tag}__{name}")
            if low is not None and compare(name, low, r, atol, rtol).ok:
                warnings.append(tolerance_warning(name, label, atol, rtol, tolerance_scale(low, r, atol, rtol)))
    return warnings


def tolerance_warning(name: str, label: str, atol: float, rtol: float, scale: float) -> str:
    """The warning for output ``name`` whose reference on inputs rounded to ``label`` (bf16, fp16) passes atol/rtol,
    naming the tolerances (scaled by ``scale``, :func:`tolerance_scale`) that would reject it."""
    return (f"output {name}: the reference on inputs rounded to {label} passes atol={atol:g}, rtol={rtol:g}, so a "
            f"{label} kernel could pass; tolerances below atol={atol * scale:.3g}, rtol={rtol * scale:.3g} would "
            "reject it")
