"""The request a gate sends to a harness process (the fields are listed in :mod:`pytest_kopt.child`)."""

from __future__ import annotations

from typing import Any

from ..errors import ContractError
from ..seeds import derive_seeds
from .build import BuildResult
from .context import Context
from .pycontract import read_python
from .inputs import draw_plan, second_poisons
from .preflight import preflight


def inplace_outputs(ctx: Context) -> list[str]:
    """The reference's ``inplace`` list: outputs that are also inputs (an operation such as ``x.clamp_()``)."""
    value = ctx.ref_constant("inplace")
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else []


#: The product of the size dims a run without a GPU is suggested (a TIMEOUT's fix): about 10^5, which Triton's
#: interpreter runs in seconds (a KernelBench linear layer at 64x32x64: 7.6 s for five seeds on 2 cores).
CPU_DIMS_BUDGET = 2 ** 17


def smaller_dims(dims: dict[str, Any], budget: int = CPU_DIMS_BUDGET) -> dict[str, Any] | None:
    """``dims`` with every size (an integer of at least 16) halved as often as it takes for their product to reach
    ``budget`` (each kept at 16 or more; other dims, such as ``eps`` or a kernel size of 3, as they are); None when
    they are that small already."""
    sizes = {k: v for k, v in dims.items() if isinstance(v, int) and not isinstance(v, bool) and v >= 16}

    def product(shift: int) -> int:
        out = 1
        for v in sizes.values():
            out *= max(16, v >> shift)
        return out

    if not sizes or product(0) <= budget:
        return None
    shift = next((s for s in range(1, 64) if product(s) <= budget or all(v >> s <= 16 for v in sizes.values())))
    return {k: (max(16, v >> shift) if k in sizes else v) for k, v in dims.items()}


def cpu_dims_hint(ctx: Context, dims: dict[str, Any]) -> str | None:
    """The ``--kopt-dims`` text of :func:`smaller_dims` for a run on the CPU at ``dims`` (a KernelBench problem's
    integer size globals stand for the dims not given), for a TIMEOUT's fix to name; None when nothing smaller
    helps. Raises ContractError for a reference that does not parse."""
    full = dict(dims)
    contract = read_python(ctx.ref)
    if contract.problem_format == "kernelbench":  # its sizes are module globals, which dims of the same name set
        for name in contract.assigned:
            value = contract.constants.get(name)
            if isinstance(value, int) and not isinstance(value, bool):
                full.setdefault(name, value)
    small = smaller_dims(full)
    return ",".join(f"{k}={v}" for k, v in small.items()) if small else None


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
    params = [{"name": p.name, "dtype": p.dtype, "ctype": p.ctype, "role": p.role} for p in preflight(ctx)]
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
            "transport": "npz" if ctx.settings.fresh_process else "ipc",
            # what a TIMEOUT's fix suggests for a run without a GPU (the pool names it; the harness ignores it)
            "smaller_dims": _cpu_hint(ctx, dims) if device == "cpu" else None}


def _cpu_hint(ctx: Context, dims: dict[str, Any]) -> str | None:
    try:
        return cpu_dims_hint(ctx, dims)
    except ContractError:  # a reference that does not parse: the preflight item says so
        return None
