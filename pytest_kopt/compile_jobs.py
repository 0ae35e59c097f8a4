"""How many nvcc builds run at once (SKILL.md's ``--compile-jobs auto|N``), within a memory budget, and the serial
retry of a build the machine killed for want of memory.

:class:`BuildSlots` is the scheduler's (:class:`pytest_kopt.scheduler.Scheduler`): each build takes a job and its
memory estimate before nvcc starts and gives them back after; one build always runs, however large its estimate.
Numbers are SKILL.md's (:mod:`pytest_kopt.defaults`): ``auto`` is half the CPUs, at most 4, with 2 GiB a CUDA
build and 4 GiB a CUTLASS one out of the available memory less 2 GiB. A limit holds per pytest process (under xdist
the controller starts the builds where its workers are local).
"""

from __future__ import annotations

import os
import re
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

from . import defaults

GIB = 1024 ** 3
#: nvcc's output when the machine ran out of memory: the kernel's OOM killer (signal 9: ``Killed``, ``died due to
#: signal 9``) or an allocation failure inside cicc/ptxas.
_OOM = re.compile(r"signal 9|\bKilled\b|exit -9\b|out of memory|bad_alloc|Cannot allocate memory|"
                  r"virtual memory exhausted", re.I)


def available_memory() -> int | None:
    """Bytes the kernel reports as available to new work (``MemAvailable`` of ``/proc/meminfo``), None where it
    cannot be read (not Linux)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


@dataclass(frozen=True, slots=True)
class JobPlan:
    """``jobs``: the most builds at once; ``memory_bytes``: the budget their estimates share (None: no budget
    known); ``why``: how the numbers were reached, for the report."""

    jobs: int
    memory_bytes: int | None
    why: str


def plan_jobs(spec: str | int, cpus: int | None = None, available: int | None = None) -> JobPlan:
    """The limits of ``--kopt-compile-jobs spec``: ``auto`` is min(half the CPUs, 4), at least 1; N is N. Both
    share the memory budget: ``available`` (bytes, default :func:`available_memory`) less 2 GiB."""
    cpus = cpus if cpus is not None else (os.cpu_count() or 1)
    free = available if available is not None else available_memory()
    budget = None if free is None else max(0, free - int(defaults.COMPILE_MEMORY_KEPT_GIB * GIB))
    if spec == "auto":
        jobs = max(1, min(cpus // 2, defaults.COMPILE_JOBS_MAX))
        why = f"auto: half of {cpus} CPUs, at most {defaults.COMPILE_JOBS_MAX}"
    else:
        jobs, why = int(spec), f"--kopt-compile-jobs {spec}"
    if budget is not None:
        why += f"; memory budget {budget / GIB:.1f} GiB"
    return JobPlan(jobs, budget, why)


def build_gib(cutlass: bool) -> float:
    """The memory estimate of one build (GiB): CUTLASS's templates take about twice a plain CUDA build's."""
    return defaults.COMPILE_GIB_CUTLASS if cutlass else defaults.COMPILE_GIB_CUDA


def out_of_memory(message: str | None, details: str | None) -> bool:
    """True when a failed build's message or log says the machine ran out of memory (see ``_OOM``)."""
    return bool(_OOM.search(f"{message or ''}\n{details or ''}"))


class BuildSlots:
    """Jobs and memory shared by one process's builds. :meth:`take` holds one build's share while it runs;
    :meth:`alone` waits until no build runs and keeps every other one out (the serial retry)."""

    def __init__(self, plan: JobPlan) -> None:
        self.plan = plan
        self._cond = threading.Condition()
        self._running = 0
        self._memory = 0
        self._alone = False
        #: the most builds that ran at once (tests and the report read it)
        self.peak = 0

    def _fits(self, need: int) -> bool:
        if self._alone:
            return False
        if self._running == 0:
            return True  # one build always runs, whatever its estimate
        if self._running >= self.plan.jobs:
            return False
        return self.plan.memory_bytes is None or self._memory + need <= self.plan.memory_bytes

    @contextmanager
    def take(self, gib: float) -> Iterator[None]:
        """Hold a job and ``gib`` GiB of the budget for the block (waiting until they are free)."""
        need = int(gib * GIB)
        with self._cond:
            self._cond.wait_for(lambda: self._fits(need))
            self._running += 1
            self._memory += need
            self.peak = max(self.peak, self._running)
        try:
            yield
        finally:
            with self._cond:
                self._running -= 1
                self._memory -= need
                self._cond.notify_all()

    @contextmanager
    def alone(self) -> Iterator[None]:
        """Run the block with no other build running (waiting for those that run to end)."""
        with self._cond:
            self._cond.wait_for(lambda: not self._alone and self._running == 0)
            self._alone = True
            self._running = 1
            self.peak = max(self.peak, 1)
        try:
            yield
        finally:
            with self._cond:
                self._alone = False
                self._running = 0
                self._cond.notify_all()
