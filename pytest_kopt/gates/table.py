"""The gate table: the registry of a session's gates, and the only place that knows their order, prerequisites,
cases, seriality, strictness and where each runs.

kopt's own rows are in :mod:`pytest_kopt.gates.builtin`; a plugin or a conftest adds its own through the
``pytest_kopt_gates`` hook (:mod:`pytest_kopt.plugin.hookspec`), and :meth:`GateTable.build` places each one after
its prerequisites. Collection builds one item per (gate, case) in table order; :func:`run` runs one item, skipping it
as "blocked by <gate>" when a prerequisite did not pass in this process (never running it to fail again); the loop,
the reports and the early starts read which gates are strict, which run per branch, which use the kernel's harness
processes and what stopping at a gate means from here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import EXIT_CONFIG, EXIT_KERNEL, Blocked, ConfigError, KoptError, NotApplicable
from .context import Context, Outcome

Cases = Callable[[Context], list[tuple[str, Any]]]


@dataclass(frozen=True, slots=True)
class Gate:
    """One row of the table.

    ``run(ctx, case) -> Outcome`` raises a :class:`~pytest_kopt.errors.KoptError` when it decides against the
    kernel, :class:`~pytest_kopt.errors.Blocked` when it cannot run, :class:`~pytest_kopt.errors.NotApplicable`
    when it does not apply. ``needs``: gates that must not have failed (or been blocked) for this kernel.
    ``cases(ctx) -> [(label, case)]``: one item per case (``correctness[seed=7]``); None for one item. ``serial``:
    the gate works on the GPU (under the per-GPU lock; a ``gpu`` marker), except for the kernel kinds that run it on
    the CPU (:attr:`~pytest_kopt.kinds.base.Kind.cpu_gates`). ``strict``: SKILL.md's strict gate, which the loop
    needs passed. ``per_branch``: collected for every branch and ablation of ``--kopt-run`` (False: the champion
    alone, when the iteration closes). ``stop_exit``: SKILL.md's exit code of a run stopped because this gate failed
    or blocked it. ``harness``: its requests go to the kernel's warm harness processes, started at its first item.
    ``after``: place it right after this gate (default: after the last of its ``needs``, else at the end).
    ``planned(ctx, case) -> figures``: what the item would check, reported on a skip too (the correctness gate's
    edge shapes, so a blocked kernel's report still lists them); None for nothing."""

    name: str
    run: Callable[[Context, Any], Outcome]
    needs: tuple[str, ...] = ()
    cases: Cases | None = None
    serial: bool = False
    strict: bool = False
    per_branch: bool = True
    stop_exit: int = EXIT_KERNEL
    harness: bool = False
    after: str | None = None
    planned: Callable[[Context, Any], dict[str, Any]] | None = None

    def items(self, ctx: Context) -> list[tuple[str, Any]]:
        """(node-id suffix, case) of each item for ``ctx``'s kernel: ``("", None)`` for a gate without cases."""
        if self.cases is None:
            return [("", None)]
        return [(f"[{label}]" if label else "", case) for label, case in self.cases(ctx)]

    def on_gpu(self, kind: Any) -> bool:
        """True when this gate needs a GPU for a kernel of ``kind`` (its items carry the ``gpu`` marker)."""
        return self.serial and self.name not in kind.cpu_gates


class GateTable:
    """The session's gates in order. Built once per session (:meth:`build`), kept in its stash and handed to every
    gate context (``ctx.gates``); its views answer what used to be lists of gate names written in several places."""

    def __init__(self, gates: Iterable[Gate]) -> None:
        self.gates: tuple[Gate, ...] = tuple(gates)
        self.by_name: Mapping[str, Gate] = {g.name: g for g in self.gates}
        #: gate name -> its position (a gate of another table, as a record of an older report may name, sorts last)
        self.order: Mapping[str, int] = {g.name: i for i, g in enumerate(self.gates)}

    @classmethod
    def build(cls, builtin: Iterable[Gate], added: Iterable[Gate] = ()) -> "GateTable":
        """kopt's ``builtin`` rows in their order, then each ``added`` row placed after its ``after`` gate, else
        right after the last of its ``needs``, else at the end. Raises ConfigError for a name used twice, a
        prerequisite or ``after`` that names no gate, or a row placed before one of its prerequisites."""
        rows = list(builtin)
        for g in added:
            names = [r.name for r in rows]
            if g.name in names:
                raise ConfigError(f"two gates are named {g.name!r}", fix="give the plugin's gate another name")
            anchors = [g.after] if g.after else list(g.needs)
            missing = [a for a in anchors if a not in names]
            if missing:
                raise ConfigError(f"gate {g.name!r} names {', '.join(map(repr, missing))}, which is no gate",
                                  fix=f"name gates of the table: {', '.join(names)}")
            at = max((names.index(a) for a in anchors), default=len(rows) - 1) + 1
            rows.insert(at, g)
        table = cls(rows)
        for g in table.gates:
            late = [n for n in g.needs if n not in table.order or table.order[n] > table.order[g.name]]
            if late:
                raise ConfigError(f"gate {g.name!r} needs {', '.join(late)}, which does not come before it",
                                  fix="place the gate after its prerequisites (Gate.after)")
        return table

    def __iter__(self) -> Any:
        return iter(self.gates)

    def __getitem__(self, name: str) -> Gate:
        return self.by_name[name]

    @property
    def names(self) -> list[str]:
        """The gates' names in order."""
        return [g.name for g in self.gates]

    @property
    def strict(self) -> tuple[str, ...]:
        """SKILL.md's strict gates, in order: a kernel passes them all before the loop accepts it."""
        return tuple(g.name for g in self.gates if g.strict)

    @property
    def branch_strict(self) -> tuple[str, ...]:
        """The strict gates a branch or ablation of a loop's close is judged by (those run per branch)."""
        return tuple(g.name for g in self.gates if g.strict and g.per_branch)

    @property
    def champion_only(self) -> tuple[Gate, ...]:
        """The gates a loop's close runs for its champion alone, in order (``per_branch`` False: ncu, roofline)."""
        return tuple(g for g in self.gates if not g.per_branch)

    @property
    def harness(self) -> frozenset[str]:
        """The gates whose requests go to a kernel's warm harness processes."""
        return frozenset(g.name for g in self.gates if g.harness)

    def rank(self, gate: str) -> int:
        """A gate's position for sorting (a name the table does not know sorts after every gate)."""
        return self.order.get(gate, len(self.gates))

    def stop_exit(self, gate: str) -> int:
        """SKILL.md's exit code of a run that stopped at ``gate`` (3 hardware/tool/ncu, 4 contract, else 2); for a
        stage that is no gate of the table (the loop's own: ``methods`` 4, ``branch_explore`` 2)."""
        if gate in self.by_name:
            return self.by_name[gate].stop_exit
        return EXIT_CONFIG if gate == "methods" else EXIT_KERNEL


def planned_figures(gate: Gate, ctx: Context, case: Any = None) -> dict[str, Any]:
    """``gate``'s :attr:`Gate.planned` figures for an item that did not run ({} when it has none, or when what it
    reads cannot be read: a kernel blocked at preflight has no plan to report, and its skip says why)."""
    if gate.planned is None:
        return {}
    try:
        return dict(gate.planned(ctx, case))
    except Exception:  # noqa: BLE001 - figures for a skip: the skip's own reason stands whatever this meets
        return {}


def run(gate: Gate, ctx: Context, case: Any = None, label: str = "") -> Outcome:
    """Run one item of ``gate`` on ``ctx``'s kernel. Raises Blocked naming the origin when a prerequisite did not
    pass in this process (the gate is not run), NotApplicable when the kernel's kind says the gate does not apply
    to it (:attr:`~pytest_kopt.kinds.base.Kind.not_applicable`), else whatever the gate raises; a failure or block
    is noted in ``ctx.blocks`` (with ``label``, the case, in the reason) for the gates that need this one."""
    hit = ctx.blocks.blocker(ctx.kernel, gate.needs)
    if hit is not None:
        ctx.blocks.record(ctx.kernel, gate.name, *hit)
        raise Blocked(*hit)
    reason = ctx.kind.not_applicable.get(gate.name)
    if reason is not None:
        raise NotApplicable(reason)
    try:
        return gate.run(ctx, case)
    except Blocked as exc:
        if not exc.local:
            ctx.blocks.record(ctx.kernel, gate.name, exc.gate, exc.reason, exc.fix)
        raise
    except KoptError as exc:
        ctx.blocks.record(ctx.kernel, gate.name, gate.name, f"{label}: {exc.message}" if label else exc.message)
        raise
