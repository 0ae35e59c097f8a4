"""The one owner of the work a pytest process starts ahead of the item that needs it: nvcc builds (and the SASS dump
and ncu profile that follow a build), a kernel's warm harness processes, ncu profiles waiting for their turn, the
SASS dumps (a Triton build's after its compile item), matplotlib's import.

A :class:`Scheduler` lives in the session's stash (:class:`pytest_kopt.plugin.stash.SessionState`) and reaches the
gates as ``ctx.ahead``: a gate asks it (``wait_build``, ``take_profile``, ``sass_text``) and tells it what happened
(``profile_ahead`` at correctness and timing, ``abandon_profiles`` when a seed fails); it never starts another gate's
work itself. What to start is each gate module's own rule (:func:`pytest_kopt.gates.ncu.sets_ahead`,
:func:`pytest_kopt.gates.ncu.launch_profile`); when to start it, and the state of what runs, is here. Nothing here
is a module global: an in-process pytest run (pytester's ``runpytest``) gets its own scheduler.
"""

from __future__ import annotations

import atexit
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

from .compile_jobs import BuildSlots, build_gib, out_of_memory, plan_jobs
from .errors import Blocked, HardwareError, KoptError
from .gates import ncu as ncu_gate
from .gates import sass as sass_gate
from .gates.build import BuildResult, ensure_built
from .gates.context import Context
from .gates.inputs import import_hypothesis
from .gates.measure import interleaves_reference
from .proc.pool import HarnessPool

#: The most branch profiles a loop's close keeps waiting at once (each holds a CUDA context on the GPU, and its
#: start imports torch under ncu beside the workers' items; the cap is a judgement, not a measured optimum).
PROFILES_AHEAD = 4

#: Threads for the SASS dumps started at a compile item (each runs one cuobjdump: a process, mostly waiting).
DUMP_THREADS = 4

#: ``cuobjdump --dump-sass`` of one artifact is identified by (tool, real path, size, mtime in ns): an artifact
#: rewritten since has another key and is dumped again.
DumpKey = tuple[str, str, int, int]


class Scheduler:
    """Work started ahead in one pytest process, and its state.

    Builds: :meth:`start_builds` starts nvcc for ``.cu`` kernels in threads while the hardware, preflight and plan
    items run, as many at once as ``--kopt-compile-jobs`` and the memory budget allow (:mod:`pytest_kopt.compile_jobs`;
    a build killed for want of memory is retried once, alone); each compile item waits for its own (:meth:`wait_build`), never racing
    it to the build folder's lock; under xdist a build another worker started is waited for through the
    content-addressed cache's lock, never run twice. A build may be followed, in its thread, by the kernel's ncu
    profile (both sets: no seed has run) and its SASS dump.

    Profiles: one ncu process per (kernel, set) waits for its go (:meth:`profile_ahead`, :meth:`start_profile`); the
    ncu item takes its set's (:meth:`take_profile`) and every other of the kernel's is ended; a kernel whose
    correctness failed gets none again (:meth:`abandon_profiles`). In a loop's close the likely champions' profiles
    are started as their records arrive (:meth:`on_branch_record`)."""

    def __init__(self, pool: HarnessPool) -> None:
        self.pool = pool
        self._threads: ThreadPoolExecutor | None = None
        self._lock = threading.RLock()
        #: (kernel, arch) of every build started, so none is started twice
        self._begun: set[tuple[Path, str]] = set()
        #: kernel -> the future of its build started ahead (its SASS dump and profile follow it in that thread)
        self._builds: dict[Path, Future[None]] = {}
        #: artifact path -> seconds nvcc took, for each build this process ran ahead: its compile item reports it as
        #: built, not as a cache hit
        self._built_here: dict[str, float] = {}
        self._sassed: set[Path] = set()
        self._profiled: set[Path] = set()
        self._dumps: dict[DumpKey, str] = {}
        self._pending: dict[DumpKey, threading.Event] = {}
        #: the dumps started ahead of a compile item (:meth:`dump_sass_ahead`), which a sass item may take back
        #: while they wait for a thread
        self._queued: dict[DumpKey, Future[None]] = {}
        self._dump_threads: ThreadPoolExecutor | None = None
        #: (kernel path, ncu set) -> the profile waiting for its ncu item
        self._profiles: dict[tuple[str, str], ncu_gate.ProfileAhead] = {}
        #: kernels no profile is started ahead for any more (their ncu item took or ended them, or a seed failed)
        self._closed: set[str] = set()
        self._plotting: threading.Thread | None = None
        self._branches = BranchProfiles(self)
        self._atexit = False
        #: the jobs and memory the builds share, made at the first build from the session's --kopt-compile-jobs
        self._slots: BuildSlots | None = None

    # builds -----------------------------------------------------------------------------------------------------

    def start_builds(self, ctxs: list[Context], sass: frozenset[Path] = frozenset(),
                     profile: frozenset[Path] = frozenset()) -> int:
        """Start the builds of ``ctxs`` (kernels of a kind built in this process: nvcc's; others are skipped) not
        started yet for their arch, each followed by its ncu item's profile when its kernel is in ``profile`` and its
        SASS dump when it is in ``sass`` (the kernels this process runs those items of, as far as it knows: under
        xdist a worker learns its kernels one at a time, and a later call adds them). Returns how many builds were
        started."""
        todo = [c for c in ctxs if c.kind.builds_ahead and c.tool("nvcc")]
        started = 0
        for c in todo:
            with self._lock:
                dump = c.kernel in sass and c.kernel not in self._sassed
                prof = c.kernel in profile and c.kernel not in self._profiled
                self._sassed.update([c.kernel] if dump else [])
                self._profiled.update([c.kernel] if prof else [])
                if (c.kernel, c.arch) in self._begun:
                    if dump or prof:  # after the build started before: its failure is remembered then, not rebuilt
                        self._pool().submit(_after, self._builds.get(c.kernel), self._build_quietly, c, dump, prof)
                    continue
                self._begun.add((c.kernel, c.arch))
                self._builds[c.kernel] = self._pool().submit(self._build_quietly, c, dump, prof)
            started += 1
        return started

    def _pool(self) -> ThreadPoolExecutor:
        if self._threads is None:  # threads start as builds are submitted, up to one per CPU
            self._threads = ThreadPoolExecutor(max_workers=os.cpu_count() or 1, thread_name_prefix="kopt-build")
        return self._threads

    def slots(self, ctx: Context) -> BuildSlots:
        """The builds' shared jobs and memory (:class:`~pytest_kopt.compile_jobs.BuildSlots`), planned once from
        ``ctx``'s ``--kopt-compile-jobs``."""
        with self._lock:
            if self._slots is None:  # a context without settings (a test's stand-in) gets SKILL.md's default
                spec = getattr(getattr(ctx, "settings", None), "compile_jobs", "auto")
                self._slots = BuildSlots(plan_jobs(spec))
            return self._slots

    def build_within_budget(self, ctx: Context) -> BuildResult:
        """:func:`~pytest_kopt.gates.build.ensure_built` holding a job and the build's memory estimate; a build the
        machine killed for want of memory (:func:`~pytest_kopt.compile_jobs.out_of_memory`) is tried once more with
        no other build running, its remembered failure forgotten first. Raises what the build raises."""
        slots = self.slots(ctx)
        try:
            with slots.take(build_gib(bool(getattr(ctx.kind, "cutlass", False)))):
                return ensure_built(ctx)
        except KoptError as exc:
            if not out_of_memory(exc.message, exc.details):
                raise
        (ctx.outdir / "compile_error.json").unlink(missing_ok=True)  # memory, not the sources: never remembered
        with slots.alone():
            return ensure_built(ctx)

    def _build_quietly(self, ctx: Context, sass: bool = False, profile: bool = False) -> None:
        """:meth:`build_within_budget` ahead of the compile item: a failure is remembered in ``compile_error.json``
        as usual, and the compile item reports it when it runs."""
        try:
            res = self.build_within_budget(ctx)
        except (KoptError, Blocked, OSError):
            return
        if not res.cache_hit:
            self._built_here[res.artifact] = res.seconds
        if profile:
            try:
                self.profile_ahead(ctx, early=True)
            except (KoptError, Blocked, OSError):
                pass  # the correctness or ncu item starts it
        if sass:
            self.prefetch_sass(ctx.tool("cuobjdump"), res.artifact)

    def wait_build(self, ctx: Context) -> None:
        """Wait for ``ctx``'s kernel's build started ahead, if any (importing hypothesis meanwhile, which the session
        needs anyway and this thread would only wait). A kernel's build failure is remembered and the compile item
        meets it again; a bug of the build thread raises here."""
        future = self._builds.get(ctx.kernel)
        if future is None:
            return
        if not future.done():
            import_hypothesis()
        future.result()

    def built_ahead(self, res: BuildResult) -> float | None:
        """nvcc's seconds when this process built ``res`` ahead of its compile item, else None."""
        return self._built_here.get(res.artifact) if res.cache_hit else None

    # harness processes ------------------------------------------------------------------------------------------

    def prestart_harness(self, ctx: Context, ahead: bool = False) -> None:
        """Start the kernel's warm processes without waiting for them, so their torch imports (and the timing
        processes' CUPTI start) overlap each other and the gates before their first request; a no-op for those
        already running: the judge's; on a GPU the candidate's correctness process where its kind has no plan
        request to start it (:meth:`~pytest_kopt.kinds.base.Kind.prestart_check`); and on a GPU, when this process
        collected the kernel's timing item (or it is not known), the candidate's and the reference's timing
        processes. Called at a kernel's first item in a process and again by the plan gate; with ``ahead``, for the
        kernel this process runs next (:func:`pytest_kopt.plugin.xdist.prestart_next_planned`), whose check
        process starts whatever its kind (its plan, usually the session's cached one, may start none). The
        reference's timing process only where every timing times the reference in its rounds
        (:func:`~pytest_kopt.gates.measure.interleaves_reference`): elsewhere (a loop's close) one timing of it
        serves the session, and the process is started for it then (:func:`~pytest_kopt.gates.measure.
        reference_timing`)."""
        ctx.pool.prestart(ctx.server("judge"), {}, ctx.work)
        if not ctx.gpu:
            return
        env = ctx.kind.candidate_env(ctx, "cuda")
        if ahead or ctx.kind.prestart_check(ctx):
            ctx.pool.prestart(ctx.server("check"), env, ctx.work, ahead=ahead)
        if not ctx.collected or "timing" in ctx.collected:
            ctx.pool.prestart(ctx.server("candidate"), env, ctx.work, ahead=ahead)
            if interleaves_reference(ctx):
                # in a close of 32 branches, each of 8 workers made a CUDA context for a reference process at the
                # start, one of which timed the reference; some 40 contexts made at once took 5 to 10 s each and
                # held the first timing back to 22 s (H100, 2026-12-07, docs/loop.md)
                ctx.pool.prestart(ctx.server("reference"), {}, ctx.work)

    # SASS dumps -------------------------------------------------------------------------------------------------

    def prefetch_sass(self, cuobjdump: str | None, artifact: str) -> None:
        """Dump ``artifact``'s SASS now (a build thread, right after nvcc) for :meth:`sass_text` to find; a failure
        is left for the sass item to meet and report."""
        key = _dump_key(cuobjdump, artifact) if cuobjdump else None
        if key is not None and self._claim_dump(key):
            self._dump(key, artifact)

    def dump_sass_ahead(self, ctx: Context, res: BuildResult) -> int:
        """Start the SASS dumps of ``ctx``'s build ``res`` (one cuobjdump per artifact of the kind's
        :meth:`~pytest_kopt.kinds.base.Kind.sass_artifacts`, :data:`DUMP_THREADS` side by side) for its sass item
        to find, when that item runs in this process (or which items do is not known); a sass item that comes while
        its dump still waits for a thread takes it back and dumps itself. Called by the compile item: it covers the
        kinds no build thread dumps (a Triton build's cubins, made in the kernel's harness process, whose sass item
        otherwise dumps them after the ncu and roofline items); a dump made or under way is not started again.
        Returns how many were started."""
        cuobjdump = ctx.tool("cuobjdump")
        if not cuobjdump or (ctx.collected and "sass" not in ctx.collected):
            return 0
        started = 0
        for art in ctx.kind.sass_artifacts(res):
            key = _dump_key(cuobjdump, art)
            if key is None or not self._claim_dump(key):
                continue
            try:
                with self._lock:  # recorded before the dump can end and forget it (its release takes this lock)
                    self._queued[key] = self._dump_pool().submit(self._dump, key, art)
            except RuntimeError:  # the session is ending: the sass item, if any, dumps it itself
                self._release_dump(key)
                continue
            started += 1
        return started

    def _dump_pool(self) -> ThreadPoolExecutor:
        """The dumps' own threads (:data:`DUMP_THREADS`), so a dump never waits behind nvcc builds for a thread."""
        with self._lock:
            if self._dump_threads is None:
                self._dump_threads = ThreadPoolExecutor(max_workers=DUMP_THREADS, thread_name_prefix="kopt-sass")
            return self._dump_threads

    def _release_dump(self, key: DumpKey) -> None:
        """End ``key``'s claim without a dump (whoever waits reads none and dumps it itself)."""
        with self._lock:
            done = self._pending.pop(key, None)
            self._queued.pop(key, None)
        if done is not None:
            done.set()

    def _claim_dump(self, key: DumpKey) -> bool:
        """Mark ``key``'s dump as under way; False when it is made or under way already."""
        with self._lock:
            if key in self._dumps or key in self._pending:
                return False
            self._pending[key] = threading.Event()
            return True

    def _dump(self, key: DumpKey, artifact: str) -> None:
        """Run the dump :meth:`_claim_dump` claimed, then wake whoever waits for it in :meth:`sass_text`."""
        try:
            self._dumps[key] = sass_gate.run_cuobjdump(key[0], artifact, 120.0)
        except HardwareError:
            pass
        finally:
            self._release_dump(key)

    def sass_text(self, cuobjdump: str, artifact: str, timeout_s: float) -> str | None:
        """The SASS dump of ``artifact`` made ahead (waiting up to ``timeout_s`` for one under way), None when none
        was made."""
        key = _dump_key(cuobjdump, artifact)
        if key is None:
            return None
        with self._lock:
            queued = self._queued.get(key)
        if queued is not None and queued.cancel():  # queued behind other dumps, not begun: the item dumps it now
            self._release_dump(key)
            return None
        pending = self._pending.get(key)
        if pending is not None:
            pending.wait(timeout_s)
        return self._dumps.get(key)

    # ncu profiles -----------------------------------------------------------------------------------------------

    def profile_ahead(self, ctx: Context, *, early: bool = False) -> tuple[str, ...]:
        """Start (or keep) the profiles of ``ctx``'s kernel that :func:`~pytest_kopt.gates.ncu.sets_ahead` asks
        for, ending the kernel's others when it says so. Returns the sets running; () when none is (see there),
        or when the kernel's ncu item already ran or a seed failed."""
        with self._lock:
            if str(ctx.kernel) in self._closed:
                return ()
            plan = ncu_gate.sets_ahead(ctx, early)
            if plan is None:
                return ()
            sets, end_others, dims = plan
            if end_others:
                self.end_profiles(ctx.kernel, keep=sets)
            return tuple(s for s in sets if self.start_profile(ctx, s, dims))

    def start_profile(self, ctx: Context, set_name: str, dims: dict[str, Any] | None) -> bool:
        """Start ``ctx``'s kernel's profile with ``set_name`` at ``dims`` ahead of its gate, unless one runs. False
        when it cannot start (no build, no ncu); True when it runs."""
        with self._lock:
            key = (str(ctx.kernel), set_name)
            if key in self._profiles:
                return True
            started = ncu_gate.launch_profile(ctx, set_name, dims)
            if started is None:
                return False
            if not self._atexit:  # a process that exits without the session's end leaves no ncu running
                atexit.register(self._end_all_profiles)
                self._atexit = True
            self._profiles[key] = started
            return True

    def end_profiles(self, kernel: Path, keep: tuple[str, ...] = ()) -> None:
        """End the profiles started ahead for ``kernel`` but those of the ncu sets in ``keep``."""
        with self._lock:
            for key in [k for k in self._profiles if k[0] == str(kernel) and k[1] not in keep]:
                self._profiles.pop(key).kill()

    def abandon_profiles(self, ctx: Context) -> None:
        """``ctx``'s kernel will not be profiled in this session (a correctness case failed): end its profiles
        started ahead and start none again."""
        with self._lock:
            self._closed.add(str(ctx.kernel))
            self.end_profiles(ctx.kernel)

    def take_profile(self, ctx: Context, set_name: str) -> tuple[ncu_gate.ProfileAhead | None, str]:
        """For the ncu item: the profile started ahead for its kernel with ``set_name`` if it is still waiting, and
        what became of it (``used``; ``none started``; ``started with the <set> set``; ``ended before its turn``,
        with its output's tail); the kernel's others are ended, and none is started again."""
        with self._lock:
            self._closed.add(str(ctx.kernel))
            held, note = None, "none started"
            for key in [k for k in self._profiles if k[0] == str(ctx.kernel)]:
                ahead = self._profiles.pop(key)
                if key[1] == set_name and ahead.proc.alive():
                    held, note = ahead, "used"
                elif key[1] == set_name:
                    code = ahead.proc.proc.returncode
                    note = f"ended before its turn (exit {code}): {ahead.kill()[-300:]}"
                else:
                    ahead.kill()
                    note = f"started with the {key[1]} set" if held is None else note
            return held, note

    @property
    def profiling(self) -> set[Path]:
        """The kernels whose profile started ahead is waiting."""
        return {Path(k[0]) for k in self._profiles}

    def on_branch_record(self, ctx: Context, rec: Any, branch_gates: tuple[str, ...], branches: int = 1) -> None:
        """In a loop's close of ``branches`` branches: one more record of a branch (see :class:`BranchProfiles`)."""
        self._branches.record(ctx, rec, branch_gates, branches)

    @property
    def ahead_log(self) -> list[str]:
        """What was done for the branches' profiles in a loop's close (shown with ``-v``)."""
        return self._branches.log

    # charts -----------------------------------------------------------------------------------------------------

    def import_plotting_ahead(self) -> None:
        """Import matplotlib (Agg) in a daemon thread, once per process (0.4 to 0.8 s on the 2-core CPU machine,
        2026-12-03), so the charts drawn later do not wait for it. Whatever draws, and the session's end, calls
        :meth:`wait_plotting` first: no other thread imports matplotlib while this one does, and the interpreter
        never finalizes during the import (a daemon thread inside an extension module's import then can crash it)."""
        from .gates.roofline import import_plotting

        with self._lock:
            if self._plotting is None:
                self._plotting = threading.Thread(target=import_plotting, name="kopt-import-plotting", daemon=True)
                self._plotting.start()

    def wait_plotting(self, timeout_s: float = 120.0) -> None:
        """Wait (at most ``timeout_s`` seconds) for the import :meth:`import_plotting_ahead` started, if any."""
        if self._plotting is not None:
            self._plotting.join(timeout_s)

    # the end ------------------------------------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Wait for the builds still running (nvcc must not outlive the session) and matplotlib's import, and end
        the profiles no ncu item took."""
        if self._threads is not None:
            self._threads.shutdown(wait=True)
        if self._dump_threads is not None:  # a dump not begun is for a sass item that will not run now
            self._dump_threads.shutdown(wait=True, cancel_futures=True)
        self.wait_plotting()
        self._end_all_profiles()

    def _end_all_profiles(self) -> None:
        with self._lock:
            while self._profiles:
                self._profiles.popitem()[1].kill()


class BranchProfiles:
    """In a loop's close, the branches' profiles started ahead, so ncu's start (Python, torch, the CUDA context under
    ncu: about 6.5 s on the H200) overlaps the rest of the close and the champion's profile finds it waiting. In a
    close of at most :data:`PROFILES_AHEAD` branches each branch's starts at its first passed correctness seed; in a
    larger one only the fastest branch timed so far gets one, at its timing (a close of 32 branches started 20 at
    their seeds and used one, each ncu's start about 6 CPU-s and a CUDA context made beside the measurements, H100,
    2026-12-06). At most :data:`PROFILES_AHEAD` wait at once (a branch over the cap is tried again at its next passed
    item). A branch whose compile, correctness or timing item fails, whose
    correctness or timing skips, or whose timing is slower than the fastest branch's so far, has its profile ended
    (and none started). A kernel of several benchmark shapes gets none (its profile is of the first shape, the
    decision of all); a champion the decision picks otherwise is profiled from the start."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        #: the fastest branch timed so far (median ms, kernel path)
        self.leader: tuple[float, Path] | None = None
        self.tried: set[Path] = set()
        self.ruled_out: set[Path] = set()
        self.log: list[str] = []

    def record(self, ctx: Context, rec: Any, branch_gates: tuple[str, ...], branches: int = 1) -> None:
        """One more record (:class:`~pytest_kopt.records.GateRecord`) of the branch ``ctx`` is of; the loop's close
        calls this only for branches, with the run's pinned ncu set in ``ctx.settings.ncu_set``. ``branches``: how
        many branches the close judges."""
        kernel = ctx.kernel
        if not ctx.settings.ncu_set or not ctx.gpu or kernel in self.ruled_out or len(ctx.benchmarks) > 1:
            return
        median = rec.figures.get("median_ms")
        slower = None
        if (rec.outcome == "failed" and rec.gate in branch_gates) or \
                (rec.outcome == "skipped" and rec.gate in ("correctness", "timing")):
            slower = f"{rec.gate} {rec.outcome}"
        elif rec.outcome != "passed":
            return
        elif rec.gate == "timing" and not rec.case and isinstance(median, (int, float)):
            if self.leader is not None and self.leader[0] <= median:
                slower = f"{median:.4f} ms, slower than {self.leader[1].parent.name}"
            else:
                if self.leader is not None:
                    self._rule_out(self.leader[1], f"slower than {kernel.parent.name} ({median:.4f} ms)")
                self.leader = (float(median), kernel)
        if slower is not None:
            self._rule_out(kernel, slower)
            return
        at_seed = rec.gate == "correctness" and branches <= PROFILES_AHEAD
        if kernel in self.tried or not (at_seed or self.leader and self.leader[1] == kernel):
            return
        if len(self.scheduler.profiling) >= PROFILES_AHEAD:  # tried again at its next passed item
            return
        self.tried.add(kernel)
        try:
            started = self.scheduler.start_profile(ctx, ctx.settings.ncu_set, None)
        except Exception as exc:  # noqa: BLE001  (a start ahead never fails a session: the champion's profile
            started, why = False, f"{type(exc).__name__}: {exc}"  # starts its own, and reports what fails)
        else:
            why = "" if started else "no build or no ncu"
        self.log.append(f"{kernel.parent.name} ({rec.gate} passed): " + (
            "profile started ahead" if started else f"not started ({why})"))

    def _rule_out(self, kernel: Path, why: str) -> None:
        self.ruled_out.add(kernel)
        if kernel in self.scheduler.profiling:
            self.scheduler.end_profiles(kernel)
            self.log.append(f"{kernel.parent.name}: profile ended ({why})")


def _after(first: Future[None] | None, then: Callable[..., None], *args: Any) -> None:
    if first is not None:
        first.exception()  # waits; a failure of ``first`` is reported where it is awaited
    then(*args)


def _dump_key(cuobjdump: str | None, art: str) -> DumpKey | None:
    if not cuobjdump:
        return None
    try:
        st = os.stat(art)
    except OSError:
        return None
    return cuobjdump, os.path.realpath(art), st.st_size, st.st_mtime_ns
