"""The reference in its own harness process (the judge's): its outputs for a case, computed once and kept, on
inputs this process draws itself from the case's plan and seeds; its tolerances; whether it meets them itself.

The candidate's process never runs here. What the reference is given comes from the pytest process (the dims, the
plan, the seeds, the reference file pinned by its SHA-256 at the session's start) and from the reference's own code
(``make_inputs``); of the candidate's report only the buffers' spec (checked against ``shapes()``) and the integer
tensors its ``setup()`` chose (checked against their digest) are used, never a value that would choose what the
reference computes (a float input, a ``setup()`` scalar).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, NamedTuple

from . import HarnessError
from .gpumode import GpuModeReference
from .inputs import Inputs, aliases, check_spec, poison, returned_outputs, same_values, taken
from .kernelbench import KernelBenchReference

#: upstream's defaults when neither the command line nor the reference gives a tolerance
DEFAULT_ATOL = 1e-3
DEFAULT_RTOL = 1e-3


def trusted_scalars(ref: Any, req: dict[str, Any]) -> dict[str, Any]:
    """The non-tensor arguments the reference is given: the dims, and the plain values of the reference's own
    ``make_inputs`` for the case's seed (a GPU MODE ``generate_input``'s numbers). Never a candidate's ``setup()``
    scalars: a value the candidate chose could pick what the reference computes (``temperature=1e30``)."""
    out = dict(req["dims"])
    if callable(getattr(ref, "make_inputs", None)):
        try:
            made = dict(ref.make_inputs(seed=int(req["seed"]), **taken(ref.make_inputs, dict(req["dims"]))))
        except Exception:  # the reference's own inputs fail: the fill below raises it with its message
            return taken(getattr(ref, "reference", None), out)
        out.update({k: v for k, v in made.items() if isinstance(v, (int, float, str, bool)) and k not in out})
    return taken(getattr(ref, "reference", None), out)


def data_outputs(adapter: Any, got: dict[str, Any]) -> set[int]:
    """Addresses of returned tensors that may be input buffers written in place: a GPU MODE problem's ``data``
    carries its output buffer, which ``ref_kernel`` writes and returns. Empty for other formats."""
    if not isinstance(adapter, GpuModeReference):
        return set()
    return {t.data_ptr() for t in got.values() if getattr(t, "numel", lambda: 0)()}


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


def _setup_arrays(torch: Any, req: dict[str, Any], device: str) -> dict[str, Any]:
    """The integer tensors a candidate's ``setup()`` chose (``setup__`` members of its ``.npz``), on ``device``."""
    import numpy as np

    if not req.get("setup_npz"):
        return {}
    with np.load(req["setup_npz"], allow_pickle=False) as data:
        return {k.removeprefix("setup__"): torch.from_numpy(data[k]).to(device) for k in data.files
                if k.startswith("setup__")}


class RefEntry(NamedTuple):
    """The reference's outputs for one case, kept in its process: ``arrays`` (``ref__``/``refB__`` tensors on the
    case's device), ``tolerances`` per output (:func:`tolerances`), the tolerance-sanity ``warnings``, ``nbytes``,
    ``writes``: the input buffers the reference itself writes and returns (a GPU MODE ``data``'s output buffer), the
    only inputs a candidate may write too."""

    arrays: dict[str, Any]
    tolerances: dict[str, dict[str, Any]]
    warnings: list[str]
    nbytes: int
    writes: tuple[str, ...] = ()
    #: the reference's own returned outputs that are an input's memory (``return x.t()``), output -> input: the
    #: candidate may return the same view
    aliases: dict[str, str] = {}


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
    the same inputs as the candidate (same spec, plan, seeds), ``reference(**kwargs)`` on set A, on set A again
    (:func:`unrepeatable`), on set B, and on set A with float inputs rounded to bf16 and fp16 for the tolerance
    sanity check (whose warnings are computed here, then those outputs dropped). Returns (entry, True when it came
    from the cache). Raises HarnessError('contract') when the reference writes a buffer the candidate lists as an
    input, or gives other outputs on the same inputs (dropout in train mode)."""
    key = req.get("ref_key")
    if key and key in _REFS:
        _REFS.move_to_end(key)
        return _REFS[key], True
    device, dims = req["device"], req["dims"]
    check_spec(ref, req["spec"], dims, req["ref"])
    given = _setup_arrays(torch, req, device)
    inp = Inputs(torch, req["spec"], trusted_scalars(ref, req), device)
    arrays: dict[str, Any] = {}
    names: list[str] = []
    written_ok: set[int] = set()

    ref_aliases: dict[str, str] = {}

    def call(tag: str) -> None:
        nonlocal names
        outs = reference_results(torch, ref, inp, req)
        names = list(outs)
        written_ok.update(data_outputs(ref, outs))
        if tag == "ref":
            ref_aliases.update(aliases(torch, inp, {n: t for n, t in outs.items() if n not in inp.tensors}))
        for name, t in outs.items():  # the input set's buffers are refilled for the next call
            arrays[f"{tag}__{name}"] = t.detach().clone()

    inp.fill(req["plan"], int(req["seed"]), ref, dims, given)
    before = {s["name"]: inp.tensors[s["name"]].clone() for s in inp.spec if s["role"] == "input"}
    call("ref")
    # an "input" the reference writes is an output the candidate's setup() did not list (so it was never compared)
    # NaN equal to NaN in the same place: an input made with NaN in it (make_inputs) is unchanged when it still
    # holds those NaNs (torch.equal reads every NaN as changed)
    written = [n for n, t in before.items() if not same_values(torch, t, inp.tensors[n])
               and inp.tensors[n].data_ptr() not in written_ok]
    if written:
        raise HarnessError("contract", f"reference() wrote {', '.join(map(repr, written))}, which the candidate "
                           "lists as input(s): every buffer the reference writes must be among setup()'s outputs",
                           fix="list it among the outputs; if it is an input the operation changes in place (as "
                               "x.clamp_() does), name it in ref.py: inplace = [" + repr(written[0]) + "]")
    # the reference again on the same inputs, before any kernel is judged against it (a dropout left in train mode
    # would otherwise read as the kernel's NONDETERMINISTIC)
    inp.fill(req["plan"], int(req["seed"]), ref, dims, given)
    unlike = unrepeatable(torch, ref, req, arrays, reference_results(torch, ref, inp, req))
    if unlike:
        raise HarnessError("contract", f"{req['ref']}: {reference_label(ref)} gave other outputs when called again "
                           f"on the same inputs ({'; '.join(unlike)}): the reference itself is not deterministic, so "
                           "no kernel can be judged against it",
                           fix="make the reference repeatable: put the model in eval mode (model.eval(): dropout "
                               "off, batch norm on its running statistics), or draw its randomness from a fixed "
                               "seed inside the reference (torch.manual_seed(0) before the random op)")
    low = [s for s in inp.spec if s["role"] in ("input", "inout") and s["dtype"] in ("float32", "float64")]
    if low and req.get("low_precision", True):
        for dtype in ("bfloat16", "float16"):
            inp.fill(req["plan"], int(req["seed"]), ref, dims, given)
            changed = False
            for s in low:
                t = inp.tensors[s["name"]]
                rounded = t.to(getattr(torch, dtype)).to(t.dtype)
                changed = changed or not same_values(torch, t, rounded)
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
    tol = {name: tolerances(ref, name, req.get("atol"), req.get("rtol"), req.get("dtype_tol")) for name in names}
    # only for tolerances someone chose: the defaults would warn on every first kernel
    chosen = [n for n, t in tol.items() if "default" not in (t["atol_source"], t["rtol_source"])]
    warns = _tolerance_warnings(torch, chosen, arrays, {n: (t["atol"], t["rtol"]) for n, t in tol.items()}) \
        if chosen else []
    kept = {k: v for k, v in arrays.items() if not k.startswith("low_")}
    writes = tuple(s["name"] for s in inp.spec if s["role"] == "input" and inp.tensors[s["name"]].data_ptr() in written_ok)
    entry = RefEntry(kept, tol, warns, sum(t.numel() * t.element_size() for t in kept.values()), writes,
                     ref_aliases)
    if key:
        budget = (REF_CACHE_GPU_FRACTION * torch.cuda.get_device_properties(0).total_memory if device == "cuda"
                  else REF_CACHE_CPU_BYTES)
        while _REFS and sum(e.nbytes for e in _REFS.values()) + entry.nbytes > budget:
            _REFS.popitem(last=False)
        if entry.nbytes <= budget:
            _REFS[key] = entry
    return entry, False


def reference_label(ref: Any) -> str:
    """How messages name the reference's entry point: ``Model.forward`` (KernelBench), ``ref_kernel(data)`` (GPU
    MODE), ``reference()`` (kopt's format)."""
    if isinstance(ref, KernelBenchReference):
        return "Model.forward"
    if isinstance(ref, GpuModeReference):
        return "ref_kernel(data)"
    return "reference()"


def unrepeatable(torch: Any, ref: Any, req: dict[str, Any], arrays: dict[str, Any], again: dict[str, Any]) -> list[str]:
    """The outputs of a second reference call on the same inputs (``again``, by name) that differ from the first
    (``arrays``' ``ref__<name>``) beyond the output's own tolerance (NaN equal to NaN in the same place): ``name:
    how``. Within the tolerance is repeatable: float atomics (a GPU ``index_add_``) order their sums differently
    from call to call, and a kernel is held to no more (FIELD.md §4)."""
    from .judge import HostArrays
    from .verdict import compare

    out = []
    for name, b in again.items():
        a = arrays.get(f"ref__{name}")
        if a is None or a.shape != b.shape or a.dtype != b.dtype:
            out.append(f"{name}: {'absent' if a is None else f'{a.dtype} {list(a.shape)}'} then {b.dtype} "
                       f"{list(b.shape)}")
            continue
        if same_values(torch, a, b):
            continue
        t = tolerances(ref, name, req.get("atol"), req.get("rtol"), req.get("dtype_tol"))
        host = HostArrays(torch, {"a": a, "b": b})
        c = compare(name, host["b"], host["a"], t["atol"], t["rtol"])
        if not c.ok:
            out.append(c.describe(t["atol"], t["rtol"]))
    return out


def tolerances(ref: Any, name: str, atol_cli: float | None, rtol_cli: float | None,
               dtype_tol: dict[str, Any] | None = None) -> dict[str, Any]:
    """(atol, rtol) of output ``name``: the command line, else the reference's (a number, or a dict keyed by output
    name; a field format's adapter gives the problem's own: KernelBench's per precision, a GPU MODE problem's
    ``atol``/``rtol`` or ``make_match_reference`` arguments), else 1e-3 / 1e-3 (upstream's defaults); with where each
    came from. ``dtype_tol``: a case in another dtype than the reference's first
    (:func:`pytest_kopt.gates.correctness.dtype_tolerance`): ``atol``, ``rtol`` and ``source``, used instead of the
    reference's (``floor`` true: kopt's default for that dtype, raised to the reference's where that is looser).
    Raises HarnessError('contract') when
    the reference gives per-output tolerances and none for ``name`` (an output named otherwise would escape them)."""
    if dtype_tol:
        own = tolerances(ref, name, atol_cli, rtol_cli)
        out = dict(own)
        for key, cli in (("atol", atol_cli), ("rtol", rtol_cli)):
            if cli is not None:
                continue
            value = float(dtype_tol[key])
            if dtype_tol.get("floor") and own[key] > value:
                continue
            out[key], out[f"{key}_source"] = value, str(dtype_tol["source"])
        return out
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
        # a field format's adapter names where its tolerance comes from (KernelBench's table, a GPU MODE checker)
        out[key], out[f"{key}_source"] = value, getattr(ref, "tolerance_source", None) or f"ref.{key}"
    return out


def _fp64_unmet(torch: Any, ref: Any, req: dict[str, Any], entry: RefEntry,
                tols: dict[str, tuple[float, float]]) -> str | None:
    """After a numerical failure: the reference on set A with every floating-point buffer in float64 (the values
    of set A, upcast), compared with its own outputs at the task's tolerance. Returns the comparison's text when
    the reference itself is outside it (no kernel computing in another order can then pass reliably), else None;
    also None when the reference does not run in float64 (nothing can be said)."""
    from .judge import HostArrays
    from .verdict import compare

    device, dims = req["device"], req["dims"]
    native = Inputs(torch, req["spec"], trusted_scalars(ref, req), device)
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


