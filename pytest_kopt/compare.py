"""Element-wise comparison of a candidate's outputs with the reference's: |out - ref| <= atol + rtol*|ref|."""

from __future__ import annotations

from dataclasses import dataclass

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

    def describe(self, atol: float, rtol: float) -> str:
        """One paragraph for a failure message."""
        total = int(np.prod(self.shape)) if self.shape else 1
        text = (f"output {self.name} {list(self.shape)}: {self.mismatched}/{total} elements "
                f"({self.mismatch_pct:.4g}%) outside atol={atol:g} + rtol={rtol:g}*|ref|; "
                f"max abs err {self.max_abs_err:.6g}, max rel err {self.max_rel_err:.6g}")
        if self.nonfinite:
            text += f"; {self.nonfinite} NaN/Inf where the reference is finite (unwritten or overflowed)"
        if self.first_bad:
            text += "; first bad indices " + ", ".join(str(list(i)) for i in self.first_bad)
        return text


def compare(name: str, out: np.ndarray, ref: np.ndarray, atol: float, rtol: float) -> Comparison:
    """Compare ``out`` with ``ref`` (same shape; any numeric dtype, compared in float64).

    An element passes when |out - ref| <= atol + rtol*|ref| (numpy.isclose's rule, asymmetric in ref). NaN or Inf
    in ``out`` fails unless ``ref`` holds the same non-finite value there. Raises ValueError on a shape mismatch.
    """
    if out.shape != ref.shape:
        raise ValueError(f"output {name}: shape {list(out.shape)} but reference {list(ref.shape)}")
    o = out.astype(np.float64, copy=False)
    r = ref.astype(np.float64, copy=False)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        err = np.abs(o - r)
        bound = atol + rtol * np.abs(r)
        same_nonfinite = (~np.isfinite(o)) & (~np.isfinite(r)) & ((o == r) | (np.isnan(o) & np.isnan(r)))
        # a non-finite ref makes the bound inf (rtol > 0): only the same non-finite value may pass there
        bad = ~(((err <= bound) & np.isfinite(r)) | same_nonfinite)
        nonfinite = int(np.count_nonzero(~np.isfinite(o) & np.isfinite(r)))
        finite = np.isfinite(err)
        max_abs = float(err[finite].max()) if finite.any() else 0.0
        rel = err / np.abs(r)
        relf = np.isfinite(rel)
        max_rel = float(rel[relf].max()) if relf.any() else 0.0
    n_bad = int(np.count_nonzero(bad))
    first = tuple(tuple(int(x) for x in idx) for idx in np.argwhere(bad)[:5]) if n_bad else ()
    if nonfinite and not finite.all():
        max_abs = float("inf")
    return Comparison(name=name, shape=tuple(out.shape), ok=n_bad == 0, max_abs_err=max_abs, max_rel_err=max_rel,
                      mismatched=n_bad, mismatch_pct=100.0 * n_bad / max(1, out.size), nonfinite=nonfinite,
                      first_bad=first)
