"""kopt's own gates, as rows of the gate table (:class:`pytest_kopt.gates.table.Gate`), in their order: what
``pytest_kopt_gates`` answers for kopt (:mod:`pytest_kopt.plugin.hookspec`). Adding a gate of kopt's own is one row
here and one module; a plugin's gate is one row in its own ``pytest_kopt_gates``."""

from __future__ import annotations

from ..errors import EXIT_CONFIG, EXIT_HARDWARE
from . import correctness, sanitizer
from .build import gate_compile
from .hardware import gate_hardware
from .ncu import gate_ncu
from .plan import gate_plan
from .preflight import gate_preflight
from .roofline import gate_roofline
from .sass import gate_sass
from .table import Gate, GateTable
from .timing import gate_timing, timing_cases


def builtin_gates() -> list[Gate]:
    """kopt's gates in order: hardware, preflight, plan, compile, correctness (a case per seed and shape),
    sanitizer (a case per tool), timing (a case per benchmark shape when there are several), ncu, roofline, sass."""
    return [
        Gate("hardware", gate_hardware, strict=True, stop_exit=EXIT_HARDWARE),
        Gate("preflight", gate_preflight, strict=True, stop_exit=EXIT_CONFIG),
        Gate("plan", gate_plan, needs=("preflight",), strict=True, stop_exit=EXIT_CONFIG, harness=True),
        Gate("compile", gate_compile, needs=("hardware", "preflight", "plan"), strict=True),
        Gate("correctness", correctness.gate_correctness, needs=("compile",), cases=correctness.cases, serial=True,
             strict=True, harness=True, planned=correctness.planned),
        Gate("sanitizer", sanitizer.gate_sanitizer, needs=("compile",), cases=sanitizer.cases, serial=True),
        Gate("timing", gate_timing, needs=("correctness",), cases=timing_cases, serial=True, strict=True,
             harness=True),
        Gate("ncu", gate_ncu, needs=("correctness",), serial=True, strict=True, per_branch=False,
             stop_exit=EXIT_HARDWARE),
        Gate("roofline", gate_roofline, needs=("ncu",), serial=True, strict=True, per_branch=False,
             stop_exit=EXIT_HARDWARE),
        Gate("sass", gate_sass, needs=("compile",), stop_exit=EXIT_HARDWARE),
    ]


def default_table() -> GateTable:
    """The table of a session that no plugin adds a gate to (for code that runs without one: tests, benchmarks)."""
    return GateTable.build(builtin_gates())
