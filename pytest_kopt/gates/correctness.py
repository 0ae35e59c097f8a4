"""The ``correctness`` gate: one item per case (validation seed, or boundary shape), the candidate and the reference
each in its own harness process, the verdict here (:mod:`pytest_kopt.gates.verdict`)."""

from __future__ import annotations

import dataclasses
import io
import os
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..artifacts import CorrectnessRecord, read_dict, write_json
from ..child.transfer import REPEATS
from ..child.inputs import SECOND_POISON
from ..errors import Blocked, ContractError, IncorrectError, KernelRuntimeError, KoptError
from ..child.autotune import describe
from ..settings import dims_label
from .build import BuildResult, built
from .context import Context, Outcome
from .request import harness_request
from .trust import digest, local_sources, read_verified


class KoptToleranceWarning(UserWarning):
    """The reference's tolerance would pass a lower-precision (bf16/fp16) computation of an fp32/fp64 task."""


#: What the candidate's process reports after a call, and the status each finding fails with.
GUARD_STATUS = {"not_a_tensor": ("NOT_A_TENSOR", "an output or input is no longer a plain torch.Tensor"),
                "buffer_replaced": ("OUTPUT_REPLACED", "the call replaced a buffer's storage instead of writing "
                                                       "into it (aliasing another tensor?)"),
                "input_mutated": ("INPUT_MUTATED", "the call modified its inputs")}


def cases(ctx: Context) -> list[tuple[str, dict[str, Any]]]:
    """(label, case) per item: one per validation seed (``index``, ``seed``, ``dims`` None = the session's) on each
    test shape (several shapes: ``dims`` and ``shape`` set, labelled ``M=..,N=..,seed=S``), then one per entry of
    the reference's ``extra_dims`` (boundary shapes) with the first seed."""
    out: list[dict[str, Any]] = []
    several = len(ctx.shapes) > 1
    for shape in ctx.shapes:
        for s in ctx.settings.seeds:
            out.append({"index": len(out), "seed": s, "dims": dict(shape) if several else None, "shape": several})
    for extra in ctx.extra_dims:
        out.append({"index": len(out), "seed": ctx.settings.seeds[0], "dims": {**ctx.settings.dims, **extra}})
    return [(case_label(c), c) for c in out]


def case_label(case: Mapping[str, Any]) -> str:
    """``seed=7`` for a seed case, ``M=1024,N=512,seed=7`` for a seed on one of several test shapes, ``M=1,N=1,K=1``
    for a boundary-shape case (its dims)."""
    if case.get("shape"):
        return f"{dims_label(case['dims'])},seed={case['seed']}"
    if case.get("dims"):
        return dims_label(case["dims"])
    return f"seed={case['seed']}"


class LazyArrays(Mapping):
    """A read-only mapping over the members of open ``np.load`` npz files, each read on first access and kept;
    later files win on a repeated name. ``same_as`` maps a name that was not saved to the member holding its values
    (the candidate's process leaves out an array equal to its twin, :data:`pytest_kopt.child.transfer.REPEATS`);
    only those pairs are honoured, and only where the name itself is absent."""

    def __init__(self, *npz: Any, same_as: Mapping[str, str] | None = None) -> None:
        self._src = {name: z for z in npz for name in z.files}
        given = same_as if isinstance(same_as, Mapping) else {}  # anything else from the candidate's process: none
        self._alias = {k: v for k, v in given.items() if isinstance(k, str) and isinstance(v, str)
                       and k not in self._src and v in self._src
                       and any(k.startswith(a) and v == b + k.removeprefix(a) for a, b in REPEATS)}
        self._cache: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in self._cache:
            member = self._alias.get(name, name)
            self._cache[name] = self[member] if member != name else self._src[name][name]
        return self._cache[name]

    def __contains__(self, name: object) -> bool:
        return name in self._src or name in self._alias  # without reading a member

    def __iter__(self) -> Any:
        return iter([*self._src, *self._alias])

    def __len__(self) -> int:
        return len(self._src) + len(self._alias)


def fingerprint(ctx: Context, res: BuildResult, case: Mapping[str, Any], device: str) -> str:
    """What a case's verdict depends on: the build, the reference and the kernel's neighbours, the dims, the case,
    the device, the tolerance overrides and the value regimes."""
    return digest(res.key, local_sources(ctx.ref), local_sources(ctx.kernel), ctx.settings.dims, case, device,
                  ctx.settings.atol, ctx.settings.rtol, ctx.regimes)


def reference_outputs(ctx: Context, req: dict[str, Any], cand: dict[str, Any]) -> dict[str, Any]:
    """Run (or reuse) the reference in its own harness process on the candidate's spec; returns ``{"tolerances",
    "tolerance_warnings", "npz_bytes", "cache_hit"}``. Shared through the session's signed cache under
    ``<cache>/refs/`` (:meth:`pytest_kopt.gates.trust.Trust.cached`), keyed by the reference file, spec, scalars,
    plan, seeds, dims, device, tolerance overrides and any integer inputs taken from ``setup``. The
    tolerance-sanity warnings (:func:`pytest_kopt.gates.verdict.tolerance_warnings`) are computed once, with the
    outputs. Raises KernelRuntimeError (TAMPERED when the outputs changed under it twice) or the harness's errors."""
    import numpy as np

    from .verdict import tolerance_warnings

    key = digest(local_sources(ctx.ref), cand["spec"], cand.get("scalars"), req["plan"], req["seed"], req["seed_b"],
                 req["dims"], req["device"], req["atol"], req["rtol"], cand.get("setup_sha"), cand.get("returned"))

    def compute() -> tuple[dict[str, Any], bytes, str]:
        rreq = {**req, "mode": "reference", "spec": cand["spec"], "scalars": cand.get("scalars", {}),
                "returned": cand.get("returned"), "setup_npz": cand.get("npz"), "env": {}}
        for attempt in (1, 2):  # a file changed under it is computed once more, then reported
            result = ctx.pool.run(rreq, gate="correctness", timeout_s=max(ctx.settings.gate_timeout_s, 120.0),
                                  path=str(ctx.ref), workdir=ctx.work, lock=ctx.device_lock(req["device"]),
                                  server=ctx.server("reference"))
            try:  # checked against the hash its process sent; judged from these bytes only
                data = read_verified(Path(result["npz"]), result.get("npz_sha"), "correctness", ctx.display)
                break
            except KernelRuntimeError:
                if attempt == 2:
                    raise
            finally:
                Path(result["npz"]).unlink(missing_ok=True)
        tols = {n: (t["atol"], t["rtol"]) for n, t in result["tolerances"].items()}
        with np.load(io.BytesIO(data)) as z:
            # only for tolerances someone chose: the defaults would warn on every first kernel
            chosen = [n for n, t in result["tolerances"].items() if "default" not in (t["atol_source"], t["rtol_source"])]
            warns = tolerance_warnings(chosen, LazyArrays(z), tols) if chosen else []
        # the bytes were just checked against this hash: the cache stores it without hashing them again
        return {"tolerances": result["tolerances"], "tolerance_warnings": warns}, data, result["npz_sha"]

    payload, data, hit = ctx.trust.cached(ctx.cache_dir / "refs", key, compute, gate="correctness",
                                          display=ctx.display)
    return {**payload, "npz_bytes": data, "cache_hit": hit}


#: dtypes Triton's interpreter (TRITON_INTERPRET=1) does not compute right: triton 3.8 raises
#: ``'InterpreterBuilder' object has no attribute 'get_bf16'`` on ``2.0 * x`` of a bfloat16 x; an earlier session
#: reported NumPy arithmetic on the bit patterns (2*x of [-0.54, -2.14, -0.82] giving [-0.0, 2.0, 0.0])
INTERPRETER_UNSOUND = frozenset({"bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"})


def interpreter_unsound(ctx: Context, device: str, spec: list[dict[str, Any]] | None,
                        dtypes: dict[str, str] | None = None) -> None:
    """Raise Blocked (by hardware: a GPU judges it) when a Triton kernel would be judged by Triton's CPU interpreter
    on a buffer of a dtype it does not compute right (:data:`INTERPRETER_UNSOUND`): never a false "incorrect"."""
    found = sorted(({b["dtype"] for b in spec or []} | set((dtypes or {}).values())) & INTERPRETER_UNSOUND)
    if device == "cpu" and ctx.kind == "triton" and found:
        raise Blocked("hardware", f"no GPU, and Triton's interpreter does not compute {', '.join(found)} right (it "
                      "fails on or miscomputes these dtypes), so its outputs would say nothing about the kernel: "
                      "a kernel with these dtypes is judged on a GPU")


def gate_correctness(ctx: Context, case: dict[str, Any]) -> Outcome:
    """One case: harness-owned inputs drawn from the seed's plan, outputs NaN-poisoned before every call, four
    candidate calls (twice on set A, set B in the same buffers, set B in new buffers), the reference in its own
    process, and the guards of :func:`pytest_kopt.gates.verdict.judge`. Writes ``correctness/<case>.json``
    (signed). Raises IncorrectError (with the guard's status), KernelRuntimeError (crash, CUDA error, TIMEOUT) or
    ContractError; Blocked by hardware (a ``.cu`` without a GPU) or compile."""
    device = ctx.device_for("correctness", cpu_ok=ctx.kind in ("triton", "python"))
    res = built(ctx)
    interpreter_unsound(ctx, device, (read_dict(ctx.outdir / "plan.json") or {}).get("spec"))
    record: dict[str, Any] = {"case": case, "device": device, "fingerprint": fingerprint(ctx, res, case, device),
                              "passed": False}
    try:
        outcome = _check_case(ctx, res, case, device, record)
        record["passed"] = True
        return outcome
    except KoptError as exc:
        record["status"], record["message"] = exc.status, exc.message
        raise
    finally:
        record["mac"] = ctx.trust.mac(record["fingerprint"], record["passed"])
        write_json(ctx.outdir / "correctness" / f"{case_label(case)}.json", record)


def _check_case(ctx: Context, res: BuildResult, case: dict[str, Any], device: str,
                record: dict[str, Any]) -> Outcome:
    import numpy as np

    from .verdict import judge

    seed = int(case["seed"])
    replay = f"replay: --kopt-seed {ctx.settings.session_seed}" if ctx.settings.session_seed is not None \
        else f"replay: --kopt-seeds {seed}"
    req = harness_request(ctx, "candidate", device, seed, res, dims=case.get("dims"), index=int(case["index"]))
    ctx.pool.prestart(ctx.server("reference"), {}, ctx.work)  # its torch import overlaps the candidate's request
    clock = time.perf_counter()
    hint = None
    if device == "cpu" and ctx.kind == "triton":
        hint = ("Triton's interpreter runs the kernel on the CPU, element by element in NumPy: minutes at sizes a GPU "
                "takes in milliseconds; give smaller --kopt-dims for a run without a GPU (e.g. a few thousand "
                "elements per buffer), or raise --kopt-timeout")
    cand = ctx.pool.run(req, gate="correctness", timeout_s=ctx.settings.gate_timeout_s, path=ctx.display,
                        workdir=ctx.work, lock=ctx.device_lock(device), server=ctx.server("candidate"),
                        timeout_hint=hint)
    record["plan"] = req["plan"]
    for key, (status, what) in GUARD_STATUS.items():
        if cand["guards"].get(key):
            raise IncorrectError(f"seed={seed}: {what}: {', '.join(cand['guards'][key])}", gate="correctness",
                                 path=ctx.display, status=status, fix="write results into the output buffers "
                                 "in place and leave the inputs untouched", details=replay)
    interpreter_unsound(ctx, device, cand["spec"], cand.get("dtypes"))
    # where a seed's wall time goes (s): the candidate's process (inputs, 4 calls, npz), the reference's (cached
    # across candidates), and the judge here
    phase_s = {"candidate": time.perf_counter() - clock, "candidate_save": cand.get("save_s")}
    try:
        clock = time.perf_counter()
        ref = reference_outputs(ctx, req, cand)
        phase_s["reference"] = time.perf_counter() - clock
        clock = time.perf_counter()
        tols = {n: (t["atol"], t["rtol"]) for n, t in ref["tolerances"].items()}
        # which outputs are judged is the reference process's answer, never the candidate's (its process could
        # report no outputs at all); every call's array of each must be there
        outputs = list(ref["tolerances"])
        theirs = set(cand.get("outputs") or [])
        if theirs and set(outputs) != theirs:  # named differently: say so, never judge one output as another
            raise ContractError(f"seed={seed}: the candidate's outputs are {', '.join(sorted(theirs))} but the "
                                f"reference's are {', '.join(outputs)}", gate="correctness", path=ctx.display,
                                details=replay, fix="name the outputs alike: setup()'s \"outputs\" (or the keys "
                                "of the dict run_kernel returns) and ref.py's outputs = [...] (or the keys of the "
                                "dict reference returns); a returned tuple without names is out0, out1, ...")
        with np.load(cand["npz"]) as c, np.load(io.BytesIO(ref["npz_bytes"])) as r:
            arrays = LazyArrays(c, r, same_as=cand.get("same_as"))
            missing = [f"{p}__{o}" for o in outputs for p in ("cand1", "cand2", "candB", "candC")
                       if f"{p}__{o}" not in c.files and f"{p}__{o}" not in arrays]
            if missing or not outputs:
                raise KernelRuntimeError(f"seed={seed}: the candidate's process returned no "
                                         f"{', '.join(missing) or 'outputs'}", gate="correctness",
                                         path=ctx.display, details=f"it reported outputs {cand.get('outputs')}, "
                                         f"the reference {outputs}; {replay}",
                                         fix="the kernel must not touch the harness (its modules, files or pipes)")
            # members are read when the judge asks for them: the low-precision references (their warnings come
            # with the cached reference) and set B's fresh-buffer outputs (needed only on a failure) stay on disk
            poisons = {b["name"]: SECOND_POISON.get(b["dtype"]) for b in cand["spec"] if b["role"] == "output"}
            v = judge(outputs, arrays, tols, check_tolerance=False, second_poison=poisons)
        phase_s["judge"] = time.perf_counter() - clock
        if v.status == "INCORRECT_NUMERICAL":
            unmet = reference_self_check(ctx, req, cand, ref, tols)
            if unmet is not None:
                first = next(iter(ref["tolerances"].values()))
                raise ContractError(f"seed={seed}: the reference cannot meet its own tolerance: {unmet}",
                                    gate="correctness", path=str(ctx.ref), status="UNMEETABLE_TOLERANCE",
                                    details="\n".join(v.details) + f"\n(the kernel's comparison above; tolerances "
                                    f"from {first['atol_source']}/{first['rtol_source']}; {replay})",
                                    fix="loosen atol/rtol in ref.py (or --kopt-atol/--kopt-rtol) to what the "
                                        "reference itself meets, or compute the reference in higher precision")
    finally:
        if os.path.exists(cand["npz"]):
            os.unlink(cand["npz"])
    if v.ok:
        v = dataclasses.replace(v, warnings=(*v.warnings, *ref["tolerance_warnings"]))
    for w in v.warnings:
        warnings.warn(KoptToleranceWarning(f"{ctx.display}: {w}"), stacklevel=1)
    first = next(iter(ref["tolerances"].values()))
    atol, rtol = first["atol"], first["rtol"]
    record.update(v.figures, status=v.status, atol=atol, rtol=rtol, warnings=list(v.warnings),
                  reference_cache_hit=ref["cache_hit"],
                  phase_s={k: round(x, 3) for k, x in phase_s.items() if x is not None})
    figures = {"seed": seed, "regime": req["plan"]["regime"], "device": device, "atol": atol, "rtol": rtol,
               **v.figures}
    if v.warnings:
        figures["tolerance_warning"] = v.warnings[0]
    if not v.ok:
        raise IncorrectError(f"seed={seed} ({req['plan']['regime']} inputs): {v.message}", gate="correctness",
                             path=ctx.display, status=v.status,
                             details="\n".join(v.details) + f"\n(tolerances from {first['atol_source']}/"
                             f"{first['rtol_source']}; {replay})",
                             fix="fix the kernel; details shows where it is wrong (the outputs and first bad indices)",
                             figures={**figures, "record": str(ctx.outdir / "correctness" / f"{case_label(case)}.json")})
    how = "interpreter (TRITON_INTERPRET=1)" if device == "cpu" and ctx.kind == "triton" else device
    if req.get("autotune_pin"):
        how += " with the pinned config " + "; ".join(f"{k}: {describe(c)}" for k, c in req["autotune_pin"].items())
    return Outcome(figures, f"{case_label(case)} ({req['plan']['regime']}) on {how}: max abs err "
                            f"{v.figures['max_abs_err']:.3g}, max rel err {v.figures['max_rel_err']:.3g} "
                            f"(atol={atol:g}, rtol={rtol:g}){'; tolerance warning' if v.warnings else ''}")


def reference_self_check(ctx: Context, req: dict[str, Any], cand: dict[str, Any], ref: dict[str, Any],
                         tols: dict[str, tuple[float, float]]) -> str | None:
    """After a numerical failure: the reference on set A against the same reference computed in float64 (its own
    rounding out of the picture), with the task's tolerance. Returns the comparison's text when the reference
    itself is outside it (no kernel computing in another order can then pass reliably), else None; also None when
    the reference does not run in float64 (nothing can be said)."""
    import numpy as np

    from .verdict import compare

    rreq = {**req, "mode": "reference_fp64", "spec": cand["spec"], "scalars": cand.get("scalars", {}),
            "returned": cand.get("returned"), "setup_npz": cand.get("npz"), "env": {}}
    try:
        result = ctx.pool.run(rreq, gate="correctness", timeout_s=max(ctx.settings.gate_timeout_s, 120.0),
                              path=str(ctx.ref), workdir=ctx.work, lock=ctx.device_lock(req["device"]),
                              server=ctx.server("reference"))
    except KoptError:
        return None
    try:
        data = read_verified(Path(result["npz"]), result.get("npz_sha"), "correctness", ctx.display)
    finally:
        Path(result["npz"]).unlink(missing_ok=True)
    with np.load(io.BytesIO(ref["npz_bytes"])) as r, np.load(io.BytesIO(data)) as h:
        for name, (atol, rtol) in tols.items():
            if f"hi__{name}" not in h.files:
                continue
            c = compare(name, r[f"ref__{name}"], h[f"hi__{name}"], atol, rtol)
            if not c.ok:
                return "against float64 " + c.describe(atol, rtol)
    return None


def require_correct(ctx: Context, res: BuildResult, device: str) -> None:
    """For a gate that needs a correct kernel: every correctness case must have passed for this exact build,
    as this session's signed records say; a case without one is run now. Raises Blocked by correctness."""
    for label, case in cases(ctx):
        rec = CorrectnessRecord.load(ctx.outdir / "correctness" / f"{label}.json")
        fp = fingerprint(ctx, res, case, device)
        if rec is None or rec.fingerprint != fp or not ctx.trust.verify(rec.mac, fp, rec.passed):
            try:
                gate_correctness(ctx, case)
            except KoptError as exc:
                raise Blocked("correctness", f"{label}: {exc.message}") from None
        elif not rec.passed:
            raise Blocked("correctness", f"{label}: {rec.message or 'failed'}")
