"""Correctness, the judge, in the reference's own harness process (the candidate's code never runs here): the
candidate's report checked, its arrays read, and the verdict on them against the reference's outputs
(:mod:`pytest_kopt.child.reference`); the inputs as the candidate's calls left them against this process's own
pristine copies; the outputs' dtypes against the reference's; and the timing gate's check of a timed call. Only
verdict figures go back to the pytest process."""

from __future__ import annotations

import time
from typing import Any

from . import HarnessError
from .formats import load_reference, regime_used
from .gpumode import join, problem_verdict
from .inputs import Inputs, check_spec
from .inputs import changed_elements, same_values, setup_digest
from .reference import (RefEntry, _fp64_unmet, _setup_arrays, data_outputs, reference_outputs, reference_results,
                        tolerances, trusted_scalars)
from .transfer import REPEATS


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


def input_findings(torch: Any, ref: Any, req: dict[str, Any], cand: dict[str, Any],
                   writes: tuple[str, ...]) -> list[str]:
    """The inputs as the candidate's calls left them (``inA__`` after call 2 on set A, ``inC__`` after call 4 on set
    B's values in new buffers) against pristine copies drawn here from the same plan and seeds (NaN equal to NaN in
    the same place), and the changes the candidate's process itself reported (``req["mutated"]``): ``name (call,
    n elements changed)`` for each input changed, but those the reference writes too (``writes``: a GPU MODE
    ``data``'s output buffer)."""
    device, dims = req["device"], req["dims"]
    found: list[str] = []
    given = _setup_arrays(torch, req, device)
    for tag, seed in (("inA", req["seed"]), ("inC", req["seed_b"])):
        names = [s["name"] for s in req["spec"] if s["role"] == "input" and s["name"] not in writes
                 and f"{tag}__{s['name']}" in cand]
        if not names:
            continue
        clean = Inputs(torch, req["spec"], trusted_scalars(ref, req), device)
        clean.fill(req["plan"], int(seed), ref, dims, given)
        for n in names:
            want = clean.tensors[n]
            got = torch.as_tensor(cand[f"{tag}__{n}"]).to(device=want.device, dtype=want.dtype).reshape(want.shape)
            if not same_values(torch, got, want):
                found.append(f"{n} ({'set A after call 2' if tag == 'inA' else 'set B after call 4'}, "
                             f"{changed_elements(torch, got, want)} elements changed)")
    reported = req.get("mutated") if isinstance(req.get("mutated"), dict) else {}
    for call, items in reported.items():
        for item in items if isinstance(items, list) else []:
            name = str(item).split(" ", 1)[0]
            if name not in writes and not any(f.startswith(name + " ") for f in found):
                found.append(f"{name} ({call}: {str(item).partition(' ')[2].strip('()') or 'changed'})")
    return found


def alias_findings(req: dict[str, Any], entry: RefEntry) -> list[str]:
    """Returned outputs whose memory is an input buffer's, as the candidate's process reported them
    (``req["aliases"]``), but for an input the reference writes and returns too (``entry.writes``: a GPU MODE
    ``data``'s output buffer) and an output the reference itself returns as a view of that same input
    (``entry.aliases``: ``return x.t()``): ``output is input``."""
    given = req.get("aliases") if isinstance(req.get("aliases"), dict) else {}
    return [f"{o} is {i}" for o, i in sorted(given.items())
            if str(i) not in entry.writes and entry.aliases.get(str(o)) != str(i)]


def dtype_findings(torch: Any, outputs: list[str], cand: dict[str, Any], entry: RefEntry,
                   reported: Any) -> list[str]:
    """Outputs whose dtype is not the reference's: ``name: got X, reference Y``. The dtype is the one the
    candidate's process reported for the output (``reported``), else the array's own (an ``.npz`` widens bf16 and
    fp8 to float32, and says nothing of those)."""
    reported = reported if isinstance(reported, dict) else {}
    out = []
    for name in outputs:
        ref = entry.arrays.get(f"ref__{name}")
        got = reported.get(name)
        if got is None and isinstance(cand.get(f"cand1__{name}"), torch.Tensor):
            got = str(cand[f"cand1__{name}"].dtype).replace("torch.", "")
        want = str(ref.dtype).replace("torch.", "") if ref is not None else None
        if got is not None and want is not None and str(got) != want:
            out.append(f"{name}: {got}, the reference's {want}")
    return out


def _data(torch: Any, ref: Any, req: dict[str, Any], which: str) -> Any:
    """A GPU MODE ``data`` as ``generate_input`` made it for input set ``which`` (``A``: the case's seed, ``B``: its
    second seed, ``check``: the timed check call's), drawn here afresh from the plan, as the problem's own
    ``check_implementation`` is given it."""
    seed = {"A": req["seed"], "B": req["seed_b"], "check": req.get("check_seed")}[which]
    inp = Inputs(torch, req["spec"], trusted_scalars(ref, req), req["device"])
    inp.fill(req["plan"], int(seed), ref, req["dims"], _setup_arrays(torch, req, req["device"]))
    return join(inp.kwargs())


def mode_judge(req: dict[str, Any]) -> dict[str, Any]:
    """Correctness, the judge, in the reference's process (the candidate can neither see nor patch it): the
    reference's outputs for the case (:func:`~pytest_kopt.child.reference.reference_outputs`, kept in this process,
    from the reference pinned by ``req["ref_sha"]``), the candidate's arrays (:func:`candidate_arrays`), the
    verdict (:func:`verdict_of`); the guards decided here (``guards``: ``input_mutated``
    (:func:`input_findings`), ``output_aliases_input`` (:func:`alias_findings`), ``output_dtype``
    (:func:`dtype_findings`)); after a numerical failure, whether the reference meets its own tolerance against
    float64 (``unmet``). Only figures leave this process: ``outputs`` (the reference's names), ``tolerances``,
    ``tolerance_warnings``, ``missing`` (candidate arrays that are not there), ``unreadable`` (an IPC descriptor
    that could not be read), ``verdict`` (None when arrays are missing), ``guards``, ``unmet``,
    ``reference_cached``, ``phase_s``."""
    import torch

    bad = check_candidate_report(torch, req)
    if bad:
        return {"outputs": [], "tolerances": {}, "tolerance_warnings": [], "reference_cached": False,
                "verdict": None, "unmet": None, "missing": [], "unreadable": bad, "guards": {}, "phase_s": {}}
    ref = load_reference(req["ref"], req.get("seed"), req.get("ref_sha"), req.get("precision"))
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
            "guards": {}, "phase_s": phase, "regime": regime_used(ref, req["spec"], req["plan"])}
    t0 = time.perf_counter()
    cand, unreadable = candidate_arrays(torch, req, req["device"], prefixes=("cand", "inA__", "inC__"))
    phase["import"] = time.perf_counter() - t0
    if unreadable:
        return {**base, "unreadable": unreadable}
    t0 = time.perf_counter()
    guards = {"input_mutated": input_findings(torch, ref, req, cand, entry.writes),
              "output_aliases_input": alias_findings(req, entry),
              "output_dtype": dtype_findings(torch, outputs, cand, entry, req.get("dtypes"))}
    base["guards"] = {k: v for k, v in guards.items() if v}
    phase["guards"] = time.perf_counter() - t0
    missing = [f"{p}__{o}" for o in outputs for p in ("cand1", "cand2", "candB", "candC") if f"{p}__{o}" not in cand]
    if missing or not outputs:
        return {**base, "missing": missing}
    t0 = time.perf_counter()
    if getattr(ref, "checker", None) is not None:  # a GPU MODE problem that checks its outputs its own way
        v = problem_verdict(torch, ref.checker, outputs, cand, lambda which: _data(torch, ref, req, which),
                            req["device"], req.get("dtypes"))
    else:
        v = verdict_of(torch, outputs, {k: a for k, a in cand.items() if k.startswith("cand")}, entry.arrays, tols,
                       req.get("poisons"))
    phase["judge"] = time.perf_counter() - t0
    unmet = None
    if v["status"] == "INCORRECT_NUMERICAL" and v.get("path") != "problem":
        t0 = time.perf_counter()
        unmet = _fp64_unmet(torch, ref, req, entry, tols)
        phase["self_check"] = time.perf_counter() - t0
    return {**base, "verdict": v, "unmet": unmet}


def mode_check_timed(req: dict[str, Any]) -> dict[str, Any]:
    """The timing gate's output check, in the reference's process: the inputs of the timed process's check call
    drawn here from the seed the pytest process chose for it (``req["check_seed"]``), the timed process's own copy of
    them (its ``in__`` arrays) compared with those (``guards``: ``input_mutated``; not a GPU MODE ``data``'s output
    buffer, which the reference writes and returns too), the reference on this process's inputs, and the verdict on
    that call's outputs (``cand1__``). Returns ``outputs``, ``tolerances``, ``missing``, ``guards`` and ``verdict``
    as :func:`mode_judge` does, and ``phase_s``: the wall seconds of loading the reference, importing the timed
    process's arrays, drawing the inputs, the reference's call and the verdict."""
    import torch

    phase: dict[str, float] = {}
    none = {"outputs": [], "tolerances": {}, "missing": [], "verdict": None, "unreadable": None, "guards": {},
            "phase_s": phase}
    t0 = time.perf_counter()
    bad = check_candidate_report(torch, req)
    if bad:
        return {**none, "unreadable": bad}
    ref = load_reference(req["ref"], req.get("seed"), req.get("ref_sha"), req.get("precision"))
    device, dims = req["device"], req["dims"]
    check_spec(ref, req["spec"], dims, req["ref"])
    phase["load"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    given, unreadable = candidate_arrays(torch, req, device, prefixes=("in__", "cand1__"))
    phase["import"] = time.perf_counter() - t0
    if unreadable:
        return {**none, "unreadable": unreadable}
    t0 = time.perf_counter()
    inp = Inputs(torch, req["spec"], trusted_scalars(ref, req), device)
    inp.fill(req["plan"], int(req["check_seed"]), ref, dims, _setup_arrays(torch, req, device))
    changed: dict[str, str] = {}
    for s in inp.spec:
        if s["role"] in ("input", "inout"):
            src = given.get(f"in__{s['name']}")
            if src is None:
                return {**none, "missing": [f"in__{s['name']}"]}
            t = inp.tensors[s["name"]]
            theirs = torch.as_tensor(src).to(device=device, dtype=t.dtype).reshape(t.shape)
            if s["role"] == "input" and not same_values(torch, theirs, t):
                changed[s["name"]] = (f"{s['name']} (the timed check call's, {changed_elements(torch, theirs, t)} "
                                      "elements unlike the inputs drawn for it)")
    inp.poison_outputs()
    phase["inputs"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    outs = reference_results(torch, ref, inp, req)
    phase["reference"] = time.perf_counter() - t0
    # a GPU MODE data's output buffer is an "input" the reference writes and returns too: the kernel's copy of it
    # holds what the kernel wrote, its output (judged below), not a changed input
    writes = data_outputs(ref, outs)
    changed = {n: f for n, f in changed.items() if inp.tensors[n].data_ptr() not in writes}
    tol = {n: tolerances(ref, n, req.get("atol"), req.get("rtol"), req.get("dtype_tol")) for n in outs}
    outputs = list(outs)
    cand = {k: v for k, v in given.items() if k.startswith("cand1__")}
    missing = [f"cand1__{o}" for o in outputs if f"cand1__{o}" not in cand]
    base = {**none, "outputs": outputs, "tolerances": tol, "missing": missing,
            "guards": {"input_mutated": list(changed.values())} if changed else {}}
    if missing or not outputs:
        return base
    t0 = time.perf_counter()
    if getattr(ref, "checker", None) is not None:  # the problem's own check, on the inputs drawn here
        v = problem_verdict(torch, ref.checker, outputs, cand, lambda _: _data(torch, ref, req, "check"), device,
                            req.get("dtypes"), calls=(("cand1", "check"),))
    else:
        v = verdict_of(torch, outputs, cand, {f"ref__{n}": t for n, t in outs.items()},
                       {n: (t["atol"], t["rtol"]) for n, t in tol.items()}, None)
    phase["judge"] = time.perf_counter() - t0
    return {**base, "verdict": v}
