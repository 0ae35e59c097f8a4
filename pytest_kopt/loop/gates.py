"""What the loop asks of the gates, in one place: which gates a branch must pass, building a kernel, profiling the
champion, re-timing kernels side by side, reading a build's SASS, and the plotting import the gates started ahead.

Every call from :mod:`pytest_kopt.loop` into :mod:`pytest_kopt.gates` goes through this module, so a change to
the gates' modules changes this file only (tests replace these names to stand in for the GPU).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping

from ..gates.build import ensure_built
from ..gates.context import Context
from ..gates.ncu import COUNTER_PERMISSION, gate_ncu
from ..gates.roofline import gate_roofline, wait_plotting as _wait_plotting
from ..gates.sass import sass_digests, sass_evidence
from ..gates.table import STRICT as _STRICT
from ..gates.timing import retime_interleaved

__all__ = ["BRANCH_GATES", "STRICT", "Context", "build", "counters_unreadable", "digests", "evidence",
           "profile_champion", "retime", "wait_plotting"]

#: The strict gates of a branch or ablation in a close (ncu and roofline run for the champion alone). To come
#: from the gate table (``Gate.per_branch``) once it says so.
BRANCH_GATES = ("compile", "correctness", "timing")
#: The gates a baseline must pass at ``--kopt-init`` (the table's strict gates; ``Gate.strict`` later).
STRICT = _STRICT


def build(ctx: Context) -> None:
    """Build ``ctx``'s kernel (or find its build in the cache). Raises the gate's KoptError or Blocked."""
    ensure_built(ctx)


def profile_champion(ctx: Context) -> None:
    """The champion's ncu profile (with the run's set, ``ctx.settings.ncu_set``) and its roofline, written into its
    artifact folder (``kernel.ncu-rep``, ``ncu_top.json``, ``roofline.json``). The two gates are called by hand
    here; they will come from the gate table's champion gates. Raises the gates' KoptError or Blocked."""
    gate_ncu(ctx)
    gate_roofline(ctx)


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


def wait_plotting() -> None:
    """Wait for matplotlib's import, started ahead by the roofline gate (the loop draws its charts after)."""
    _wait_plotting()
