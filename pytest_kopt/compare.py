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


#: Elements per block: the comparison runs block by block so its float64 temporaries stay small (8 MB each).
CHUNK = 1 << 20


def compare(name: str, out: np.ndarray, ref: np.ndarray, atol: float, rtol: float) -> Comparison:
    """Compare ``out`` with ``ref`` (same shape; any numeric dtype, compared in float64).

    An element passes when |out - ref| <= atol + rtol*|ref| (numpy.isclose's rule, asymmetric in ref). NaN or Inf
    in ``out`` fails unless ``ref`` holds the same non-finite value there. Evaluated in blocks of ``CHUNK``
    elements, with a short path for blocks where both sides are finite. Raises ValueError on a shape mismatch.
    """
    if out.shape != ref.shape:
        raise ValueError(f"output {name}: shape {list(out.shape)} but reference {list(ref.shape)}")
    o_all, r_all = out.reshape(-1), ref.reshape(-1)
    max_abs = max_rel = 0.0
    n_bad = nonfinite = 0
    err_all_finite = True
    bad_idx: list[np.ndarray] = []
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        for start in range(0, o_all.size, CHUNK):
            o = o_all[start:start + CHUNK].astype(np.float64)
            r = r_all[start:start + CHUNK].astype(np.float64)
            fo, fr = np.isfinite(o), np.isfinite(r)
            err = np.abs(o - r)
            absr = np.abs(r)
            if fo.all() and fr.all():
                bad = err > atol + rtol * absr
                if err.size:
                    max_abs = max(max_abs, float(err.max()))
                    rel = np.divide(err, absr, out=np.zeros_like(err), where=absr > 0)
                    max_rel = max(max_rel, float(rel.max()))
            else:
                same_nonfinite = ~fo & ~fr & ((o == r) | (np.isnan(o) & np.isnan(r)))
                # a non-finite ref makes the bound inf (rtol > 0): only the same non-finite value may pass there
                bad = ~(((err <= atol + rtol * absr) & fr) | same_nonfinite)
                nonfinite += int(np.count_nonzero(~fo & fr))
                finite = np.isfinite(err)
                err_all_finite = err_all_finite and bool(finite.all())
                if finite.any():
                    max_abs = max(max_abs, float(err[finite].max()))
                rel = err / absr
                relf = np.isfinite(rel)
                if relf.any():
                    max_rel = max(max_rel, float(rel[relf].max()))
            k = int(np.count_nonzero(bad))
            if k:
                n_bad += k
                if sum(x.size for x in bad_idx) < 5:
                    bad_idx.append(start + np.flatnonzero(bad)[:5])
    first: tuple[tuple[int, ...], ...] = ()
    if n_bad:
        flat = np.concatenate(bad_idx)[:5]
        first = tuple(tuple(int(x) for x in np.unravel_index(i, out.shape)) for i in flat) if out.shape else ((),)
    if nonfinite and not err_all_finite:
        max_abs = float("inf")
    return Comparison(name=name, shape=tuple(out.shape), ok=n_bad == 0, max_abs_err=max_abs, max_rel_err=max_rel,
                      mismatched=n_bad, mismatch_pct=100.0 * n_bad / max(1, out.size), nonfinite=nonfinite,
                      first_bad=first)
