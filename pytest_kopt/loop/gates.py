"""What the loop asks of the gates, in one place: which gates a branch must pass (the session's gate table, through
the kernel's context), building a kernel, profiling the champion, re-timing kernels side by side, reading a build's
SASS.

Every call from :mod:`pytest_kopt.loop` into :mod:`pytest_kopt.gates` goes through this module, so a change to
the gates' modules changes this file only (tests replace these names to stand in for the GPU).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping

from ..gates.build import ensure_built
from ..gates.context import Context
from ..gates.measure import retime_interleaved
from ..gates.ncu import COUNTER_PERMISSION
from ..gates.sass import sass_digests, sass_evidence
from ..gates.table import GateTable

__all__ = ["Context", "GateTable", "build", "counters_unreadable", "digests", "evidence", "profile_champion",
           "retime"]


def build(ctx: Context) -> None:
    """Build ``ctx``'s kernel (or find its build in the cache). Raises the gate's KoptError or Blocked."""
    ensure_built(ctx)


def profile_champion(ctx: Context) -> None:
    """The gates the session's table runs for the champion alone (``Gate.per_branch`` False: kopt's ncu profile,
    with the run's set ``ctx.settings.ncu_set``, then its roofline), in order, written into its artifact folder
    (``kernel.ncu-rep``, ``ncu_top.json``, ``roofline.json``). Raises the gates' KoptError or Blocked."""
    for gate in ctx.gates.champion_only:
        gate.run(ctx, None)


def counters_unreadable(message: str | None) -> bool:
    """True when an ncu item's message says the GPU's performance counters cannot be read (ERR_NVGPUCTRPERM)."""
    return COUNTER_PERMISSION in (message or "")


def retime(ctxs: list[Context]) -> list[dict[str, Any]]:
    """The kernels of ``ctxs`` timed side by side in alternating rounds on this process's GPU: per kernel
    ``median_ms``, ``samples_ms``, ``stop_reason``, ``gpu_uuid``. Raises the harness's KoptError."""
    return retime_interleaved(ctxs)


def digests(sass_dir: Path) -> dict[str, str]:
    """Per kernel function of a build's dumped SASS (``<artifact folder>/sass/``), the SHA-256 of its instruction
    lines; {} when there is none."""
    return sass_digests(sass_dir)


def evidence(methods: Iterable[str], texts: list[str], signatures: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Per claimed method, its SASS verification (``status`` and the opcodes required, found and missing) in the
    dumped ``texts`` against the registry's ``signatures``."""
    return sass_evidence(list(methods), texts, signatures)
