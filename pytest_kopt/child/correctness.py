"""Correctness requests in a harness process: the candidate's four calls, the reference's outputs (in its own
process), and the reference on a timed call's inputs. Arrays only: the verdict is the pytest process's."""

from __future__ import annotations

import hashlib
import time
from typing import Any

from . import HarnessError
from .inputs import Inputs, check_spec, poison, returned_outputs
from .kernels import Candidate
from .formats import GpuModeReference, load_reference
from .transfer import repeats, save_npz, to_numpy

#: upstream's defaults when neither the command line nor the reference gives a tolerance
DEFAULT_ATOL = 1e-3
DEFAULT_RTOL = 1e-3


def guards(torch: Any, inp: Inputs, ptrs: dict[str, int], pristine: dict[str, Any],
           written_outputs: set[int] = frozenset()) -> dict[str, list[str]]:
    """After a call: buffers replaced or no longer plain tensors, and inputs the call modified (except the buffers
    at ``written_outputs``' addresses: a GPU MODE ``data`` that carries its output buffer, written and returned)."""
    found: dict[str, list[str]] = {"not_a_tensor": [], "buffer_replaced": [], "input_mutated": []}
    for s in inp.spec:
        t = inp.tensors[s["name"]]
        if type(t) is not torch.Tensor:
            found["not_a_tensor"].append(f"{s['name']} is {type(t).__module__}.{type(t).__qualname__}")
        elif t.data_ptr() != ptrs[s["name"]] or list(t.shape) != s["shape"]:
            found["buffer_replaced"].append(s["name"])
        elif s["role"] == "input" and t.data_ptr() not in written_outputs \
                and not torch.equal(t, pristine[s["name"]]):  # in-place outputs may change
            n = int((t != pristine[s["name"]]).sum())
            found["input_mutated"].append(f"{s['name']} ({n} elements changed)")
    return found


def _host(torch: Any, outs: dict[str, Any], tag: str, arrays: dict[str, Any]) -> None:
    for name, t in outs.items():
        arrays[f"{tag}__{name}"] = to_numpy(torch, t)


def _spoil(torch: Any, got: dict[str, Any], inp: Inputs | None = None) -> None:
    """Poison the memory of tensors a call returned once they are copied to the host, so that a later call's
    ``torch.empty`` that lands on it (the caching allocator reuses freed blocks) cannot inherit a right answer.
    A returned view of an input buffer (``return x.t()``) is left alone: its memory is the input's; a tensor that
    cannot be written here (made under ``torch.inference_mode``) is poisoned inside that mode."""
    shared = {t.untyped_storage().data_ptr() for t in (inp.tensors.values() if inp else ()) if t.numel()}
    for t in got.values():
        if not t.numel() or t.untyped_storage().data_ptr() in shared:
            continue
        with torch.inference_mode(t.is_inference()):  # an inference tensor is written inside that mode only
            poison(torch, t if t.is_inference() else t.detach())


def data_outputs(adapter: Any, got: dict[str, Any]) -> set[int]:
    """Addresses of returned tensors that may be input buffers written in place: a GPU MODE problem's ``data``
    carries its output buffer, which ``custom_kernel``/``ref_kernel`` write and return. Empty for other formats,
    where an input written is INPUT_MUTATED."""
    if getattr(adapter, "fmt", None) != "gpumode" and not isinstance(adapter, GpuModeReference):
        return set()
    return {t.data_ptr() for t in got.values() if getattr(t, "numel", lambda: 0)()}


def mode_candidate(req: dict[str, Any]) -> dict[str, Any]:
    """Correctness, candidate side. Inputs set A: call 1 and call 2 (outputs poisoned with NaN, then with
    :data:`~pytest_kopt.child.inputs.SECOND_POISON`, so an element left unwritten shows; in-place outputs get set A's
    values again); set B (new values written into the same input buffers, so a result cached by pointer shows):
    call 3; set B again in new buffers: call 4. Returned outputs are taken from each call's return value and their
    memory poisoned after the copy. Saves ``cand1__``, ``cand2__``, ``candB__``, ``candC__`` arrays (one equal to its
    twin of :data:`~pytest_kopt.child.transfer.REPEATS` is left out and named in ``same_as``) and reports the
    spec and the returned outputs' names for the reference process (``calls: 1``: the first call only)."""
    import numpy as np

    cand = Candidate(req)
    torch, inp = cand.torch, cand.inputs
    ptrs = {n: t.data_ptr() for n, t in inp.tensors.items()}
    pristine = {s["name"]: inp.tensors[s["name"]].clone() for s in inp.spec if s["role"] == "input"}
    inout = any(s["role"] == "inout" for s in inp.spec)
    arrays: dict[str, Any] = {}
    t0 = time.perf_counter()
    got = cand.run()
    first_ms = (time.perf_counter() - t0) * 1e3
    found = guards(torch, inp, ptrs, pristine, data_outputs(cand.kernel, got))
    if any(found.values()):
        return {"spec": inp.spec, "guards": found, "outputs": inp.outputs, "returned": sorted(got)}
    names = sorted(got)
    dtypes = {n: str(t.dtype).replace("torch.", "") for n, t in cand.results(got).items()}
    _host(torch, cand.results(got), "cand1", arrays)
    _spoil(torch, got, inp)
    if req.get("calls", 3) >= 2:
        if inout or getattr(cand.kernel, "fmt", None) == "gpumode":
            # the first call changed its in-place outputs (a GPU MODE data's output buffer, which its
            # generate_input may give zeroed): the same inputs again
            inp.fill(req["plan"], int(req["seed"]), cand.ref, cand.dims, cand.kept)
        inp.poison_outputs(second=True)
        got = cand.run()
        _host(torch, cand.results(got), "cand2", arrays)
        _spoil(torch, got, inp)
        inp.fill(req["plan"], int(req["seed_b"]), cand.ref, cand.dims, cand.kept)
        got = cand.run()
        _host(torch, cand.results(got), "candB", arrays)
        _spoil(torch, got, inp)
        # set B's values again, in freshly allocated buffers: tells "cached by address" from "ignores its inputs"
        cand.inputs = Inputs(torch, inp.spec, inp.scalars, cand.device)
        cand.inputs.fill(req["plan"], int(req["seed_b"]), cand.ref, cand.dims, cand.kept)
        got = cand.run()
        _host(torch, cand.results(got), "candC", arrays)
        cand.inputs = inp
    setup_sha = hashlib.sha256()
    for name, t in sorted(cand.kept.items()):
        arrays[f"setup__{name}"] = t.numpy()
        setup_sha.update(name.encode() + t.numpy().tobytes())
    t_save = time.perf_counter()
    same = repeats(arrays)
    np.savez(req["out"] + ".npz", **{k: a for k, a in arrays.items() if k not in same})
    return {"save_s": time.perf_counter() - t_save, "same_as": same, "spec": inp.spec,
            "setup_sha": setup_sha.hexdigest(),
            "scalars": {k: v for k, v in inp.scalars.items() if isinstance(v, (int, float, str))},
            "guards": found, "outputs": inp.outputs + names, "returned": names, "dtypes": dtypes, "first_call_ms": first_ms,
            "npz": req["out"] + ".npz"}


def reference_results(torch: Any, ref: Any, inp: Inputs, req: dict[str, Any]) -> dict[str, Any]:
    """Call ``reference(**kwargs)`` once on ``inp`` and return every output by name: the in-place buffers it wrote
    and the tensors it returned, named after the candidate's returned outputs (``req["returned"]``) or, when the
    candidate writes every output in place, after those buffers in order. Raises HarnessError('contract') when
    the reference raises, returns something else, or leaves an output unwritten."""
    try:
        value = ref.reference(**inp.kwargs())
    except Exception as exc:
        raise HarnessError("contract", f"{req['ref']}: reference() raised {type(exc).__name__}: {exc}") from exc
    if inp.device == "cuda":
        torch.cuda.synchronize()
    want = [n for n in (req.get("returned") or []) if n != "*"]
    declared = getattr(ref, "outputs", None)
    declared = [str(n) for n in declared] if isinstance(declared, (list, tuple)) else []
    # the reference names its own outputs (never the candidate: a name chosen there could pick a looser
    # tolerance): a dict by its keys, a tuple by ref.py's outputs = [...] (else out0, out1, ...), one tensor by
    # outputs[0], else by the one name the candidate returns
    own = list(inp.outputs) if not want else []  # a candidate writing in place: its buffers, in order
    if isinstance(value, (tuple, list)):
        names = declared if len(declared) == len(value) else own if len(own) == len(value) \
            else [f"out{i}" for i in range(len(value))]
    elif isinstance(value, torch.Tensor):
        names = declared[:1] or (want if len(want) == 1 else own if len(own) == 1 else ["out"])
    else:
        names = list(inp.outputs) or ["*"]
    got = returned_outputs(torch, value, names if not isinstance(value, dict) else ["*"], inp,
                           f"{req['ref']}: reference()", required=[])
    if req.get("returned") and not got:
        raise HarnessError("contract", f"{req['ref']}: reference() returned nothing, but the candidate returns its "
                           "outputs", fix="return the outputs from reference() too, or write them in place")
    out = dict(got)
    for name in inp.outputs:
        if name in got:
            continue
        t = inp.tensors[name]
        if t.numel() == 0:
            raise HarnessError("contract", f"output {name!r} has no elements, so nothing can be compared; "
                               "check --kopt-dims (a zero dim?)")
        if any(s["name"] == name and s["role"] == "output" for s in inp.spec):
            sentinel = torch.empty_like(t)
            poison(torch, sentinel)
            unwritten = bool(torch.isnan(t).all()) if t.dtype.is_floating_point else bool(torch.equal(t, sentinel))
            if unwritten:
                raise HarnessError("contract", f"{req['ref']}: reference() left output {name!r} unwritten (still "
                                   "the poison value); write outputs in place, e.g. C.copy_(A @ B), or return them")
        out[name] = t
    return out


def mode_reference(req: dict[str, Any]) -> dict[str, Any]:
    """Correctness, reference side, in its own process (the candidate can neither see nor patch it): the same
    inputs as the candidate (same spec, plan, seeds), ``reference(**kwargs)`` on set A and set B, and on set A with
    float inputs rounded to bf16 and fp16 (for the tolerance sanity check). Saves ``ref__``, ``refB__``,
    ``low_bf16__``, ``low_fp16__`` arrays."""
    import numpy as np
    import torch

    ref = load_reference(req["ref"], req.get("seed"))
    if not callable(getattr(ref, "reference", None)):
        raise HarnessError("contract", f"{req['ref']}: reference is not a function")
    device, dims = req["device"], req["dims"]
    check_spec(ref, req["spec"], dims, req["ref"])
    given = {}
    if req.get("setup_npz"):
        with np.load(req["setup_npz"]) as data:
            given = {k.removeprefix("setup__"): torch.from_numpy(data[k]).to(device)
                     for k in data.files if k.startswith("setup__")}
    inp = Inputs(torch, req["spec"], {**dims, **req.get("scalars", {})}, device)
    arrays: dict[str, Any] = {}
    names: list[str] = []
    written_ok: set[int] = set()

    def call(tag: str) -> None:
        nonlocal names
        outs = reference_results(torch, ref, inp, req)
        names = list(outs)
        written_ok.update(data_outputs(ref, outs))
        _host(torch, outs, tag, arrays)

    inp.fill(req["plan"], int(req["seed"]), ref, dims, given)
    before = {s["name"]: inp.tensors[s["name"]].clone() for s in inp.spec if s["role"] == "input"}
    call("ref")
    # an "input" the reference writes is an output the candidate's setup() did not list (so it was never compared)
    written = [n for n, t in before.items() if not torch.equal(t, inp.tensors[n])
               and inp.tensors[n].data_ptr() not in written_ok]
    if written:
        raise HarnessError("contract", f"reference() wrote {', '.join(map(repr, written))}, which the candidate "
                           "lists as input(s): every buffer the reference writes must be among setup()'s outputs",
                           fix="list it among the outputs; if it is an input the operation changes in place (as "
                               "x.clamp_() does), name it in ref.py: inplace = [" + repr(written[0]) + "]")
    low = [s for s in inp.spec if s["role"] in ("input", "inout") and s["dtype"] in ("float32", "float64")]
    if low and req.get("low_precision", True):
        for dtype in ("bfloat16", "float16"):
            inp.fill(req["plan"], int(req["seed"]), ref, dims, given)
            changed = False
            for s in low:
                t = inp.tensors[s["name"]]
                rounded = t.to(getattr(torch, dtype)).to(t.dtype)
                changed = changed or not torch.equal(t, rounded)
                t.copy_(rounded)
            if not changed:
                continue  # e.g. small integers: exact in this precision, so the check says nothing
            call(f"low_{'bf16' if dtype == 'bfloat16' else 'fp16'}")
    inp.fill(req["plan"], int(req["seed_b"]), ref, dims, given)
    call("refB")
    npz_sha = save_npz(req["out"] + ".npz", arrays)
    tol = {name: tolerances(ref, name, req.get("atol"), req.get("rtol")) for name in names}
    return {"npz": req["out"] + ".npz", "npz_sha": npz_sha, "tolerances": tol}


def mode_reference_fp64(req: dict[str, Any]) -> dict[str, Any]:
    """The reference on set A with every floating-point buffer in float64 (the values of set A, upcast): what the
    reference computes when rounding is out of the picture, to tell whether the reference itself meets its
    tolerance. Saves ``hi__`` arrays. Raises HarnessError('contract') when the reference does not run in float64."""
    import numpy as np
    import torch

    ref = load_reference(req["ref"], req.get("seed"))
    device, dims = req["device"], req["dims"]
    given = {}
    if req.get("setup_npz"):
        with np.load(req["setup_npz"]) as data:
            given = {k.removeprefix("setup__"): torch.from_numpy(data[k]).to(device)
                     for k in data.files if k.startswith("setup__")}
    native = Inputs(torch, req["spec"], {**dims, **req.get("scalars", {})}, device)
    native.fill(req["plan"], int(req["seed"]), ref, dims, given)
    wide = [{**b, "dtype": "float64" if getattr(torch, b["dtype"]).is_floating_point else b["dtype"],
             "stride": list(b["stride"])} for b in req["spec"]]
    hi = Inputs(torch, wide, native.scalars, device)
    for b in req["spec"]:
        hi.tensors[b["name"]].copy_(native.tensors[b["name"]])
    hi.poison_outputs()
    try:
        outs = reference_results(torch, ref, hi, req)
    except HarnessError as exc:
        raise HarnessError("contract", f"{req['ref']}: reference() does not run in float64 ({exc})") from exc
    npz_sha = save_npz(req["out"] + ".npz", {f"hi__{n}": to_numpy(torch, t) for n, t in outs.items()})
    return {"npz": req["out"] + ".npz", "npz_sha": npz_sha}


def mode_check_outputs(req: dict[str, Any]) -> dict[str, Any]:
    """Reference side of the timing gate's output check: the reference on the inputs saved from a timed call."""
    import numpy as np
    import torch

    ref = load_reference(req["ref"], req.get("seed"))
    dims = req["dims"]
    check_spec(ref, req["spec"], dims, req["ref"])
    inp = Inputs(torch, req["spec"], {**dims, **req.get("scalars", {})}, req["device"])
    with np.load(req["inputs_npz"]) as data:
        for s in inp.spec:
            if s["role"] in ("input", "inout"):
                t = inp.tensors[s["name"]]
                t.copy_(torch.from_numpy(data[f"in__{s['name']}"]).to(t.dtype))
    inp.poison_outputs()
    outs = reference_results(torch, ref, inp, req)
    npz_sha = save_npz(req["out"] + ".npz", {f"ref__{n}": to_numpy(torch, t) for n, t in outs.items()})
    return {"npz": req["out"] + ".npz", "npz_sha": npz_sha,
            "tolerances": {n: tolerances(ref, n, req.get("atol"), req.get("rtol")) for n in outs}}


def tolerances(ref: Any, name: str, atol_cli: float | None, rtol_cli: float | None) -> dict[str, Any]:
    """(atol, rtol) of output ``name``: the command line, else the reference's (a number, or a dict keyed by output
    name), else 1e-3 / 1e-3 (upstream's defaults); with where each came from. Raises HarnessError('contract') when
    the reference gives per-output tolerances and none for ``name`` (an output named otherwise would escape them)."""
    out: dict[str, Any] = {}
    for key, cli in (("atol", atol_cli), ("rtol", rtol_cli)):
        v = getattr(ref, key, None)
        if cli is None and isinstance(v, dict) and name not in v:
            raise HarnessError("contract", f"output {name!r} has no {key} in ref.py's {key} = {v!r}",
                               fix=f"key the tolerances by the outputs' names ({', '.join(map(repr, v))}): name the "
                                   "outputs alike in setup()'s outputs and ref.py's outputs = [...], or give one number")
    for key, cli, default in (("atol", atol_cli, DEFAULT_ATOL), ("rtol", rtol_cli, DEFAULT_RTOL)):
        if cli is not None:
            out[key], out[f"{key}_source"] = float(cli), f"--kopt-{key}"
            continue
        v = getattr(ref, key, None)
        if isinstance(v, dict):
            v = v.get(name)
        if v is None:
            out[key], out[f"{key}_source"] = default, "default"
            continue
        try:
            value = float(v)
        except (TypeError, ValueError):
            value = float("nan")
        # NaN would pass every finite element (err > NaN is False), as would an infinite or negative bound
        if not (0.0 <= value < float("inf")):
            where = getattr(ref, "__file__", None) or "ref.py"
            raise HarnessError("contract", f"{where}: {key} for output {name!r} is {v!r}; a tolerance must be "
                               "a finite number >= 0", fix=f"set {key} in ref.py to a finite non-negative number "
                               "(e.g. 1e-3), or give --kopt-" + key)
        out[key], out[f"{key}_source"] = value, f"ref.{key}"
    return out
