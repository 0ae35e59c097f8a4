"""Correctness requests in a harness process: the candidate's four calls (its outputs kept for the judge), and the
judge in the reference's own process: the reference's outputs, the verdict on the candidate's arrays, and the
reference on a timed call's inputs. Only verdict figures go back to the pytest process."""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, NamedTuple

from . import HarnessError
from .inputs import Inputs, check_spec, poison, returned_outputs
from .kernels import Candidate
from .formats import GpuModeReference, load_reference
from .transfer import REPEATS, to_numpy

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


class Keeper:
    """The candidate's outputs of each call, kept for the judge in the reference's process. On a GPU each is copied
    into an allocation of its own and exported by CUDA IPC (:mod:`pytest_kopt.child.share`); on the CPU, or where
    the driver refuses IPC, each is copied to the host for an ``.npz``. An array equal to its twin of
    :data:`~pytest_kopt.child.transfer.REPEATS` (same dtype, shape and values; NaN never equal) is not kept but named
    in ``same_as``."""

    def __init__(self, torch: Any, device: str, ipc: bool = True) -> None:
        self.torch = torch
        self.ipc = device == "cuda" and ipc
        #: name -> the kept copy (a device tensor over the exported allocation, or a numpy array)
        self.kept: dict[str, Any] = {}
        self.descriptors: dict[str, dict[str, Any]] = {}
        self.same_as: dict[str, str] = {}
        #: why IPC was not used on a GPU (the driver's refusal), else None
        self.note: str | None = None

    def _equal(self, a: Any, b: Any) -> bool:
        torch = self.torch
        if isinstance(a, torch.Tensor):
            return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a, b))
        import numpy as np

        return a.dtype == b.dtype and a.shape == b.shape and bool(np.array_equal(a, b))

    def add(self, tag: str, outs: dict[str, Any]) -> None:
        """Keep one call's outputs as ``<tag>__<name>``."""
        from . import share

        for name, t in outs.items():
            key = f"{tag}__{name}"
            twin = next((earlier + name for later, earlier in REPEATS if key == later + name), None)
            if self.ipc:
                try:
                    if twin in self.kept and self._equal(t, self.kept[twin]):
                        self.same_as[key] = twin
                        continue
                    self.descriptors[key], self.kept[key] = share.export(self.torch, t)
                    continue
                except share.ShareError as exc:  # no IPC here: the host copies of an .npz instead
                    self.note = str(exc)
                    self.ipc = False
                    self.kept = {k: to_numpy(self.torch, v) for k, v in self.kept.items()}
                    self.descriptors = {}
                    share.release()
            a = to_numpy(self.torch, t)
            if twin in self.kept and self._equal(a, self.kept[twin]):
                self.same_as[key] = twin
                continue
            self.kept[key] = a

    def result(self, out: str, extra: dict[str, Any]) -> dict[str, Any]:
        """What the candidate's result says of the arrays: ``transport`` (``ipc`` or ``npz``), ``arrays`` (IPC
        descriptors), ``npz`` (the host copies and ``extra``, e.g. a ``setup()``'s integer tensors; None when
        there is nothing to save), ``same_as``, ``transport_note``."""
        import numpy as np

        host = {**(self.kept if not self.ipc else {}), **extra}
        npz = None
        if host:
            npz = out + ".npz"
            np.savez(npz, **host)
        return {"transport": "ipc" if self.ipc else "npz", "arrays": self.descriptors, "npz": npz,
                "same_as": self.same_as, "transport_note": self.note}


def mode_candidate(req: dict[str, Any]) -> dict[str, Any]:
    """Correctness, candidate side. Inputs set A: call 1 and call 2 (outputs poisoned with NaN, then with
    :data:`~pytest_kopt.child.inputs.SECOND_POISON`, so an element left unwritten shows; in-place outputs get set A's
    values again); set B (new values written into the same input buffers, so a result cached by pointer shows):
    call 3; set B again in new buffers: call 4. Returned outputs are taken from each call's return value and their
    memory poisoned after the copy. Keeps ``cand1__``, ``cand2__``, ``candB__``, ``candC__`` arrays for the judge
    (:class:`Keeper`: CUDA IPC on a GPU unless ``req["transport"]`` is ``npz``, else an ``.npz``) and reports the
    spec and the returned outputs' names for the reference process (``calls: 1``: the first call only)."""
    cand = Candidate(req)
    torch, inp = cand.torch, cand.inputs
    ptrs = {n: t.data_ptr() for n, t in inp.tensors.items()}
    pristine = {s["name"]: inp.tensors[s["name"]].clone() for s in inp.spec if s["role"] == "input"}
    inout = any(s["role"] == "inout" for s in inp.spec)
    keep = Keeper(torch, cand.device, ipc=req.get("transport", "ipc") == "ipc")
    t0 = time.perf_counter()
    got = cand.run()
    first_ms = (time.perf_counter() - t0) * 1e3
    found = guards(torch, inp, ptrs, pristine, data_outputs(cand.kernel, got))
    if any(found.values()):
        return {"spec": inp.spec, "guards": found, "outputs": inp.outputs, "returned": sorted(got)}
    names = sorted(got)
    dtypes = {n: str(t.dtype).replace("torch.", "") for n, t in cand.results(got).items()}
    t_keep = time.perf_counter()
    keep.add("cand1", cand.results(got))
    keep_s = time.perf_counter() - t_keep
    _spoil(torch, got, inp)
    call_ms = None  # the second call's wall time (launch to synchronized), ms: an upper bound of its GPU time
    if req.get("calls", 3) >= 2:
        if inout or getattr(cand.kernel, "fmt", None) == "gpumode":
            # the first call changed its in-place outputs (a GPU MODE data's output buffer, which its
            # generate_input may give zeroed): the same inputs again
            inp.fill(req["plan"], int(req["seed"]), cand.ref, cand.dims, cand.kept)
        inp.poison_outputs(second=True)
        t0 = time.perf_counter()
        got = cand.run()
        call_ms = (time.perf_counter() - t0) * 1e3
        keep.add("cand2", cand.results(got))
        _spoil(torch, got, inp)
        inp.fill(req["plan"], int(req["seed_b"]), cand.ref, cand.dims, cand.kept)
        got = cand.run()
        keep.add("candB", cand.results(got))
        _spoil(torch, got, inp)
        # set B's values again, in freshly allocated buffers: tells "cached by address" from "ignores its inputs"
        cand.inputs = Inputs(torch, inp.spec, inp.scalars, cand.device)
        cand.inputs.fill(req["plan"], int(req["seed_b"]), cand.ref, cand.dims, cand.kept)
        got = cand.run()
        keep.add("candC", cand.results(got))
        cand.inputs = inp
    setup_arrays = {f"setup__{name}": t.numpy() for name, t in cand.kept.items()}
    t_save = time.perf_counter()
    shared = keep.result(req["out"], setup_arrays)
    return {"save_s": keep_s + time.perf_counter() - t_save, **shared, "spec": inp.spec,
            "setup_sha": setup_digest(cand.kept),
            "scalars": {k: v for k, v in inp.scalars.items() if isinstance(v, (int, float, str))},
            "guards": found, "outputs": inp.outputs + names, "returned": names, "dtypes": dtypes, "first_call_ms": first_ms,
            "call_ms": call_ms}


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


def setup_digest(arrays: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of a ``setup()``'s integer tensors (CPU tensors by name): what the candidate reports as
    ``setup_sha`` and the judge checks the arrays it loads against."""
    h = hashlib.sha256()
    for name, t in sorted(arrays.items()):
        h.update(name.encode() + t.numpy().tobytes())
    return h.hexdigest()


def _setup_arrays(torch: Any, req: dict[str, Any], device: str) -> dict[str, Any]:
    """The integer tensors a candidate's ``setup()`` chose (``setup__`` members of its ``.npz``), on ``device``."""
    import numpy as np

    if not req.get("setup_npz"):
        return {}
    with np.load(req["setup_npz"], allow_pickle=False) as data:
        return {k.removeprefix("setup__"): torch.from_numpy(data[k]).to(device) for k in data.files
                if k.startswith("setup__")}


def check_candidate_report(torch: Any, req: dict[str, Any]) -> str | None:
    """What the judge checks of the candidate's report before it uses it (its process is the kernel's, so the
    report may be forged): a spec of well-formed buffers in which only integer or bool inputs come from ``setup()``
    (float inputs are always drawn by the harness: a report that marks one ``setup`` would choose the values the
    reference runs on); ``setup()``'s arrays that hash to the ``setup_sha`` the candidate reported (the reference's
    outputs are kept under a key made from it). Returns why the report is unusable, or None."""
    spec = req.get("spec")
    if not isinstance(spec, list) or not spec:
        return "no buffer spec"
    for b in spec:
        if not (isinstance(b, dict) and isinstance(b.get("name"), str) and b.get("role") in ("input", "output", "inout")
                and isinstance(b.get("shape"), list) and isinstance(b.get("stride"), list)
                and isinstance(getattr(torch, str(b.get("dtype")), None), torch.dtype)):
            return f"a malformed buffer in its spec: {str(b)[:120]}"
        if b.get("source") == "setup" and getattr(torch, b["dtype"]).is_floating_point:
            return f"its spec marks the float buffer {b['name']!r} as chosen by setup() (float inputs are drawn)"
    if not isinstance(req.get("scalars", {}), dict):
        return "malformed scalars"
    try:
        given = _setup_arrays(torch, req, "cpu")
    except (OSError, ValueError, TypeError, EOFError) as exc:
        return f"its setup arrays could not be read ({type(exc).__name__})"
    if given and setup_digest(given) != req.get("setup_sha"):
        return "its setup() arrays are not the ones its process reported (setup_sha)"
    return None


class RefEntry(NamedTuple):
    """The reference's outputs for one case, kept in its process: ``arrays`` (``ref__``/``refB__`` tensors on the
    case's device), ``tolerances`` per output (:func:`tolerances`), the tolerance-sanity ``warnings``, ``nbytes``."""

    arrays: dict[str, Any]
    tolerances: dict[str, dict[str, Any]]
    warnings: list[str]
    nbytes: int


#: The reference's outputs per case key (the pytest process's digest of the reference file, spec, plan, seeds,
#: dims, device and tolerance overrides), least recently used first: the branches of an iteration share seeds and
#: dims, so the reference runs once per case in this process.
_REFS: "OrderedDict[str, RefEntry]" = OrderedDict()
#: Share of the device's memory (on the CPU: bytes) the kept outputs may take; older cases are dropped first.
REF_CACHE_GPU_FRACTION = 0.125
REF_CACHE_CPU_BYTES = 2 << 30


def _tolerance_warnings(torch: Any, names: list[str], arrays: dict[str, Any],
                        tols: dict[str, tuple[float, float]]) -> list[str]:
    """:func:`pytest_kopt.child.verdict.tolerance_warnings` over tensors: on a GPU each comparison runs there
    (:func:`pytest_kopt.child.judge.compare_fast`), and on the host only where that path cannot decide."""
    from .judge import HostArrays, compare_fast, tolerance_scale_fast
    from .verdict import compare, tolerance_scale, tolerance_warning

    host = HostArrays(torch, arrays)
    out: list[str] = []
    for name in names:
        atol, rtol = tols[name]
        for tag, label in (("low_bf16", "bf16"), ("low_fp16", "fp16")):
            low, r = arrays.get(f"{tag}__{name}"), arrays[f"ref__{name}"]
            if low is None:
                continue
            fast = compare_fast(torch, low, r, atol, rtol) if low.device.type == "cuda" else None
            if fast is None:
                if compare(name, host[f"{tag}__{name}"], host[f"ref__{name}"], atol, rtol).ok:
                    out.append(tolerance_warning(name, label, atol, rtol, tolerance_scale(
                        host[f"{tag}__{name}"], host[f"ref__{name}"], atol, rtol)))
            elif fast:
                out.append(tolerance_warning(name, label, atol, rtol,
                                             tolerance_scale_fast(torch, low, r, atol, rtol)))
    return out


def reference_outputs(torch: Any, ref: Any, req: dict[str, Any]) -> tuple[RefEntry, bool]:
    """The reference's outputs for the request's case, from this process's cache (``req["ref_key"]``) or computed:
    the same inputs as the candidate (same spec, plan, seeds), ``reference(**kwargs)`` on set A and set B, and on
    set A with float inputs rounded to bf16 and fp16 for the tolerance sanity check (whose warnings are computed
    here, then those outputs dropped). Returns (entry, True when it came from the cache). Raises
    HarnessError('contract') when the reference writes a buffer the candidate lists as an input."""
    key = req.get("ref_key")
    if key and key in _REFS:
        _REFS.move_to_end(key)
        return _REFS[key], True
    device, dims = req["device"], req["dims"]
    check_spec(ref, req["spec"], dims, req["ref"])
    given = _setup_arrays(torch, req, device)
    inp = Inputs(torch, req["spec"], {**req.get("scalars", {}), **dims}, device)
    arrays: dict[str, Any] = {}
    names: list[str] = []
    written_ok: set[int] = set()

    def call(tag: str) -> None:
        nonlocal names
        outs = reference_results(torch, ref, inp, req)
        names = list(outs)
        written_ok.update(data_outputs(ref, outs))
        for name, t in outs.items():  # the input set's buffers are refilled for the next call
            arrays[f"{tag}__{name}"] = t.detach().clone()

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
    odd = [f"{n}: {list(arrays[f'ref__{n}'].shape)} then {list(arrays[f'refB__{n}'].shape)}" for n in names
           if f"ref__{n}" not in arrays or arrays[f"ref__{n}"].shape != arrays[f"refB__{n}"].shape]
    if odd:
        raise HarnessError("contract", f"{req['ref']}: reference() returned outputs of other shapes (or names) on "
                           f"a second set of inputs of the same shapes ({'; '.join(odd)})",
                           fix="return outputs whose shapes depend on the dims only")
    tol = {name: tolerances(ref, name, req.get("atol"), req.get("rtol")) for name in names}
    # only for tolerances someone chose: the defaults would warn on every first kernel
    chosen = [n for n, t in tol.items() if "default" not in (t["atol_source"], t["rtol_source"])]
    warns = _tolerance_warnings(torch, chosen, arrays, {n: (t["atol"], t["rtol"]) for n, t in tol.items()}) \
        if chosen else []
    kept = {k: v for k, v in arrays.items() if not k.startswith("low_")}
    entry = RefEntry(kept, tol, warns, sum(t.numel() * t.element_size() for t in kept.values()))
    if key:
        budget = (REF_CACHE_GPU_FRACTION * torch.cuda.get_device_properties(0).total_memory if device == "cuda"
                  else REF_CACHE_CPU_BYTES)
        while _REFS and sum(e.nbytes for e in _REFS.values()) + entry.nbytes > budget:
            _REFS.popitem(last=False)
        if entry.nbytes <= budget:
            _REFS[key] = entry
    return entry, False


def candidate_arrays(torch: Any, req: dict[str, Any], device: str,
                     prefixes: tuple[str, ...] = ("cand",)) -> tuple[dict[str, Any], str | None]:
    """The candidate's arrays as its result describes them (``req["cand"]``: ``transport``, ``arrays`` (IPC
    descriptors), ``npz``, ``same_as``): on ``cuda`` as tensors of this process's own (imported from IPC, or the
    ``.npz``'s arrays moved there), on the CPU as numpy arrays; those whose names start with one of ``prefixes``.
    A ``same_as`` pair is honoured only as
    :data:`~pytest_kopt.child.transfer.REPEATS` allows, and only where the name itself is absent. Returns (arrays,
    None), or ({}, why) when an IPC descriptor or the ``.npz`` cannot be read (a forged or unmappable one), or an
    array is not numeric."""
    import numpy as np

    from . import share

    c = req.get("cand") if isinstance(req.get("cand"), dict) else {}
    out: dict[str, Any] = {}
    if c.get("npz"):
        try:
            with np.load(str(c["npz"]), allow_pickle=False) as z:
                for k in z.files:
                    if k.startswith(prefixes):
                        a = z[k]
                        if a.dtype.kind not in "biufc":
                            return {}, f"{k}: an array of dtype {a.dtype} (not a number)"
                        out[k] = torch.from_numpy(a).to(device) if device == "cuda" else a
        except (OSError, ValueError, TypeError, EOFError, KeyError) as exc:  # not an .npz this harness wrote
            return {}, f"its .npz could not be read ({type(exc).__name__}: {str(exc)[:120]})"
    descriptors = c.get("arrays") if isinstance(c.get("arrays"), dict) else {}
    for k, desc in descriptors.items():
        if not (isinstance(k, str) and k.startswith(prefixes)):
            continue
        try:
            out[k] = share.import_copy(torch, desc)
        except share.ShareError as exc:
            return {}, f"{k}: {exc}"
    given = c.get("same_as") if isinstance(c.get("same_as"), dict) else {}
    for k, v in given.items():
        if isinstance(k, str) and isinstance(v, str) and k not in out and v in out \
                and any(k.startswith(a) and v == b + k.removeprefix(a) for a, b in REPEATS):
            out[k] = out[v]
    return out, None


def _fp64_unmet(torch: Any, ref: Any, req: dict[str, Any], entry: RefEntry,
                tols: dict[str, tuple[float, float]]) -> str | None:
    """After a numerical failure: the reference on set A with every floating-point buffer in float64 (the values
    of set A, upcast), compared with its own outputs at the task's tolerance. Returns the comparison's text when
    the reference itself is outside it (no kernel computing in another order can then pass reliably), else None;
    also None when the reference does not run in float64 (nothing can be said)."""
    from .judge import HostArrays
    from .verdict import compare

    device, dims = req["device"], req["dims"]
    native = Inputs(torch, req["spec"], {**req.get("scalars", {}), **dims}, device)
    native.fill(req["plan"], int(req["seed"]), ref, dims, _setup_arrays(torch, req, device))
    wide = [{**b, "dtype": "float64" if getattr(torch, b["dtype"]).is_floating_point else b["dtype"],
             "stride": list(b["stride"])} for b in req["spec"]]
    hi = Inputs(torch, wide, native.scalars, device)
    for b in req["spec"]:
        hi.tensors[b["name"]].copy_(native.tensors[b["name"]])
    hi.poison_outputs()
    try:
        outs = reference_results(torch, ref, hi, req)
    except HarnessError:
        return None
    host = HostArrays(torch, {**entry.arrays, **{f"hi__{n}": t for n, t in outs.items()}})
    for name, (atol, rtol) in tols.items():
        if f"hi__{name}" not in host:
            continue
        c = compare(name, host[f"ref__{name}"], host[f"hi__{name}"], atol, rtol)
        if not c.ok:
            return "against float64 " + c.describe(atol, rtol)
    return None


def verdict_of(torch: Any, outputs: list[str], cand: dict[str, Any], refs: dict[str, Any],
               tols: dict[str, tuple[float, float]], poisons: dict[str, Any] | None) -> dict[str, Any]:
    """The verdict (:class:`pytest_kopt.child.verdict.Verdict` as a dict) on the candidate's and the reference's
    arrays: the fast path where every array is a CUDA tensor and it can decide a pass
    (:func:`pytest_kopt.child.judge.judge_fast`), else the numpy judge over host copies."""
    from .judge import HostArrays, judge_fast
    from .verdict import judge

    arrays = {**cand, **refs}
    if arrays and all(isinstance(a, torch.Tensor) and a.device.type == "cuda" for a in arrays.values()):
        figures = judge_fast(torch, outputs, arrays, tols, poisons)
        if figures is not None:
            return {"status": "PASSED", "message": "", "details": [], "figures": figures, "warnings": [],
                    "path": "device"}
    v = judge(outputs, HostArrays(torch, arrays), tols, check_tolerance=False, second_poison=poisons)
    return {"status": v.status, "message": v.message, "details": list(v.details), "figures": v.figures,
            "warnings": list(v.warnings), "path": "host"}


def mode_judge(req: dict[str, Any]) -> dict[str, Any]:
    """Correctness, the judge, in the reference's process (the candidate can neither see nor patch it): the
    reference's outputs for the case (:func:`reference_outputs`, kept in this process), the candidate's arrays
    (:func:`candidate_arrays`), and the verdict (:func:`verdict_of`); after a numerical failure, whether the
    reference meets its own tolerance against float64 (``unmet``). Only figures leave this process: ``outputs``
    (the reference's names), ``tolerances``, ``tolerance_warnings``, ``missing`` (candidate arrays that are not
    there), ``unreadable`` (an IPC descriptor that could not be read), ``verdict`` (None when arrays are missing),
    ``unmet``, ``reference_cached``, ``phase_s``."""
    import torch

    bad = check_candidate_report(torch, req)
    if bad:
        return {"outputs": [], "tolerances": {}, "tolerance_warnings": [], "reference_cached": False,
                "verdict": None, "unmet": None, "missing": [], "unreadable": bad, "phase_s": {}}
    ref = load_reference(req["ref"], req.get("seed"))
    if not callable(getattr(ref, "reference", None)):
        raise HarnessError("contract", f"{req['ref']}: reference is not a function")
    phase: dict[str, float] = {}
    t0 = time.perf_counter()
    entry, cached = reference_outputs(torch, ref, req)
    phase["reference"] = time.perf_counter() - t0
    outputs = list(entry.tolerances)
    tols = {n: (t["atol"], t["rtol"]) for n, t in entry.tolerances.items()}
    base = {"outputs": outputs, "tolerances": entry.tolerances, "tolerance_warnings": entry.warnings,
            "reference_cached": cached, "verdict": None, "unmet": None, "missing": [], "unreadable": None,
            "phase_s": phase}
    t0 = time.perf_counter()
    cand, unreadable = candidate_arrays(torch, req, req["device"])
    phase["import"] = time.perf_counter() - t0
    if unreadable:
        return {**base, "unreadable": unreadable}
    missing = [f"{p}__{o}" for o in outputs for p in ("cand1", "cand2", "candB", "candC") if f"{p}__{o}" not in cand]
    if missing or not outputs:
        return {**base, "missing": missing}
    t0 = time.perf_counter()
    v = verdict_of(torch, outputs, cand, entry.arrays, tols, req.get("poisons"))
    phase["judge"] = time.perf_counter() - t0
    unmet = None
    if v["status"] == "INCORRECT_NUMERICAL":
        t0 = time.perf_counter()
        unmet = _fp64_unmet(torch, ref, req, entry, tols)
        phase["self_check"] = time.perf_counter() - t0
    return {**base, "verdict": v, "unmet": unmet}


def mode_check_timed(req: dict[str, Any]) -> dict[str, Any]:
    """The timing gate's output check, in the reference's process: the reference on the inputs of the timed
    process's check call (its ``in__`` arrays, IPC or ``.npz``) and the verdict on that call's outputs
    (``cand1__``). Returns ``outputs``, ``tolerances``, ``missing`` and ``verdict`` as :func:`mode_judge` does."""
    import torch

    bad = check_candidate_report(torch, req)
    if bad:
        return {"outputs": [], "tolerances": {}, "missing": [], "verdict": None, "unreadable": bad}
    ref = load_reference(req["ref"], req.get("seed"))
    device, dims = req["device"], req["dims"]
    check_spec(ref, req["spec"], dims, req["ref"])
    given, unreadable = candidate_arrays(torch, req, device, prefixes=("in__", "cand1__"))
    if unreadable:
        return {"outputs": [], "tolerances": {}, "missing": [], "verdict": None, "unreadable": unreadable}
    inp = Inputs(torch, req["spec"], {**req.get("scalars", {}), **dims}, device)
    for s in inp.spec:
        if s["role"] in ("input", "inout"):
            src = given.get(f"in__{s['name']}")
            if src is None:
                return {"outputs": [], "tolerances": {}, "missing": [f"in__{s['name']}"], "verdict": None,
                        "unreadable": None}
            t = inp.tensors[s["name"]]
            t.copy_(torch.as_tensor(src).to(device=device, dtype=t.dtype))
    inp.poison_outputs()
    outs = reference_results(torch, ref, inp, req)
    tol = {n: tolerances(ref, n, req.get("atol"), req.get("rtol")) for n in outs}
    outputs = list(outs)
    cand = {k: v for k, v in given.items() if k.startswith("cand1__")}
    missing = [f"cand1__{o}" for o in outputs if f"cand1__{o}" not in cand]
    base = {"outputs": outputs, "tolerances": tol, "missing": missing, "verdict": None, "unreadable": None}
    if missing or not outputs:
        return base
    v = verdict_of(torch, outputs, cand, {f"ref__{n}": t for n, t in outs.items()},
                   {n: (t["atol"], t["rtol"]) for n, t in tol.items()}, None)
    return {**base, "verdict": v}


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
