"""The request a gate sends to a harness process (the fields are listed in :mod:`pytest_kopt.child`)."""

from __future__ import annotations

from typing import Any

from .build import BuildResult
from .context import Context
from .inputs import derive_seeds, draw_plan, second_poisons
from .preflight import preflight


def inplace_outputs(ctx: Context) -> list[str]:
    """The reference's ``inplace`` list: outputs that are also inputs (an operation such as ``x.clamp_()``)."""
    value = ctx.ref_constant("inplace")
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else []


def harness_request(ctx: Context, mode: str, device: str, seed: int, res: BuildResult,
                    dims: dict[str, Any] | None = None, index: int = 0,
                    timing: dict[str, Any] | None = None, plan: dict[str, Any] | None = None) -> dict[str, Any]:
    """A request of ``mode`` for ``ctx``'s kernel built as ``res``, on ``device`` (``cuda`` or ``cpu``), with the
    inputs of validation seed number ``index`` (value ``seed``) at ``dims`` (None: the session's). ``timing``: the
    timing policy, for the timing modes. Triton and Python candidates get their build's ``TRITON_CACHE_DIR``, and
    ``TRITON_INTERPRET=1`` on the CPU; an ``@triton.autotune`` kernel runs the config its build pinned
    (``autotune_pin``: kernel name -> config kwargs), never tuning again. ``transport``: how the candidate's
    process hands arrays to the judge (``ipc``; ``npz`` with ``--kopt-fresh-process``, where it ends first).
    ``ref_sha``: the reference's content pinned at the session's start (the reference's process loads nothing
    else); ``poisons``: the second call's poison per float dtype, drawn from the second seed
    (:func:`~pytest_kopt.gates.inputs.second_poisons`); ``check_seed``: the seed of the inputs of a timed process's
    check call, which the judge draws again itself. ``plan``: the input plan, instead of the seed's (a shrunk
    case's, :mod:`pytest_kopt.gates.shrink`); ``precision``: a KernelBench problem's (``--kopt-precision``)."""
    dims = ctx.settings.dims if dims is None else dims
    params = [{"name": p.name, "dtype": p.dtype, "role": p.role} for p in preflight(ctx)]
    env = ctx.kind.candidate_env(ctx, device)
    seed_b, check_seed = derive_seeds(seed, 2)
    return {**ctx.kind.request_fields(ctx), "mode": mode, "kernel": str(ctx.kernel), "library": res.artifact,
            "params": params, "ref": str(ctx.ref), "ref_sha": ctx.ref_sha, "dims": dims, "seed": seed, "seed_b": seed_b,
            "check_seed": check_seed, "poisons": second_poisons(seed_b), "device": device,
            "plan": plan or draw_plan(seed, index, ctx.regimes), "atol": ctx.settings.atol, "rtol": ctx.settings.rtol,
            "precision": ctx.settings.precision,
            "arch": ctx.arch, "env": env, "timing": timing, "inplace": inplace_outputs(ctx),
            "autotune_pin": {name: c["config"] for name, c in res.autotune.items()},
            # a fresh process ends with its request, and its exported allocations with it: the judge, which runs
            # after it, reads its arrays from an .npz then
            "transport": "npz" if ctx.settings.fresh_process else "ipc"}
