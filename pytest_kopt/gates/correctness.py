"""The ``correctness`` gate: one item per case (validation seed, or boundary shape), the candidate and the reference
each in its own harness process; the verdict is the judge's, in the reference's process
(:func:`pytest_kopt.child.correctness.mode_judge`), and only its figures come back here."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..artifacts import CorrectnessRecord, read_dict, write_edges
from ..child.inputs import SECOND_POISON
from ..errors import NO_GPU_FIX, Blocked, ContractError, IncorrectError, KernelRuntimeError, KoptError
from ..child.autotune import describe
from ..settings import dims_label
from .build import BuildResult, built
from .context import Context, Outcome
from .request import harness_request
from .shrink import SHRINKABLE, smallest_failure
from .trust import digest, local_sources


class KoptToleranceWarning(UserWarning):
    """The reference's tolerance would pass a lower-precision (bf16/fp16) computation of an fp32/fp64 task."""


#: What the candidate's process reports after a call, and the status each finding fails with.
GUARD_STATUS = {"not_a_tensor": ("NOT_A_TENSOR", "an output or input is no longer a plain torch.Tensor"),
                "buffer_replaced": ("OUTPUT_REPLACED", "the call replaced a buffer's storage instead of writing "
                                                       "into it (aliasing another tensor?)"),
                "input_mutated": ("INPUT_MUTATED", "the call modified its inputs"),
                "output_aliases_input": ("OUTPUT_ALIASES_INPUT", "a returned output is an input's memory"),
                "output_dtype": ("OUTPUT_DTYPE", "an output's dtype is not the reference's")}
#: What to change, per guard status.
GUARD_FIX = {"OUTPUT_ALIASES_INPUT": "return a new tensor (or write an output buffer), never an input or a view of "
                                     "one",
             "OUTPUT_DTYPE": "return outputs in the reference's dtype: compute in the task's precision (a lower "
                             "precision is a different task; a wider one costs the user the conversion)"}


def raise_guards(ctx: Context, found: Any, seed: int, replay: str, who: str) -> None:
    """Raise IncorrectError for the first guard in ``found`` (guard -> findings) with its status (:data:`GUARD_STATUS`);
    ``who`` says which process decided it (the candidate's own, or the judge's)."""
    for key, (status, what) in GUARD_STATUS.items():
        items = (found or {}).get(key) if isinstance(found, dict) else None
        if items:
            raise IncorrectError(f"seed={seed}: {what}: {', '.join(map(str, items))}", gate="correctness",
                                 path=ctx.display, status=status,
                                 fix=GUARD_FIX.get(status, "write results into the output buffers in place and "
                                                           "leave the inputs untouched"),
                                 details=f"{replay} ({who})".strip())


def cases(ctx: Context) -> list[tuple[str, dict[str, Any]]]:
    """(label, case) per item: one per validation seed (``index``, ``seed``, ``dims`` None = the session's) on each
    test shape (several shapes: ``dims`` and ``shape`` set, labelled ``M=..,N=..,seed=S``), then one per entry of
    the reference's ``extra_dims`` (boundary shapes), one per edge shape (``edge``: its category,
    :mod:`pytest_kopt.gates.edges`) and one per dtype the reference lists after its first (``dtype``, also in the
    case's dims: ``setup()``, ``shapes()``, ``make_inputs()`` and ``reference()`` get it when they take a ``dtype``
    parameter), each with the first seed."""
    out: list[dict[str, Any]] = []
    several = len(ctx.shapes) > 1
    first = ctx.settings.seeds[0]
    for shape in ctx.shapes:
        for s in ctx.settings.seeds:
            out.append({"index": len(out), "seed": s, "dims": dict(shape) if several else None, "shape": several})
    for extra in ctx.extra_dims:
        out.append({"index": len(out), "seed": first, "dims": {**ctx.settings.dims, **extra}})
    fitted = {label for label, _ in ctx.edge_plan.fitted}
    for category, dims in ctx.edge_plan.checked:
        out.append({"index": len(out), "seed": first, "dims": dict(dims), "edge": category,
                    "fitted": dims_label(dims) in fitted})
    for dtype in ctx.dtypes[1:]:
        out.append({"index": len(out), "seed": first, "dims": {**ctx.settings.dims, "dtype": dtype}, "dtype": dtype})
    return [(case_label(c), c) for c in out]


#: Tolerances of a dtype case whose reference gives none for its dtype (``dtype_tolerances``): about two units in
#: the last place of the format's mantissa (float16: 10 bits, eps 9.8e-4; bfloat16: 7 bits, eps 7.8e-3), as
#: (atol, rtol); the reference's own tolerance where it is looser. float32 and float64 take the reference's.
DTYPE_TOLERANCE = {"float16": (1e-3, 2e-3), "bfloat16": (1e-2, 1.6e-2)}


def dtype_tolerance(ctx: Context, dtype: str | None) -> dict[str, Any] | None:
    """The tolerance of a case in ``dtype`` (None: the reference's own, for its first dtype or a dtype without
    one): the reference's ``dtype_tolerances[dtype]`` (``{"atol": a, "rtol": r}``), else
    :data:`DTYPE_TOLERANCE`'s, raised to the reference's where that is looser (``floor``). The child's
    :func:`pytest_kopt.child.reference.tolerances` applies it, the command line's ``--kopt-atol``/``--kopt-rtol``
    before it."""
    if dtype is None or not ctx.dtypes or dtype == ctx.dtypes[0]:
        return None
    given = ctx.ref_constant("dtype_tolerances")
    own = given.get(dtype) if isinstance(given, dict) else None
    if isinstance(own, dict) and {"atol", "rtol"} <= set(own):
        return {"atol": float(own["atol"]), "rtol": float(own["rtol"]),
                "source": f"ref.dtype_tolerances[{dtype}]", "floor": False}
    if dtype in DTYPE_TOLERANCE:
        atol, rtol = DTYPE_TOLERANCE[dtype]
        return {"atol": atol, "rtol": rtol, "source": f"kopt's {dtype} default", "floor": True}
    return None


def case_label(case: Mapping[str, Any]) -> str:
    """``seed=7`` for a seed case, ``M=1024,N=512,seed=7`` for a seed on one of several test shapes, ``M=1,N=1,K=1``
    for a boundary-shape case (its dims)."""
    if case.get("shape"):
        return f"{dims_label(case['dims'])},seed={case['seed']}"
    if case.get("dims"):
        return dims_label(case["dims"])
    return f"seed={case['seed']}"


def fingerprint(ctx: Context, res: BuildResult, case: Mapping[str, Any], device: str) -> str:
    """What a case's verdict depends on: the build, the reference and the kernel's neighbours, the dims, the case,
    the device, the tolerance overrides and the value regimes."""
    return digest(res.key, local_sources(ctx.ref), local_sources(ctx.kernel), ctx.settings.dims, case, device,
                  ctx.settings.atol, ctx.settings.rtol, ctx.regimes, ctx.settings.precision)


def reference_key(ctx: Context, req: dict[str, Any], cand: dict[str, Any]) -> str:
    """What the reference's outputs for a case depend on: the reference file and its neighbours, the candidate's
    spec and scalars, the plan, both seeds, the dims, the device, the tolerance overrides, the integer inputs
    taken from ``setup()`` and the names of the returned outputs. The judge's process keeps the outputs under it
    (:func:`pytest_kopt.child.correctness.reference_outputs`), so the branches of an iteration reuse them."""
    return digest(local_sources(ctx.ref), cand["spec"], cand.get("scalars"), req["plan"], req["seed"],
                  req["seed_b"], req["dims"], req["device"], req["atol"], req["rtol"], cand.get("setup_sha"),
                  cand.get("returned"), req.get("precision"))


def judge_request(ctx: Context, req: dict[str, Any], cand: dict[str, Any], mode: str = "judge",
                  held: bool = False) -> dict[str, Any]:
    """Run the judge in the reference's warm judge process (``mode`` ``judge``, or ``check_timed`` for a timed call's
    outputs) on what the candidate's process kept (``cand``: its result), under the GPU lock and ``--kopt-timeout``.
    Returns the judge's result (:func:`pytest_kopt.child.correctness.mode_judge`); ``held``: the caller holds the
    GPU lock already (the timing gate's hold, around its measurement and this check). Raises the harness's errors, and
    ContractError (REFERENCE_TIMEOUT, exit 4, naming the reference) when the judge runs past the timeout: only the
    reference's code and kopt's run in that process, so a hang there is never the kernel's TIMEOUT."""
    table = req.get("poisons") or {}
    poisons = {b["name"]: table.get(b["dtype"], SECOND_POISON.get(b["dtype"])) for b in cand["spec"]
               if b["role"] == "output"}
    jreq = {**req, "mode": mode, "spec": cand["spec"], "scalars": cand.get("scalars", {}),
            "returned": cand.get("returned"), "setup_npz": cand.get("npz"), "env": {}, "poisons": poisons,
            "ref_key": reference_key(ctx, req, cand), "setup_sha": cand.get("setup_sha"),
            # what the candidate's process saw of its own calls, which the judge weighs against the reference's
            "mutated": cand.get("mutated") or {}, "aliases": cand.get("aliases") or {},
            "dtypes": cand.get("dtypes") or {},
            "cand": {"transport": cand.get("transport"), "arrays": cand.get("arrays") or {}, "npz": cand.get("npz"),
                     "same_as": cand.get("same_as") or {}}}
    gate = "correctness" if mode == "judge" else "timing"
    timeout_s = ctx.settings.gate_timeout_s
    try:
        return ctx.pool.run(jreq, gate=gate, timeout_s=timeout_s, path=str(ctx.ref), workdir=ctx.work,
                            lock=contextlib.nullcontext() if held else ctx.device_lock(req["device"],
                                                                                         shared=ctx.shares_gpu),
                            server=ctx.server("judge"))
    except KernelRuntimeError as exc:
        if exc.status != "TIMEOUT":
            raise
        # the judge's process runs the reference's code and kopt's, never the kernel's: what hung is the reference
        raise ContractError(f"the reference did not give its outputs within --kopt-timeout {timeout_s:g} s in the "
                            f"judge's process (seed={req['seed']}; it is called up to five times per case: set A "
                            "twice, set A rounded to bf16 and to fp16, set B), so the kernel was not judged",
                            gate=gate, path=str(ctx.ref), status="REFERENCE_TIMEOUT", details=exc.details,
                            fix="look for an infinite loop, a deadlock or a wait on something that never comes in "
                                "the reference; raise --kopt-timeout if it is simply slow at these dims") from None


def check_report(ctx: Context, cand: Any, req: dict[str, Any], gate: str, replay: str = "") -> None:
    """The candidate's result as its process reported it, before anything here uses it (that process is the
    kernel's): the fields of the harness's result, an ``.npz`` only inside this kernel's work folder, and no scalar of
    ``setup()``'s that contradicts a dim of the same name (the reference is given the dims). Raises
    KernelRuntimeError for a result the harness did not write, ContractError for a contradicting scalar."""
    fix = "the kernel must not touch the harness (its modules, files or pipes)"
    ok = (isinstance(cand, dict) and isinstance(cand.get("guards", {}), dict)
          and isinstance(cand.get("spec"), list) and all(isinstance(b, dict) and isinstance(b.get("name"), str)
                                                         and isinstance(b.get("dtype"), str) and "role" in b
                                                         for b in cand["spec"])
          and isinstance(cand.get("scalars", {}), dict) and isinstance(cand.get("outputs", []), list)
          and isinstance(cand.get("returned", []), (list, type(None))))
    npz = cand.get("npz") if isinstance(cand, dict) else None
    if npz is not None:
        p = Path(str(npz))
        ok = ok and isinstance(npz, str) and p.suffix == ".npz" and p.resolve().parent == ctx.work.resolve()
    if not ok:
        raise KernelRuntimeError("the candidate's process returned a result the harness did not write (a field of "
                                 "the wrong kind, or an .npz outside its work folder)", gate=gate, path=ctx.display,
                                 details=f"{str(cand)[:600]}; {replay}".strip("; "), fix=fix)
    clash = {k: (v, req["dims"][k]) for k, v in cand.get("scalars", {}).items() if k in req["dims"]
             and v != req["dims"][k]}
    if clash:
        shown = ", ".join(f"{k}={v!r} (dims: {d!r})" for k, (v, d) in clash.items())
        raise ContractError(f"setup() gives {shown}: a value the dims already set", gate=gate, path=ctx.display,
                            fix="leave dims to --kopt-dims (the reference is given those); return other names "
                                "for values of setup()'s own", details=replay or None)


def verdict_from(doc: dict[str, Any]) -> Any:
    """The judge's verdict as a :class:`~pytest_kopt.child.verdict.Verdict`."""
    from ..child.verdict import Verdict  # numpy: imported where a verdict is read, never at plugin import

    return Verdict(status=str(doc["status"]), message=str(doc.get("message") or ""),
                   details=tuple(str(d) for d in doc.get("details") or ()),
                   figures=dict(doc.get("figures") or {}), warnings=tuple(str(w) for w in doc.get("warnings") or ()))


def unmade(ctx: Context, case: Mapping[str, Any], spec: list[dict[str, Any]]) -> None:
    """A dtype case (``case["dtype"]``) whose buffers (``spec``, as setup() made them and shapes() agreed) hold no
    buffer of that dtype: the case would have run another dtype and reported the claimed one. Raises ContractError
    naming the reference and its shapes()/setup() (a claim the files do not keep is the problem's, exit 4)."""
    dtype = case.get("dtype")
    if not dtype or any(b.get("dtype") == dtype for b in spec):
        return
    made = ", ".join(f"{b['name']}: {b['dtype']}" for b in spec)
    raise ContractError(f"dtype {dtype}: the reference lists dtype {dtype}, but no buffer of this case is {dtype} "
                        f"({made}), so it would run another dtype under the name {dtype}", gate="correctness",
                        path=str(ctx.ref),
                        fix=f"make shapes() in {ctx.ref.name} and the kernel's setup() take dtype and give their "
                            "float buffers in it (getattr(torch, dtype)), or leave it out of dtypes")


def interpreter_unsound(ctx: Context, device: str, spec: list[dict[str, Any]] | None,
                        dtypes: dict[str, str] | None = None) -> None:
    """Raise Blocked (by hardware: a GPU judges it) when the kernel would be run on ``device`` where its kind does
    not compute a buffer's dtype right (:meth:`~pytest_kopt.kinds.base.Kind.unsound_dtypes`: Triton's interpreter
    and bfloat16): never a false "incorrect". The block is the item's own (``local``): the later gates of a kernel
    whose other cases were judged say their own reason (no GPU), not this one."""
    found = sorted(({b["dtype"] for b in spec or []} | set((dtypes or {}).values())) & ctx.kind.unsound_dtypes(device))
    if found:
        raise Blocked("hardware", f"no GPU, and Triton's interpreter does not compute {', '.join(found)} right (it "
                      "fails on or miscomputes these dtypes), so its outputs would say nothing about the kernel: "
                      "a kernel with these dtypes is judged on a GPU", NO_GPU_FIX, local=True)


def gate_correctness(ctx: Context, case: dict[str, Any]) -> Outcome:
    """One case: harness-owned inputs drawn from the seed's plan, outputs NaN-poisoned before every call, four
    candidate calls (twice on set A, set B in the same buffers, set B in new buffers), the reference in its own
    process, and the guards of :func:`pytest_kopt.gates.verdict.judge`. Writes ``correctness/<case>.json``
    (signed). Raises IncorrectError (with the guard's status), KernelRuntimeError (crash, CUDA error, TIMEOUT) or
    ContractError; Blocked by hardware (a ``.cu`` without a GPU) or compile."""
    device = ctx.device_for("correctness")
    res = built(ctx)
    interpreter_unsound(ctx, device, (read_dict(ctx.outdir / "plan.json") or {}).get("spec"))
    if device == "cuda" and "correctness" in ctx.collected:  # a correctness item, not require_correct's own run
        try:
            ctx.ahead.profile_ahead(ctx, early=True)  # ncu's start under the seeds; its kernels wait for its turn
        except (OSError, KoptError):
            pass  # the ncu item starts its own
    record = CorrectnessRecord.start(case, device, fingerprint(ctx, res, case, device))
    edges = ctx.edge_plan
    write_edges(ctx.outdir, {**edges.document(), "dtypes": ctx.dtypes})
    extra = {**edges.figures(), **_case_figures(ctx, case)}
    try:
        outcome = _check_case(ctx, res, case, device, record)
        record["passed"] = True
        return Outcome({**outcome.figures, **extra}, _case_prefix(case) + outcome.summary, outcome.artifacts)
    except KoptError as exc:
        if device == "cuda":
            ctx.ahead.abandon_profiles(ctx)  # the ncu item is blocked now: its profile must not wait for it
        exc.message = _case_prefix(case) + exc.message
        exc.figures.update(extra)
        if exc.status in SHRINKABLE:
            found = smallest_failure(ctx, case, exc, digest(fingerprint(ctx, res, {}, device), ctx.settings.seeds),
                                     lambda c, timeout_s: _attempt(ctx, res, c, device, timeout_s))
            if found:
                exc.message += f"; {found['summary']}"
                exc.figures.update(shrunk=found["label"], shrunk_status=found["status"])
                exc.details = f"{exc.details or ''}\nsmallest failing case found ({found['label']}): " \
                              f"{found['message']}\n" + "\n".join(found["details"])
                if "a near miss" in (exc.details or "") and _all_ones(found.get("dims") or {}):
                    exc.details += ("\nnot a near miss after all: the smallest failing case has every size 1, where "
                                    "no order of summation differs from the reference's; the kernel computes "
                                    "something else (check its arithmetic), the tolerance is not the cause")
                record["shrunk"] = found
        record["status"], record["message"] = exc.status, exc.message
        raise
    finally:
        CorrectnessRecord.write(ctx.outdir, case_label(case), record,
                                mac=ctx.trust.mac(record["fingerprint"], record["passed"]))


def _case_prefix(case: Mapping[str, Any]) -> str:
    """What a message or summary of an edge-shape or dtype case starts with: the shape (its dims, its category) or
    the dtype, so a failure there names it."""
    if case.get("edge"):
        within = ", within ref.py constraints" if case.get("fitted") else ""
        return f"edge shape {dims_label(case['dims'])} ({case['edge']}{within}): "
    if case.get("dtype"):
        return f"dtype {case['dtype']}: "
    return ""


def planned(ctx: Context, case: Mapping[str, Any]) -> dict[str, Any]:
    """What a correctness item would check, for its skip too (:attr:`~pytest_kopt.gates.table.Gate.planned`): the
    kernel's edge-shape plan (:meth:`~pytest_kopt.gates.edges.EdgePlan.figures`) and the case's own scalars, so a
    ``.cu`` without a GPU still reports the edge shapes it will be checked at."""
    figs = ctx.edge_plan.figures()
    return {**figs, "edge_shapes": f"planned: {figs['edge_shapes']}", **_case_figures(ctx, case)}


def _case_figures(ctx: Context, case: Mapping[str, Any]) -> dict[str, Any]:
    """The case's own scalars: ``edge_shape`` (its category) and ``dims_checked`` for an edge case; ``dtype`` for a
    dtype case, and on every case of a reference listing dtypes ``dtypes`` (comma-separated)."""
    out: dict[str, Any] = {}
    if case.get("edge"):
        out.update(edge_shape=case["edge"], dims_checked=dims_label(case["dims"]))
    if ctx.dtypes:
        out.update(dtype=case.get("dtype") or ctx.dtypes[0], dtypes=",".join(ctx.dtypes))
    return out


def _all_ones(dims: dict[str, Any]) -> bool:
    """Whether a shrunk case's changed sizes are all 1 (a tuple size: each of its entries); False for none."""
    sizes = [x for v in dims.values() for x in (v if isinstance(v, (list, tuple)) else [v])]
    return bool(sizes) and all(x == 1 for x in sizes)


def _attempt(ctx: Context, res: BuildResult, case: dict[str, Any], device: str,
             timeout_s: float) -> tuple[str, str, str, str]:
    """One shrinking attempt (:mod:`pytest_kopt.gates.shrink`): the case run as a correctness item is, but under
    ``timeout_s``, with no record, warning or ncu start, and never in the process that judges its other seeds
    (``shrink``: the kernel's timing process, which a kernel that failed correctness is never timed in, or its own
    check process where the seeds run in the timing process): the state a kernel keeps between calls (a cache by
    pointer) in the process that judges its other seeds is left as those seeds alone made it. Returns (status,
    message, details, the regime its inputs were drawn in), PASSED when it passes."""
    ctx = dataclasses.replace(ctx, settings=dataclasses.replace(ctx.settings, gate_timeout_s=max(1.0, timeout_s)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            out = _check_case(ctx, res, case, device, {}, role="shrink")
        except KoptError as exc:
            return exc.status, exc.message, exc.details or "", str(exc.figures.get("regime") or "")
    return "PASSED", "", "", str(out.figures.get("regime") or "")


def regime_label(ctx: Context, regime: str) -> str:
    """How a summary names the inputs' regime: ``normal`` (kopt's), ``the problem's get_inputs()`` (a field
    problem's own generator), ``ref.make_inputs()``."""
    if regime == "problem":
        return {"kernelbench": "the problem's get_inputs()",
                "gpumode": "the problem's generate_input()"}.get(ctx.problem_format, "the problem's inputs")
    return "ref.make_inputs()" if regime == "make_inputs" else regime


def config_pins(res: BuildResult, device: str) -> list[dict[str, Any] | None]:
    """The ``@triton.autotune`` configs a correctness case runs, as ``autotune_pin`` values (kernel name -> config
    kwargs), or [None] for the build's own pin alone. On a GPU that is the config Triton tuned, which every later
    gate runs. Without one nothing was tuned: the build compiled every config ahead of time and states the first,
    so each config is checked in turn (run ``i`` pins config ``i`` of each kernel, modulo its count: every config of
    every kernel runs in as many runs as the longest list has), and a broken second config fails. A build recorded
    before the configs were listed (no ``all``) checks its pin alone."""
    every = {name: list(t.get("all") or [t["config"]]) for name, t in res.autotune.items()}
    if device != "cpu" or not every or max(len(v) for v in every.values()) < 2:
        return [None]
    runs = max(len(v) for v in every.values())
    return [{name: configs[i % len(configs)] for name, configs in every.items()} for i in range(runs)]


def _check_case(ctx: Context, res: BuildResult, case: dict[str, Any], device: str, record: dict[str, Any],
                role: str = "check") -> Outcome:
    """One case in the harness process of ``role``, once per config :func:`config_pins` lists; a failure names the
    config it failed with."""
    pins = config_pins(res, device)
    outcomes: list[Outcome] = []
    for i, pin in enumerate(pins):
        try:
            outcomes.append(_check_config(ctx, res, case, device, record, pin, role))
        except KoptError as exc:
            if pin is not None:  # which config of several failed
                exc.message = (f"with config {i + 1} of {len(pins)} ("
                               + "; ".join(f"{k}: {describe(c)}" for k, c in pin.items()) + f"): {exc.message}")
            raise
    first = outcomes[0]
    if len(pins) < 2:
        return first
    every = "; ".join(f"{name}: {len(t.get('all') or [])}" for name, t in sorted(res.autotune.items()))
    return Outcome({**first.figures, "configs_checked": len(pins)},
                   f"{first.summary}; every config checked in turn ({every})", first.artifacts)


def _check_config(ctx: Context, res: BuildResult, case: dict[str, Any], device: str, record: dict[str, Any],
                  pin: dict[str, Any] | None, role: str = "check") -> Outcome:
    """One case with the build's ``autotune_pin``, or ``pin`` instead (:func:`config_pins`)."""
    seed = int(case["seed"])
    replay = f"replay: --kopt-seed {ctx.settings.session_seed}" if ctx.settings.session_seed is not None \
        else f"replay: --kopt-seeds {seed}"
    req = harness_request(ctx, "candidate", device, seed, res, dims=case.get("dims"), index=int(case["index"]),
                          plan=case.get("plan"))
    if pin is not None:
        req["autotune_pin"] = pin
    req["dtype_tol"] = dtype_tolerance(ctx, case.get("dtype"))
    ctx.pool.prestart(ctx.server("judge"), {}, ctx.work)  # its torch import overlaps the candidate's request
    clock = time.perf_counter()
    hint = ctx.kind.timeout_hint(device)
    cand = ctx.pool.run(req, gate="correctness", timeout_s=ctx.settings.gate_timeout_s, path=ctx.display,
                        workdir=ctx.work, lock=ctx.device_lock(device, shared=ctx.shares_gpu), server=ctx.server(role),
                        timeout_hint=hint)
    record["plan"] = req["plan"]
    record["call_ms"] = cand.get("call_ms")
    check_report(ctx, cand, req, "correctness", replay)
    unmade(ctx, case, cand["spec"])
    try:
        raise_guards(ctx, cand["guards"], seed, replay, "seen in the candidate's process")
        interpreter_unsound(ctx, device, cand["spec"], cand.get("dtypes"))
        # where a seed's wall time goes (s): the candidate's process (inputs, 4 calls, keeping the outputs), and the
        # judge in the reference's (its outputs, computed once per case in that process; the candidate's imported;
        # the verdict)
        phase_s: dict[str, Any] = {"candidate": time.perf_counter() - clock, "candidate_save": cand.get("save_s")}
        clock = time.perf_counter()
        judged = judge_request(ctx, req, cand)
        phase_s["judge_request"] = time.perf_counter() - clock
        phase_s.update({f"judge_{k}": x for k, x in (judged.get("phase_s") or {}).items()})
        for who, res in (("candidate", cand), ("judge", judged)):  # inside each process (protocol.handle)
            phase_s.update({f"{who}_harness_{k}": x for k, x in (res.get("harness_s") or {}).items()})
    finally:
        if cand.get("npz") and os.path.isfile(cand["npz"]):  # inside the work folder (check_report)
            os.unlink(cand["npz"])
    if judged.get("unreadable"):
        raise KernelRuntimeError(f"seed={seed}: the candidate's process reported arrays the judge could not use: "
                                 f"{judged['unreadable']}", gate="correctness", path=ctx.display, details=replay,
                                 fix="the kernel must not touch the harness (its modules, files or pipes)")
    # decided outside the candidate's process: its inputs after the calls against the judge's pristine copies, an
    # input returned as an output, an output in another dtype than the reference's
    raise_guards(ctx, judged.get("guards"), seed, replay, "found by the judge, in the reference's process")
    # which outputs are judged is the reference process's answer, never the candidate's (its process could report
    # no outputs at all); every call's array of each must be there
    outputs = list(judged["outputs"])
    theirs = set(cand.get("outputs") or [])
    if theirs and set(outputs) != theirs:  # named differently: say so, never judge one output as another
        raise ContractError(f"seed={seed}: the candidate's outputs are {', '.join(sorted(theirs))} but the "
                            f"reference's are {', '.join(outputs)}", gate="correctness", path=ctx.display,
                            details=replay, fix="name the outputs alike: setup()'s \"outputs\" (or the keys "
                            "of the dict run_kernel returns) and ref.py's outputs = [...] (or the keys of the "
                            "dict reference returns); a returned tuple without names is out0, out1, ...")
    if judged.get("missing") or judged.get("verdict") is None:
        what = f"no {', '.join(judged.get('missing') or []) or 'outputs'}"
        raise KernelRuntimeError(f"seed={seed}: the candidate's process returned {what}", gate="correctness",
                                 path=ctx.display, details=f"it reported outputs {cand.get('outputs')}, the "
                                 f"reference {outputs}; {replay}",
                                 fix="the kernel must not touch the harness (its modules, files or pipes)")
    v = verdict_from(judged["verdict"])
    regime = str(judged.get("regime") or req["plan"]["regime"])
    label = regime_label(ctx, regime)
    if cand.get("note") and not v.ok:  # a field format's word beside it: the state a ModelNew was not given
        v = dataclasses.replace(v, details=(*v.details, str(cand["note"])[:600]))
    tolerances = judged["tolerances"]
    first = next(iter(tolerances.values()))
    if v.status == "INCORRECT_NUMERICAL" and judged.get("unmet"):
        raise ContractError(f"seed={seed}: the reference cannot meet its own tolerance: {judged['unmet']}",
                            gate="correctness", path=str(ctx.ref), status="UNMEETABLE_TOLERANCE",
                            details="\n".join(v.details) + f"\n(the kernel's comparison above; tolerances "
                            f"from {first['atol_source']}/{first['rtol_source']}; {replay})",
                            fix="loosen atol/rtol in ref.py (or --kopt-atol/--kopt-rtol) to what the "
                                "reference itself meets, or compute the reference in higher precision")
    # the tolerance's sanity check (would a bf16/fp16 computation pass?) is the seeds' to make, at the given dims:
    # at an edge shape (a 1-wide softmax is exactly 1 in any precision) it says nothing of the task
    if v.ok and not case.get("edge"):
        v = dataclasses.replace(v, warnings=(*v.warnings, *judged["tolerance_warnings"]))
    for w in v.warnings:
        warnings.warn(KoptToleranceWarning(f"{ctx.display}: {w}"), stacklevel=1)
    atol, rtol = first["atol"], first["rtol"]
    record.update(v.figures, status=v.status, atol=atol, rtol=rtol, warnings=list(v.warnings),
                  reference_cache_hit=judged.get("reference_cached"), judged_on=judged["verdict"].get("path"),
                  transport=cand.get("transport"), transport_note=cand.get("transport_note"),
                  phase_s={k: round(x, 3) for k, x in phase_s.items() if x is not None})
    figures = {"seed": seed, "regime": regime, "device": device, "atol": atol, "rtol": rtol, **v.figures}
    if v.warnings:
        figures["tolerance_warning"] = v.warnings[0]
    if not v.ok:
        sources = dict.fromkeys((first["atol_source"], first["rtol_source"]))
        how = "checked by the problem's check_implementation" if v.figures.get("checked_by") else \
            f"tolerances from {'/'.join(sources)}"
        inputs = label if regime in ("problem", "make_inputs") else f"{label} inputs"
        raise IncorrectError(f"seed={seed} ({inputs}): {v.message}", gate="correctness",
                             path=ctx.display, status=v.status,
                             details="\n".join(v.details) + f"\n({how}; {replay})",
                             fix="fix the kernel; details shows where it is wrong (the outputs and first bad indices)",
                             figures={**figures, "record": str(CorrectnessRecord.path(ctx.outdir, case_label(case)))})
    how = ctx.kind.cpu_runner(device) or device
    if req.get("autotune_pin"):
        how += (" with the pinned config " if pin is None else " with the config ") + "; ".join(
            f"{k}: {describe(c)}" for k, c in req["autotune_pin"].items())
    if v.figures.get("checked_by"):  # a problem with a check of its own: its verdict on every call
        return Outcome(figures, f"{case_label(case)} ({label}) on {how}: the problem's check_implementation passed "
                                f"{v.figures.get('calls')} calls")
    return Outcome(figures, f"{case_label(case)} ({label}) on {how}: max abs err "
                            f"{v.figures['max_abs_err']:.3g}, max rel err {v.figures['max_rel_err']:.3g} "
                            f"(atol={atol:g}, rtol={rtol:g}){'; tolerance warning' if v.warnings else ''}")


def require_correct(ctx: Context, res: BuildResult, device: str) -> None:
    """For a gate that needs a correct kernel: every correctness case must have passed for this exact build,
    as this session's signed records say; a case without one is run now. Raises Blocked by correctness."""
    for label, case in cases(ctx):
        rec = CorrectnessRecord.load(CorrectnessRecord.path(ctx.outdir, label))
        fp = fingerprint(ctx, res, case, device)
        if rec is None or rec.fingerprint != fp or not ctx.trust.verify(rec.mac, fp, rec.passed):
            try:
                gate_correctness(ctx, case)
            except KoptError as exc:
                raise Blocked("correctness", f"{label}: {exc.message}") from None
        elif not rec.passed:
            raise Blocked("correctness", f"{label}: {rec.message or 'failed'}")
