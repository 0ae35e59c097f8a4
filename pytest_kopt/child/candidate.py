"""Correctness, the candidate's side, in the candidate's own harness process: its four calls on harness-owned
inputs, what each call did to its buffers, and its outputs (and its inputs after the calls) kept for the judge.

Nothing here decides a verdict. The candidate's code runs in this process and can change anything in it, so what
is reported here is evidence the judge checks from outside (:mod:`pytest_kopt.child.correctness`, in the
reference's process): the outputs against the reference's on inputs the judge draws itself, the inputs as they are
after the calls against the judge's own pristine copies, the outputs' dtypes against the reference's. The checks
made here (buffers replaced, inputs changed by a call) stop an honest mistake early and name it.
"""

from __future__ import annotations

import time
from typing import Any

from .inputs import Inputs, aliases, changed_elements, poison, same_values, setup_digest
from .kernels import Candidate
from .transfer import REPEATS, to_numpy


def guards(torch: Any, inp: Inputs, ptrs: dict[str, int], pristine: dict[str, Any]) -> dict[str, list[str]]:
    """After a call: buffers replaced or no longer plain tensors, and inputs the call changed
    (``input_mutated``: ``name (n elements changed)``; in-place outputs may change). Whether a change is allowed
    (a GPU MODE ``data`` carries its output buffer, which the reference writes too) is the judge's to decide."""
    found: dict[str, list[str]] = {"not_a_tensor": [], "buffer_replaced": [], "input_mutated": []}
    for s in inp.spec:
        t = inp.tensors[s["name"]]
        if type(t) is not torch.Tensor:
            found["not_a_tensor"].append(f"{s['name']} is {type(t).__module__}.{type(t).__qualname__}")
        elif t.data_ptr() != ptrs[s["name"]] or list(t.shape) != s["shape"]:
            found["buffer_replaced"].append(s["name"])
        elif s["role"] == "input" and not same_values(torch, t, pristine[s["name"]]):
            found["input_mutated"].append(f"{s['name']} ({changed_elements(torch, t, pristine[s['name']])} elements "
                                          "changed)")
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
        """Keep one call's arrays as ``<tag>__<name>``."""
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


def _inputs_of(inp: Inputs) -> dict[str, Any]:
    """The input-role buffers of a set, by name (what the judge compares with its own pristine copies)."""
    return {s["name"]: inp.tensors[s["name"]] for s in inp.spec if s["role"] == "input"}


def mode_candidate(req: dict[str, Any]) -> dict[str, Any]:
    """Correctness, candidate side. Inputs set A: call 1 and call 2 (outputs poisoned with NaN, then with the
    request's second poison per output dtype, ``req["poisons"]``, drawn from the seed by the pytest process, so an
    element left unwritten shows and a kernel cannot know the value ahead; in-place outputs get set A's values
    again); set B (new values written into the same input buffers, so a result cached by pointer shows): call 3;
    set B again in new buffers: call 4. After every call the inputs are compared with the set's pristine copy.
    Returned outputs are taken from each call's return value and their memory poisoned after the copy. Keeps
    ``cand1__``, ``cand2__``, ``candB__``, ``candC__`` arrays for the judge, and the inputs as the calls left them
    (``inA__`` after call 2, ``inC__`` after call 4) for the judge's own input check (:class:`Keeper`: CUDA IPC on
    a GPU unless ``req["transport"]`` is ``npz``, else an ``.npz``). Reports the spec, the returned outputs' names
    and dtypes, inputs changed per call (``mutated``) and returned outputs that are an input's memory
    (``aliases``). A kernel in a format whose inputs carry no output buffer (all but GPU MODE) stops at the first
    call that replaced or changed a buffer (``guards``)."""
    cand = Candidate(req)
    torch, inp = cand.torch, cand.inputs
    ptrs = {n: t.data_ptr() for n, t in inp.tensors.items()}
    pristine = {n: t.clone() for n, t in _inputs_of(inp).items()}
    inout = any(s["role"] == "inout" for s in inp.spec)
    carries_outputs = getattr(cand.kernel, "fmt", None) == "gpumode"  # GPU MODE: data may hold an output buffer
    keep = Keeper(torch, cand.device, ipc=req.get("transport", "ipc") == "ipc")
    table = req.get("poisons") if isinstance(req.get("poisons"), dict) else {}
    poisons = {s["name"]: float(table[s["dtype"]]) for s in inp.spec
               if isinstance(table.get(s["dtype"]), (int, float))}
    mutated: dict[str, list[str]] = {}
    alias: dict[str, str] = {}

    def checked(call: str, got: dict[str, Any], where: Inputs, ptrs_now: dict[str, int],
                clean: dict[str, Any]) -> dict[str, list[str]]:
        found = guards(torch, where, ptrs_now, clean)
        if found["input_mutated"]:
            mutated[call] = found["input_mutated"]
        alias.update(aliases(torch, where, got))
        if carries_outputs:
            found["input_mutated"] = []  # the judge tells the output buffer from an input it must not touch
        return found

    t0 = time.perf_counter()
    got = cand.run()
    first_ms = (time.perf_counter() - t0) * 1e3
    found = checked("call1", got, inp, ptrs, pristine)
    if any(found.values()):
        return {"spec": inp.spec, "guards": found, "outputs": inp.outputs, "returned": sorted(got),
                "mutated": mutated, "aliases": alias}
    names = sorted(got)
    dtypes = {n: str(t.dtype).replace("torch.", "") for n, t in cand.results(got).items()}
    t_keep = time.perf_counter()
    keep.add("cand1", cand.results(got))
    keep_s = time.perf_counter() - t_keep
    _spoil(torch, got, inp)
    call_ms = None  # the second call's wall time (launch to synchronized), ms: an upper bound of its GPU time
    if req.get("calls", 3) >= 2:
        if inout or carries_outputs:
            # the first call changed its in-place outputs (a GPU MODE data's output buffer, which its
            # generate_input may give zeroed): the same inputs again
            inp.fill(req["plan"], int(req["seed"]), cand.ref, cand.dims, cand.kept)
        inp.poison_outputs(second=True, values=poisons)
        t0 = time.perf_counter()
        got = cand.run()
        call_ms = (time.perf_counter() - t0) * 1e3
        found = checked("call2", got, inp, ptrs, pristine)
        keep.add("cand2", cand.results(got))
        keep.add("inA", _inputs_of(inp))
        _spoil(torch, got, inp)
        inp.fill(req["plan"], int(req["seed_b"]), cand.ref, cand.dims, cand.kept)
        pristine_b = {n: t.clone() for n, t in _inputs_of(inp).items()}
        if not any(found.values()):
            got = cand.run()
            found = checked("call3", got, inp, ptrs, pristine_b)
            keep.add("candB", cand.results(got))
            _spoil(torch, got, inp)
        if not any(found.values()):
            # set B's values again, in freshly allocated buffers: tells "cached by address" from "ignores its inputs"
            cand.inputs = fresh = Inputs(torch, inp.spec, inp.scalars, cand.device)
            fresh.fill(req["plan"], int(req["seed_b"]), cand.ref, cand.dims, cand.kept)
            got = cand.run()
            found = checked("call4", got, fresh, {n: t.data_ptr() for n, t in fresh.tensors.items()}, pristine_b)
            keep.add("candC", cand.results(got))
            keep.add("inC", _inputs_of(fresh))
            cand.inputs = inp
        if any(found.values()):
            return {"spec": inp.spec, "guards": found, "outputs": inp.outputs, "returned": names,
                    "mutated": mutated, "aliases": alias}
    setup_arrays = {f"setup__{name}": t.numpy() for name, t in cand.kept.items()}
    t_save = time.perf_counter()
    shared = keep.result(req["out"], setup_arrays)
    return {"save_s": keep_s + time.perf_counter() - t_save, **shared, "spec": inp.spec,
            "setup_sha": setup_digest(cand.kept),
            "scalars": {k: v for k, v in inp.scalars.items() if isinstance(v, (int, float, str))},
            "guards": found, "outputs": inp.outputs + names, "returned": names, "dtypes": dtypes,
            "mutated": mutated, "aliases": alias, "first_call_ms": first_ms, "call_ms": call_ms,
            # a field format's word beside a failure (the state a KernelBench ModelNew was not given)
            "note": str(getattr(cand.kernel, "note", "") or "")}
