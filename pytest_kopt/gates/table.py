"""The gate table: the only place that knows the gates' order, prerequisites, cases, seriality and strictness.

Collection builds one item per (gate, case) in table order; :func:`run` runs one item, skipping it as "blocked by
<gate>" when a prerequisite did not pass in this process (never running it to fail again); the loop reads which
gates are strict and what stopping at a gate means from here. Adding a gate is one row and one module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..errors import EXIT_CONFIG, EXIT_HARDWARE, EXIT_KERNEL, Blocked, KoptError
from . import correctness, sanitizer
from .build import gate_compile
from .context import Context, Outcome
from .hardware import gate_hardware
from .ncu import gate_ncu
from .plan import gate_plan
from .preflight import gate_preflight
from .roofline import gate_roofline
from .sass import gate_sass
from .timing import gate_timing, timing_cases

Cases = Callable[[Context], list[tuple[str, Any]]]


@dataclass(frozen=True, slots=True)
class Gate:
    """One row of the table.

    ``run(ctx, case) -> Outcome`` raises a :class:`~pytest_kopt.errors.KoptError` when it decides against the
    kernel, :class:`~pytest_kopt.errors.Blocked` when it cannot run, :class:`~pytest_kopt.errors.NotApplicable`
    when it does not apply. ``needs``: gates that must not have failed (or been blocked) for this kernel.
    ``cases(ctx) -> [(label, case)]``: one item per case (``correctness[seed=7]``); None for one item. ``serial``:
    the gate works on the GPU (under the per-GPU lock; a ``gpu`` marker), except for the kernel kinds in
    ``cpu_kinds``, which it runs without one. ``strict``: SKILL.md's strict gate, which the loop needs passed.
    ``per_branch``: collected for every branch and ablation of ``--kopt-run`` (the champion alone is profiled,
    when the iteration closes). ``stop_exit``: SKILL.md's exit code of a run stopped because this gate failed or
    blocked it."""

    name: str
    run: Callable[[Context, Any], Outcome]
    needs: tuple[str, ...] = ()
    cases: Cases | None = None
    serial: bool = False
    strict: bool = False
    cpu_kinds: tuple[str, ...] = ()
    per_branch: bool = True
    stop_exit: int = EXIT_KERNEL

    def items(self, ctx: Context) -> list[tuple[str, Any]]:
        """(node-id suffix, case) of each item for ``ctx``'s kernel: ``("", None)`` for a gate without cases."""
        if self.cases is None:
            return [("", None)]
        return [(f"[{label}]" if label else "", case) for label, case in self.cases(ctx)]

    def on_gpu(self, ctx: Context) -> bool:
        """True when this gate needs a GPU for ``ctx``'s kernel (its items carry the ``gpu`` marker)."""
        return self.serial and ctx.kind not in self.cpu_kinds


GATES: tuple[Gate, ...] = (
    Gate("hardware", gate_hardware, strict=True, stop_exit=EXIT_HARDWARE),
    Gate("preflight", gate_preflight, strict=True, stop_exit=EXIT_CONFIG),
    Gate("plan", gate_plan, needs=("preflight",), strict=True, stop_exit=EXIT_CONFIG),
    Gate("compile", gate_compile, needs=("hardware", "preflight", "plan"), strict=True),
    Gate("correctness", correctness.gate_correctness, needs=("compile",), cases=correctness.cases, serial=True,
         strict=True, cpu_kinds=("triton", "python")),
    Gate("sanitizer", sanitizer.gate_sanitizer, needs=("compile",), cases=sanitizer.cases, serial=True),
    Gate("timing", gate_timing, needs=("correctness",), cases=timing_cases, serial=True, strict=True),
    Gate("ncu", gate_ncu, needs=("correctness",), serial=True, strict=True, per_branch=False,
         stop_exit=EXIT_HARDWARE),
    Gate("roofline", gate_roofline, needs=("ncu",), serial=True, strict=True, per_branch=False,
         stop_exit=EXIT_HARDWARE),
    Gate("sass", gate_sass, needs=("compile",), stop_exit=EXIT_HARDWARE),
)
BY_NAME = {g.name: g for g in GATES}
ORDER = {g.name: i for i, g in enumerate(GATES)}
STRICT = tuple(g.name for g in GATES if g.strict)


def run(gate: Gate, ctx: Context, case: Any = None, label: str = "") -> Outcome:
    """Run one item of ``gate`` on ``ctx``'s kernel. Raises Blocked naming the origin when a prerequisite did not
    pass in this process (the gate is not run), else whatever the gate raises; a failure or block is noted in
    ``ctx.blocks`` (with ``label``, the case, in the reason) for the gates that need this one."""
    hit = ctx.blocks.blocker(ctx.kernel, gate.needs)
    if hit is not None:
        ctx.blocks.record(ctx.kernel, gate.name, *hit)
        raise Blocked(*hit)
    try:
        return gate.run(ctx, case)
    except Blocked as exc:
        ctx.blocks.record(ctx.kernel, gate.name, exc.gate, exc.reason, exc.fix)
        raise
    except KoptError as exc:
        ctx.blocks.record(ctx.kernel, gate.name, gate.name, f"{label}: {exc.message}" if label else exc.message)
        raise


def stop_exit(gate: str) -> int:
    """SKILL.md's exit code of a run that stopped at ``gate`` (3 hardware/tool/ncu, 4 contract, else 2); for a
    stage that is no gate of the table (the loop's own: ``methods`` 4, ``branch_explore`` 2)."""
    if gate in BY_NAME:
        return BY_NAME[gate].stop_exit
    return EXIT_CONFIG if gate == "methods" else EXIT_KERNEL
