"""What every gate gets (:class:`Context`) and returns (:class:`Outcome`), and what the gates of one process
remember about each other (:class:`BlockLog`): a gate whose prerequisite failed is blocked, never run again."""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import NO_GPU_FIX, NO_GPU_TIMING_FIX, Blocked, ContractError
from ..proc.gpulock import GpuLock
from ..proc.pool import HarnessPool
from ..settings import DEFAULT_ARCH, Settings
from .inputs import DEFAULT_REGIMES, FORMAT_REGIMES, REGIMES
from .pins import Pins
from .pycontract import read_python
from .trust import Trust

@dataclass(frozen=True, slots=True)
class Outcome:
    """What a passing gate reports: scalar ``figures`` (they become junit ``user_properties``), a one-line
    ``summary`` for the terminal, and the artifact paths it wrote."""

    figures: dict[str, Any] = field(default_factory=dict)
    summary: str = ""
    artifacts: tuple[str, ...] = ()


class BlockLog:
    """The gates that failed or were blocked in this process, per kernel: ``(kernel, gate) -> (origin, reason,
    fix)``, where ``origin`` is the gate whose failure is the cause (the gate itself when it failed) and ``fix`` what
    to change when the cause is not an item's failure (no GPU, a tool missing), else None. A gate whose
    prerequisite is here is skipped as "blocked by <origin>" without running (:func:`pytest_kopt.gates.table.run`).
    Under xdist one kernel's items run on one worker, in table order, so each worker's log sees its kernels'
    prerequisites."""

    def __init__(self) -> None:
        self._log: dict[tuple[str, str], tuple[str, str, str | None]] = {}

    def record(self, kernel: Path, gate: str, origin: str, reason: str, fix: str | None = None) -> None:
        """Note that ``gate`` did not pass for ``kernel`` (the first cause is kept)."""
        self._log.setdefault((str(kernel), gate), (origin, reason, fix))

    def blocker(self, kernel: Path, gates: tuple[str, ...]) -> tuple[str, str, str | None] | None:
        """(origin gate, reason, fix) of the first of ``gates`` that did not pass for ``kernel``, else None."""
        for g in gates:
            hit = self._log.get((str(kernel), g))
            if hit is not None:
                return hit
        return None


#: The warm harness processes' roles (:meth:`Context.server`); those in :data:`pytest_kopt.proc.pool.PROFILED_ROLES`
#: warm the profiler up.
SERVER_ROLES = ("check", "candidate", "judge", "reference", "shrink")


def cupti_starts(env: dict[str, Any]) -> bool:
    """Whether cupti-python is installed (``env["packages"]``) no newer, in major.minor, than the driver's CUDA
    (``env["driver_version"]``): a newer CUPTI does not start (CUPTI_ERROR_NOT_INITIALIZED), and the process falls
    back to torch's profiler (seconds: :func:`pytest_kopt.gates.hardware.cupti_pin`). False where either is
    unknown."""
    try:
        have = tuple(int(x) for x in str((env.get("packages") or {}).get("cupti-python")).split(".")[:2])
        driver = tuple(int(x) for x in str(env.get("driver_version")).split(".")[:2])
    except ValueError:
        return False
    return len(have) == 2 and len(driver) == 2 and have <= driver


@dataclass(frozen=True, slots=True)
class Context:
    """Everything a gate needs: the settings, the ``env.json`` dict, the kernel and reference, the folders, and
    the process's harness pool, block log and session key. ``display`` is the kernel path as the user wrote it
    (for messages). ``kind``: the kernel's kind (:class:`pytest_kopt.kinds.base.Kind`: every difference between
    CUDA, CUTLASS, Triton and Python kernels is its to answer); ``gates``: the session's gate table
    (:class:`pytest_kopt.gates.table.GateTable`); ``ahead``: the process's scheduler of work started ahead
    (:class:`pytest_kopt.scheduler.Scheduler`), which a gate asks rather than starting another gate's work."""

    settings: Settings
    env: dict[str, Any]
    kernel: Path
    ref: Path
    display: str
    cache_dir: Path
    pool: HarnessPool
    blocks: BlockLog
    trust: Trust
    kind: Any
    gates: Any
    ahead: Any
    #: the files the session judges by, pinned at its start (:class:`pytest_kopt.gates.pins.Pins`)
    pins: Pins = Pins()
    #: the session's dims (the primary shape) when this context is one benchmark shape's (:meth:`at`), else None
    primary_dims: dict[str, Any] | None = None
    #: the gates of this kernel whose items this process collected (empty when not known): a gate starts work for
    #: a later one ahead only when that one will run here
    collected: frozenset[str] = frozenset()

    def at(self, dims: dict[str, Any]) -> "Context":
        """This kernel's context at another shape: ``settings.dims`` is ``dims``, the artifacts go to
        ``<outdir>/shapes/<M=..,N=..>/``, and the build stays the session's (``build_dims``)."""
        from dataclasses import replace

        return replace(self, settings=replace(self.settings, dims=dict(dims)),
                       primary_dims=self.primary_dims or self.settings.dims)

    @property
    def build_dims(self) -> dict[str, Any]:
        """The dims the kernel is built at (a Triton build's launch shape): the session's, at every shape."""
        return self.primary_dims if self.primary_dims is not None else self.settings.dims

    @property
    def shapes(self) -> tuple[dict[str, Any], ...]:
        """The test shapes: every correctness seed runs on each (the first is ``settings.dims``)."""
        return self.settings.shapes or (self.settings.dims,)

    @property
    def benchmarks(self) -> tuple[dict[str, Any], ...]:
        """The timed shapes: ref.py's ``benchmarks`` list (each over the session's dims), else the test shapes; a
        GPU MODE ``task.yml``'s benchmark rows as they are (a row without an optional column takes
        ``generate_input``'s default, never a test row's value)."""
        from ..errors import ConfigError
        from .shapes import ref_shapes

        try:
            listed = ref_shapes(self.ref, "benchmarks")
        except ConfigError:
            listed = []  # preflight reports it
        if self.problem_format == "gpumode" and "benchmarks" not in read_python(self.ref).constants:
            return tuple(dict(b) for b in listed) or self.shapes
        return tuple({**self.settings.dims, **b} for b in listed) or self.shapes

    @property
    def outdir(self) -> Path:
        """The kernel's artifact folder (see :meth:`pytest_kopt.settings.Settings.artifact_dir`): bench.json,
        ncu_top.json, the .ncu-rep, sass/, correctness/; a benchmark shape's context (:meth:`at`): its
        ``shapes/<M=..,N=..>/`` subfolder (the shape's label as a file name,
        :func:`~pytest_kopt.artifacts.io.file_name`)."""
        base = self.settings.artifact_dir(self.kernel)
        if self.primary_dims is None:
            return base
        from ..artifacts.io import file_name
        from ..settings import dims_label

        return base / "shapes" / file_name(dims_label(self.settings.dims))

    @property
    def ref_sha(self) -> str | None:
        """The reference's SHA-256 pinned at the session's start (what the judge's process loads, and nothing
        else); None when it is not pinned."""
        return self.pins.sha(self.ref)

    def ref_constant(self, name: str) -> Any:
        """A module-level literal of the reference, None when absent or when the file does not parse (the
        preflight item reports a broken file; collection must not crash on it)."""
        try:
            return read_python(self.ref).constants.get(name)
        except ContractError:
            return None

    @property
    def problem_format(self) -> str:
        """The reference's format (:attr:`pytest_kopt.gates.pycontract.PyContract.problem_format`): ``kopt``,
        ``kernelbench`` or ``gpumode``; ``kopt`` when it does not parse (preflight reports that)."""
        try:
            return read_python(self.ref).problem_format
        except ContractError:
            return "kopt"

    @property
    def regimes(self) -> tuple[str, ...]:
        """Value regimes for drawn inputs: the reference's ``regimes`` list, else the defaults (a KernelBench or
        GPU MODE problem's: its own inputs, then kopt's regimes at their shapes and dtypes)."""
        value = self.ref_constant("regimes")
        if isinstance(value, (list, tuple)) and value and all(r in REGIMES for r in value):
            return tuple(value)
        return DEFAULT_REGIMES if self.problem_format == "kopt" else FORMAT_REGIMES

    @property
    def extra_dims(self) -> list[dict[str, Any]]:
        """Boundary shapes: the reference's ``extra_dims`` literal (a list of dicts of dims, repeats dropped)."""
        value = self.ref_constant("extra_dims")
        if not isinstance(value, (list, tuple)):
            return []
        out: list[dict[str, Any]] = []
        for d in value:
            if isinstance(d, dict) and d not in out:
                out.append(dict(d))
        return out

    @property
    def edge_plan(self) -> Any:
        """The kernel's edge shapes (:func:`pytest_kopt.gates.edges.edge_plan`): derived from the dims, the
        reference's ``constraints`` and what the kernel takes at run time."""
        from .edges import edge_plan

        return edge_plan(self)

    @property
    def dtypes(self) -> list[str]:
        """The dtypes the reference says the kernel handles (its ``dtypes`` literal, a list of torch dtype names,
        the first the one every gate but the extra dtype cases runs); [] when it lists none, or none valid
        (preflight reports that)."""
        value = self.ref_constant("dtypes")
        if not isinstance(value, (list, tuple)) or not all(isinstance(d, str) for d in value):
            return []
        return list(dict.fromkeys(value))

    @property
    def arch(self) -> str:
        """The build arch: ``--kopt-arch``, else the detected GPU's (``sm_90a`` on an H200), else ``sm_90a``."""
        return self.settings.arch or self.env.get("sm_arch") or DEFAULT_ARCH

    @property
    def gpu(self) -> bool:
        """True when a CUDA context could be created on a GPU."""
        return bool(self.env.get("gpu_available"))

    @property
    def work(self) -> Path:
        """Scratch folder for this kernel's harness requests and outputs (one per kernel, so a kernel's files are not
        in a folder another kernel's process is working in)."""
        return self.cache_dir / "work" / hashlib.sha256(str(self.kernel).encode()).hexdigest()[:16]

    def tool(self, name: str) -> str | None:
        """The path of a detected tool (``nvcc``, ``ncu``, ``cuobjdump``), None when it was not found."""
        return (self.env.get("tools", {}).get(name) or {}).get("path")

    def device_for(self, gate: str) -> str:
        """``cuda`` with a GPU; ``cpu`` where the kernel's kind runs ``gate`` without one
        (:attr:`~pytest_kopt.kinds.base.Kind.cpu_gates`: correctness of a Triton or Python candidate, through
        Triton's interpreter); otherwise Blocked by hardware with the reason."""
        if self.gpu:
            return "cuda"
        if gate in self.kind.cpu_gates:
            return "cpu"
        raise Blocked("hardware", f"no GPU: {self.env.get('gpu_error') or 'no CUDA device'}",
                      NO_GPU_TIMING_FIX if "correctness" in self.kind.cpu_gates else NO_GPU_FIX)

    def gpu_lock(self, shared: bool = False) -> GpuLock:
        """The per-GPU lock (:class:`~pytest_kopt.proc.gpulock.GpuLock`, a file keyed by GPU UUID in the system temp
        dir, so separate sessions share it): timing, ncu, the sanitizer and correctness never run beside an
        exclusive hold on one GPU; ``shared`` holds (a loop close's correctness seeds, :attr:`shares_gpu`) run
        beside each other. Taken around one child process at a time, or around one interleaved measurement; never
        nested."""
        uuid = (self.env.get("gpu") or {}).get("uuid", "nogpu")
        return GpuLock(os.path.join(tempfile.gettempdir(), f"pytest-kopt-{uuid}.lock"), shared=shared)

    def device_lock(self, device: str, shared: bool = False) -> Any:
        """:meth:`gpu_lock` for work on the GPU, a no-op context for CPU work (the Triton interpreter)."""
        return self.gpu_lock(shared) if device == "cuda" else contextlib.nullcontext()

    @property
    def shares_gpu(self) -> bool:
        """Whether this session's correctness seeds hold the GPU lock shared: in a loop's close (``--kopt-run``),
        whose branches are one author's kernels judged side by side, so the seeds of several branches run at once
        (a verdict is no time) while timing and ncu still run alone. Elsewhere (a PR gate's baseline beside its
        candidate, a kernel of unknown origin) each seed runs alone, so no other kernel can slow it into a
        TIMEOUT."""
        return self.settings.loop_mode == "run"

    @property
    def checks_in_timing_process(self) -> bool:
        """Whether the kernel's ``check`` requests (its plan, a Triton build, its correctness seeds) go to its
        timing process (``candidate``): on a GPU with a cupti-python that starts (:func:`cupti_starts`), where this
        process runs the kernel's timing item (or does not know). One process per kernel then makes one CUDA
        context, not two: in a close of 32 branches on 8 workers the second processes made 32 more contexts, and
        contexts made at once took 1.4 to 9.9 s each and slowed the timings beside them (H100, 2026-12-07,
        docs/loop.md; with one process per kernel they took 0.12 s median). That process starts CUPTI before its
        first CUDA request, while idle where it can: through cupti-python 0.017 to 0.058 s on a quiet H200, 0.82 s
        median (1.32 s at most) in a close's processes on an H100, where seeds waited 7.4 s for it in all; through
        torch's profiler 3.5 to 4.7 s (H200, docs/timing.md), which a seed would wait for under the GPU lock, so
        where cupti-python is missing or newer than the driver's CUDA the seeds keep a process of their own. A
        failing case's shrinking attempts never run in the process that judges the seeds (:meth:`server`'s
        ``shrink``)."""
        return self.gpu and cupti_starts(self.env) and (not self.collected or "timing" in self.collected)

    def server(self, role: str) -> str | None:
        """Identity of the warm harness process for a request (``<role>:<file>``), so a candidate never runs in the
        reference's process or another candidate's; None with ``--kopt-fresh-process``. Per candidate kernel:
        ``check`` (its plan, a Triton build, its correctness requests) and ``candidate`` (its timing and the
        loop's re-timing), one process where :attr:`checks_in_timing_process`, and ``shrink`` (a failing case's
        shrinking attempts: the timing process, or the check process where the two are one); per reference file:
        ``judge`` (the reference's plan, the judge of every correctness seed and timed output) and ``reference`` (its
        timing, the GPU's peaks). The timing processes warm CUPTI up while idle (seconds:
        :func:`pytest_kopt.child.cupti.warm_profiler`); a check process of its own and the judge's never load the
        profiler."""
        if self.settings.fresh_process:
            return None
        if role not in SERVER_ROLES:
            raise ValueError(f"unknown harness role {role!r}")
        if role == "shrink":  # a failing case's attempts: never where the seeds are judged (gates/shrink.py)
            role = "check" if self.checks_in_timing_process else "candidate"
        elif role == "check" and self.checks_in_timing_process:
            role = "candidate"
        return f"{role}:{self.kernel if role in ('check', 'candidate') else self.ref}"
