"""The plan of a case, made without allocating anything: the buffers a candidate's ``setup()`` (or a ``.cu``'s
``solve`` with the reference's ``shapes()``) describes, on torch's ``meta`` device, checked for layout, size and
names before any gate allocates them."""

from __future__ import annotations

from typing import Any

from . import HarnessError
from .inputs import (check_layout, check_spec, contiguous_stride, declared_shapes, def_line, spec_from_params,
                     spec_from_setup, taken, signature)
from .formats import load_candidate, load_reference
from .kernels import check_run_kernel
from .reference import trusted_scalars


def _scalars(values: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if isinstance(v, (int, float, str, bool))}


def mode_plan_candidate(req: dict[str, Any]) -> dict[str, Any]:
    """A Triton/Python candidate's ``setup(**dims, seed, device="meta")`` (under ``torch.device("meta")`` when it
    takes no ``device``): its spec and scalars, nothing allocated. A setup() that does not run on the meta device
    (a seeded ``torch.Generator``, say) gives ``spec`` None and the reason; the plan then takes the buffers from the
    reference's ``shapes()``. Raises HarnessError('contract') when the dims do not fit setup()'s parameters, or
    setup() builds a buffer that overlaps itself or has no elements, or run_kernel() does not take setup()'s inputs
    by name (:func:`~pytest_kopt.child.kernels.check_run_kernel`)."""
    import torch

    kernel = load_candidate(req["kernel"], load_reference(req["ref"], req.get("seed"),
                                                          precision=req.get("precision")))
    kwargs: dict[str, Any] = {**taken(kernel.setup, dict(req["dims"])), "seed": int(req["seed"])}
    sig = signature(kernel.setup, "setup", req["kernel"])
    if "device" in sig.parameters or any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values()):
        kwargs["device"] = "meta"
    try:
        sig.bind(**kwargs)
    except TypeError as exc:
        raise HarnessError("contract", f"{req['kernel']}: setup() cannot be called with --kopt-dims "
                           f"{req['dims']}: {exc}", fix="give every parameter setup() needs in --kopt-dims") from exc
    try:
        with torch.device("meta"):
            result = kernel.setup(**kwargs)
        spec, scalars, _, returned = spec_from_setup(torch, result, req["kernel"], keep=False,
                                                     inplace=req.get("inplace") or ())
    except HarnessError:
        raise
    except Exception as exc:  # the candidate's setup needs real memory: planned from ref.shapes() instead
        return {"spec": None, "scalars": {}, "meta_error": f"{type(exc).__name__}: {exc}"[:300]}
    check_layout(spec, req["kernel"])
    check_run_kernel(kernel.run_kernel, list(result["inputs"]), req["kernel"])
    return {"spec": spec, "scalars": _scalars(scalars), "returned": returned}


def mode_plan_reference(req: dict[str, Any]) -> dict[str, Any]:
    """In the reference's process: the spec of a ``.cu`` (``solve``'s parameters with ``shapes()``), or the
    candidate's (``req["spec"]``) checked against ``shapes()``; then the reference's parameters against the
    buffers and dims it will be given. Returns the spec. Raises HarnessError('contract') naming the buffer or
    parameter and the fix."""
    ref = load_reference(req["ref"], req.get("seed"), req.get("ref_sha"), req.get("precision"))
    dims = req["dims"]
    if not callable(getattr(ref, "reference", None)):
        raise HarnessError("contract", f"{req['ref']}: reference is not a function")
    if req["launcher"] == "solve":
        spec = spec_from_params(ref, req["ref"], req["params"], dims, {})
        check_layout(spec, req["ref"])
    elif req["spec"] is None:  # the candidate could not be planned on the meta device: what the reference declares
        spec = [{"name": n, "role": "unknown", "shape": shape, "dtype": dtype or "float32",
                 "stride": stride or contiguous_stride(shape), "source": "declared"}
                for n, (shape, dtype, stride) in declared_shapes(ref, dims, req["ref"]).items()]
        check_layout(spec, req["ref"])
        return {"spec": spec}
    else:
        spec = req["spec"]
        try:
            check_spec(ref, spec, dims, req["ref"])
        except HarnessError as exc:  # the candidate built the buffer: its setup() is what to change
            exc.path, exc.line = req.get("kernel"), def_line(req.get("kernel"), "setup")
            raise
    # what the reference is given: the buffers, the dims and its own make_inputs' values, never a setup() scalar
    # (a value the candidate chose could pick what the reference computes)
    given = {s["name"] for s in spec} | set(trusted_scalars(ref, req))
    sig = signature(ref.reference, "reference", req["ref"])
    missing = [p.name for p in sig.parameters.values()
               if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in given]
    if missing:
        raise HarnessError("contract", f"{req['ref']}: reference() takes {', '.join(missing)}, which the kernel's "
                           f"buffers ({', '.join(s['name'] for s in spec)}) and --kopt-dims do not provide",
                           fix="name reference()'s parameters after the kernel's buffers and dims; a value setup() "
                               "returns is the candidate's own: give the reference its value in --kopt-dims")
    return {"spec": spec}
