"""The verdict where the arrays are: the guards of :func:`pytest_kopt.child.verdict.judge` in torch, float64, on the
device that holds the candidate's and the reference's outputs, for the case where every guard passes; every other
case goes to the verdict's numpy path on the host (:class:`HostArrays`), which finds the first failure and words it.

The fast path is sound by construction: it returns figures only when each guard of the numpy path passes on the
same values with the same arithmetic (IEEE float64 differences, products and sums, as numpy does them), and it
declines (``None``) wherever the two could part: an error or a relative error that overflows to infinity, shapes
that differ, complex values. It runs in the reference's harness process, so the reference's outputs never leave
it and only verdict figures cross to the pytest process.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Iterator

#: Elements per block of the fast path: its float64 temporaries stay at 128 MB each.
CHUNK = 1 << 24


def host_dtype(torch: Any, t: Any) -> Any:
    """The tensor as the host judge sees it: bf16 and fp8 widened to float32 (which holds every value exactly),
    as :func:`pytest_kopt.child.transfer.to_numpy` hands arrays over."""
    if t.dtype in (torch.bfloat16, getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e5m2", None)):
        return t.float()
    return t


def compare_fast(torch: Any, out: Any, ref: Any, atol: float, rtol: float) -> dict[str, float] | None | bool:
    """:func:`pytest_kopt.child.verdict.compare` on tensors of one device, for the pass: the figures
    (``max_abs_err``, ``max_rel_err``, ``max_ref_abs``, ``nan_out``, ``inf_out``, ``nan_ref``, ``inf_ref``) when
    every element passes (|out - ref| <= atol + rtol*|ref| in float64, or the same non-finite value on both
    sides); False when an element fails; None when this path cannot tell with numpy's figures (complex values, a
    shape mismatch, an error or relative error that overflows)."""
    if out.shape != ref.shape or out.is_complex() or ref.is_complex():
        return None
    o_all, r_all = host_dtype(torch, out).reshape(-1), host_dtype(torch, ref).reshape(-1)
    fig = {"max_abs_err": 0.0, "max_rel_err": 0.0, "max_ref_abs": 0.0, "nan_out": 0, "inf_out": 0, "nan_ref": 0,
           "inf_ref": 0}
    f64 = torch.float64
    for start in range(0, o_all.numel(), CHUNK):
        o = o_all[start:start + CHUNK].to(f64)
        r = r_all[start:start + CHUNK].to(f64)
        fo, fr = torch.isfinite(o), torch.isfinite(r)
        err = (o - r).abs_()
        absr = r.abs()
        bound = absr * rtol
        bound += atol
        both = fo & fr
        ok_elem = (err <= bound) & both
        if not bool(both.all()):
            # the same non-finite value on both sides passes there (NaN with NaN, +-Inf with the same Inf)
            ok_elem |= ~fo & ~fr & ((o == r) | (torch.isnan(o) & torch.isnan(r)))
        if not bool(ok_elem.all()):
            return False
        if not bool(torch.isfinite(err[both]).all()):
            return None  # numpy's two block paths take an overflowed error differently
        if bool(both.any()):
            fig["max_abs_err"] = max(fig["max_abs_err"], float(err[both].max()))
            fig["max_ref_abs"] = max(fig["max_ref_abs"], float(absr[fr].max()))
            pos = both & (absr > 0)
            if bool(pos.any()):
                rel = err[pos] / absr[pos]
                if not bool(torch.isfinite(rel).all()):
                    return None
                fig["max_rel_err"] = max(fig["max_rel_err"], float(rel.max()))
        for side, fin, nan_key, inf_key in ((o, fo, "nan_out", "inf_out"), (r, fr, "nan_ref", "inf_ref")):
            nan = int(torch.isnan(side).sum())
            fig[nan_key] += nan
            fig[inf_key] += int((~fin).sum()) - nan
    return fig


def _same(torch: Any, a: Any, b: Any) -> bool:
    """:func:`pytest_kopt.child.verdict._same` on tensors: equal values, NaN equal to NaN."""
    if a.shape != b.shape:
        return False
    a, b = host_dtype(torch, a), host_dtype(torch, b)
    if a.dtype != b.dtype:  # numpy compares across dtypes by value
        a, b = a.to(torch.float64), b.to(torch.float64)
    if bool(torch.equal(a, b)):
        return True
    if a.is_floating_point() or a.is_complex():
        return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())
    return False


def _constant(a: Any) -> bool:
    if a.numel() < 2:
        return False
    flat = a.reshape(-1)
    return bool((flat == flat[0]).all())


def judge_fast(torch: Any, outputs: list[str], arrays: Mapping[str, Any], tols: Mapping[str, tuple[float, float]],
               second_poison: Mapping[str, float | None] | None = None) -> dict[str, float] | None:
    """The figures :func:`pytest_kopt.child.verdict.judge` reports for a PASSED verdict (``check_tolerance``
    False), when every guard passes on ``arrays`` (tensors keyed ``<tag>__<output>``, one device); None when any
    guard fails or this path cannot decide, so the caller runs the numpy judge."""
    worst = {"max_abs_err": 0.0, "max_rel_err": 0.0, "mismatched": 0, "nan_out": 0, "inf_out": 0, "nan_ref": 0,
             "inf_ref": 0}
    for name in outputs:
        atol, rtol = tols[name]
        c1, r = arrays.get(f"cand1__{name}"), arrays.get(f"ref__{name}")
        if c1 is None or r is None or c1.shape != r.shape:
            return None
        if any(arrays[f"{tag}__{name}"].shape != r.shape for tag in ("cand2", "candB", "candC")
               if f"{tag}__{name}" in arrays):
            return None  # INCORRECT_SHAPE
        c2 = arrays.get(f"cand2__{name}")
        poison = (second_poison or {}).get(name)
        if c2 is not None and poison is not None and c2.shape == c1.shape:
            h1, h2 = host_dtype(torch, c1), host_dtype(torch, c2)
            if h1.is_floating_point() and bool((torch.isnan(h1) & (h2 == torch.tensor(poison, dtype=torch.float64)
                                                                    .to(h2.dtype).to(h2.device))).any()):
                return None  # UNWRITTEN
        if _constant(host_dtype(torch, c1)) and not _constant(host_dtype(torch, r)):
            return None
        first = compare_fast(torch, c1, r, atol, rtol)
        if not isinstance(first, dict):
            return None
        if c2 is not None and not _same(torch, c2, c1) and not isinstance(compare_fast(torch, c2, r, atol, rtol), dict):
            return None
        cb, rb = arrays.get(f"candB__{name}"), arrays.get(f"refB__{name}")
        if cb is not None and rb is not None and not isinstance(compare_fast(torch, cb, rb, atol, rtol), dict):
            return None
        worst["max_abs_err"] = max(worst["max_abs_err"], first["max_abs_err"])
        worst["max_rel_err"] = max(worst["max_rel_err"], first["max_rel_err"])
        for key in ("nan_out", "inf_out", "nan_ref", "inf_ref"):
            worst[key] += first[key]
    return worst


def tolerance_scale_fast(torch: Any, low: Any, ref: Any, atol: float, rtol: float) -> float:
    """:func:`pytest_kopt.child.verdict.tolerance_scale` on tensors: max |low - ref| / (atol + rtol*|ref|) over the
    finite ratios (an exact match counts 0), inf when none is finite."""
    r = host_dtype(torch, ref).reshape(-1).to(torch.float64)
    err = (host_dtype(torch, low).reshape(-1).to(torch.float64) - r).abs_()
    ratio = torch.where(err == 0, torch.zeros_like(err), err / (r.abs() * rtol + atol))
    finite = ratio[torch.isfinite(ratio)]
    return float(finite.max()) if finite.numel() else float("inf")


class HostArrays(Mapping):
    """A read-only mapping of tensors as numpy arrays, each copied to the host on first access (bf16 and fp8 as
    float32) and kept: the numpy judge reads only the arrays its guards need. A value that is already a numpy
    array (read from an ``.npz`` on the CPU) is passed through."""

    def __init__(self, torch: Any, tensors: Mapping[str, Any]) -> None:
        self._torch, self._src, self._cache = torch, tensors, {}

    def __getitem__(self, name: str) -> Any:
        if name not in self._cache:
            if not isinstance(self._src[name], self._torch.Tensor):
                return self._src[name]
            t = host_dtype(self._torch, self._src[name]).detach()
            self._cache[name] = t.cpu().numpy().copy() if t.device.type != "cpu" else t.numpy()
        return self._cache[name]

    def __contains__(self, name: object) -> bool:
        return name in self._src

    def __iter__(self) -> Iterator[str]:
        return iter(self._src)

    def __len__(self) -> int:
        return len(self._src)
