"""pytest-xdist: what the controller hands each worker (environment, GPU, seed, key, run folder, the kernel it
will run first) and how it schedules (one kernel's items on one worker, in gate order, each kernel on the worker
planned for it), and how a worker takes what it was handed.

Values that cross to a worker are builtins only (execnet cannot carry enums, paths or numpy scalars).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Iterable

import pytest

from ..gates import gpus, hardware
from ..gates.trust import Trust
from .early import selection_keeps, xdist_specs
from .nodes import node_path
from .stash import SessionState


def kernel_plan(kernels: Iterable[Path], workers: int) -> dict[Path, int]:
    """The worker (index ``N`` of xdist's ``gwN``) planned for each kernel: the kernels in sorted order, dealt round
    robin over ``workers`` workers. The controller hands each worker its first kernel (:func:`prestart_planned`) and
    the scheduler (:class:`KernelScopeScheduling`) gives each kernel to its planned worker while that worker is
    free for it. Empty for fewer than one worker."""
    if workers < 1:
        return {}
    return {k: i % workers for i, k in enumerate(sorted(kernels))}


def worker_index(workerid: str) -> int | None:
    """``gw3`` -> 3; None for an id xdist did not make."""
    return int(workerid[2:]) if workerid.startswith("gw") and workerid[2:].isdigit() else None


def _load_scope() -> type:
    from xdist.scheduler import LoadScopeScheduling

    class KernelScopeScheduling(LoadScopeScheduling):  # type: ignore[misc,valid-type]
        """xdist's ``loadscope`` (one scope, here one kernel file, per work unit) where each kernel goes to the
        worker :func:`kernel_plan` planned for it, whose harness processes for its first kernel were started at
        that worker's configure, before it collected (:func:`prestart_planned`). A worker with no planned kernel
        left takes the queue's first, as ``loadscope`` does, so a fast worker still helps a slow one; and the
        surplus workers ``loadscope`` ends at the start (more workers than kernels) are those with none
        planned."""

        def __init__(self, config: pytest.Config, log: Any, plan: Callable[[int], dict[Path, int]]) -> None:
            super().__init__(config, log)
            self.plan = plan(self.numnodes)  # loadscope's count of the workers it waits for

        def _kernel(self, scope: str) -> Path | None:
            try:
                return Path(self.config.rootpath, scope.split("::")[0]).resolve()
            except OSError:
                return None

        def _assign_work_unit(self, node: Any) -> None:
            # the worker's planned kernels in the plan's (sorted) order: its first is the one it was handed
            mine = worker_index(str(node.workerinput.get("workerid", "")))
            planned = sorted((k, sc) for sc in self.workqueue if (k := self._kernel(sc)) is not None
                             and self.plan.get(k) == mine)
            if planned:
                self.workqueue.move_to_end(planned[0][1], last=False)
            super()._assign_work_unit(node)

        def schedule(self) -> None:
            if self.collection is None:  # the initial distribution: the workers with a planned kernel first
                planned = set(self.plan.values())
                self.assigned_work = dict(sorted(
                    self.assigned_work.items(),
                    key=lambda kv: worker_index(str(kv[0].workerinput.get("workerid", ""))) not in planned))
            super().schedule()

    return KernelScopeScheduling


class XdistControllerPlugin:
    """Registered on the xdist controller only (pytest-mypy's ``MypyXdistControllerPlugin`` pattern)."""

    def __init__(self, config: pytest.Config, state: SessionState) -> None:
        self.config = config
        self.state = state
        #: workers handed the session's fork server that are ready (:meth:`pytest_testnodeready`), and how many
        #: were handed it (counted at the first one's readiness)
        self.ready_attached = 0
        self.handed: int | None = None
        #: GPU UUID -> ids of the live xdist workers pinned to it
        self.gpu_workers: dict[str, set[str]] = {}

    def plan(self, workers: int) -> dict[Path, int]:
        """:func:`kernel_plan` over ``workers`` workers of this session's kernels whose plan item surely runs
        (:func:`~pytest_kopt.plugin.early.selection_keeps`: ``-k b.cu`` plans b.cu alone, so the surplus workers
        xdist ends are not the one b.cu was planned for), when the scheduler is kopt's (xdist's ``load``, the
        default of ``-n``); else empty."""
        if not self.state.kernels or self.config.getvalue("dist") != "load":
            return {}
        return kernel_plan([k for k in self.state.kernels if selection_keeps(self.config, self.state, k, "plan")],
                           workers)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        """``-n N`` (xdist's ``load``) becomes ``loadscope`` with a plan (:class:`KernelScopeScheduling`): one
        kernel's items go to one worker, in gate order, while kernels compile in parallel on different workers
        (the per-GPU lock keeps GPU work one child at a time), each kernel to the worker planned for it. Other
        ``--dist`` modes are the user's choice."""
        if config.getvalue("dist") == "load":
            return _load_scope()(config, log, self.plan)
        return None

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodeready(self, node: Any) -> None:
        """A worker is ready (it attached to the session's fork server at its configure, or could not): once every
        worker handed the server is, nothing else may connect to it, and a worker started later (xdist's
        replacement of a crashed one) is handed none: it starts its own."""
        if getattr(node, "workerinput", {}).get("kopt_fork_server"):
            self.ready_attached += 1
            forks = self.state.pool.forks
            if self.handed is None:
                self.handed = local_workers(self.config)
            if self.ready_attached >= self.handed and forks is not None:
                forks.stop_listening()

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """A worker ended (or crashed): its GPU has one worker less for the next one started."""
        wid = getattr(node, "workerinput", {}).get("workerid")
        for ids in self.gpu_workers.values():
            ids.discard(wid)

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        """Give each worker the detected environment, its GPU when the session pins (the one with the fewest live
        workers), the session seed, the run folder and the MAC key of cached results, so workers never probe CUDA
        themselves, collect the same items and trust each other's reference outputs and correctness records; and
        a worker of this Python on this machine, the session's fork server to attach to (``kopt_fork_server``). A
        worker on another host (a gateway that is not ``popen``) detects its own GPUs."""
        env = self.state.env
        node.workerinput["kopt_env"] = env
        spec = getattr(node.gateway, "spec", None)
        forks = self.state.pool.forks
        if forks is not None and forks.shared and spec is not None and plain_local(spec):
            node.workerinput["kopt_fork_server"] = forks.shared  # this Python's: attached at configure
        if not getattr(spec, "popen", True):
            node.workerinput["kopt_detect_here"] = True  # another host: its GPUs are not the controller's
        elif env.get("pinned"):
            gpu = gpus.least_loaded(env["gpus"], {u: len(ids) for u, ids in self.gpu_workers.items()})
            if gpu is not None:
                node.workerinput["kopt_gpu"] = gpu
                self.gpu_workers.setdefault(gpu["uuid"], set()).add(node.workerinput["workerid"])
        node.workerinput["kopt_key"] = self.state.trust.hex()
        node.workerinput["kopt_pins"] = self.state.pins.to_json()
        index = worker_index(str(node.workerinput.get("workerid", "")))
        first = sorted(k for k, w in self.plan(int(node.workerinput.get("workercount") or 0)).items() if w == index)
        if first and env.get("gpu") and not node.workerinput.get("kopt_detect_here"):
            node.workerinput["kopt_first_kernel"] = str(first[0])
            node.workerinput["kopt_planned"] = [str(k) for k in first]
        settings = self.state.settings
        if settings.run_dir is not None:
            node.workerinput["kopt_run_dir"] = str(settings.run_dir)
        if settings.session_seed is not None:
            node.workerinput["kopt_session_seed"] = str(settings.session_seed)
        # the artifacts go where the report says they are: the controller's --kopt-outdir, also on another host
        # (which then needs a filesystem shared with this one; a worker that cannot see it says so)
        node.workerinput["kopt_outdir"] = str(settings.outdir)


def plain_local(spec: Any) -> bool:
    """Whether an xdist gateway spec (an ``execnet.XSpec``) starts a worker as a process of this Python on this
    machine, in this folder, with this environment: ``popen`` without ``python=``, ``chdir=``, ``via=`` or
    ``env:``. Only such a worker can attach to the session's fork server."""
    return bool(getattr(spec, "popen", None)) and not any(getattr(spec, k, None) for k in ("python", "chdir", "via",
                                                                                            "env"))


def local_workers(config: pytest.Config) -> int:
    """How many xdist workers this session starts as :func:`plain_local` processes (``-n N``, ``--tx popen``,
    ``--tx 3*popen``); 0 without xdist."""
    return sum(n for n, spec in xdist_specs(config) or [] if plain_local(spec))


def worker_env(handed: dict[str, Any]) -> dict[str, Any]:
    """A worker's environment: the controller's, pinned to the worker's GPU when the session pins (its
    ``CUDA_VISIBLE_DEVICES`` set, so every child it starts uses that GPU). A worker on another host (an ``ssh``
    or ``socket`` gateway of ``--tx``) detects its own GPUs instead, since the controller's UUIDs name none there."""
    env = handed["kopt_env"]
    if handed.get("kopt_detect_here"):
        env = hardware.detect()
        own = gpus.select(env, None)
        gpu = gpus.worker_gpu(own, handed.get("workerid", ""))
        if gpu is None or len(own) < 2:
            return env
        env = gpus.pinned({**env, "gpus": own}, gpu)
    elif env.get("pinned") and handed.get("kopt_gpu"):
        env = gpus.pinned(env, handed["kopt_gpu"])
    if env.get("pinned"):
        os.environ["CUDA_VISIBLE_DEVICES"] = env["gpu"]["uuid"]
    return env


def prestart_planned(config: pytest.Config, state: SessionState, handed: dict[str, Any]) -> bool:
    """On a worker, at its configure: start the harness processes of the kernel the controller planned it to run
    first (:func:`~pytest_kopt.gates.plan.prestart_harness`), so their torch imports (seconds on a machine's first
    session) overlap the worker's collection and first items rather than start at its first item. Only where the
    selection surely keeps that kernel's plan item (:func:`~pytest_kopt.plugin.early.selection_keeps`) and the
    worker has a GPU; the timing processes only where it surely keeps the timing item too. Returns whether it
    started them. A worker handed another kernel ends them when that kernel's processes start
    (:meth:`~pytest_kopt.proc.pool.HarnessPool.prestart`)."""
    state.planned = tuple(Path(k) for k in handed.get("kopt_planned") or [])
    first = handed.get("kopt_first_kernel")
    if not first or not state.env.get("gpu"):
        return False
    kernel = Path(first)
    if kernel not in state.kernels or not selection_keeps(config, state, kernel, "plan"):
        return False
    # the harness gates the selection surely keeps: no timing processes for a session without timing items
    kept = frozenset(g for g in state.gates.harness if selection_keeps(config, state, kernel, g))
    state.ahead.prestart_harness(state.context(config, kernel, node_path(config, kernel), collected=kept))
    return True


def prestart_next_planned(config: pytest.Config, state: SessionState, current: Path) -> bool:
    """On a worker, at the current kernel's timing item (its first correctness item where it has none,
    :func:`pytest_kopt.plugin.pytest_runtest_setup`): start the harness processes of the next kernel the controller
    planned for it (``kopt_planned``, in the plan's order) that has not begun here, so their torch imports and CUDA
    contexts (4 to 14 s under a close's load: H100, 2026-12-06, a later branch's first seed) overlap the current
    kernel's timing instead of delaying the next kernel's first seed while the GPU waits. Its
    check process too: a later kernel's plan is usually the session's cached one, which starts no process. The
    pool keeps them when another kernel starts (:meth:`~pytest_kopt.proc.pool.HarnessPool.prestart` ``ahead``).
    Only where the selection surely keeps the kernel's plan item; the timing processes only where it keeps the
    timing item. Returns whether it started them."""
    if not state.env.get("gpu"):
        return False
    begun = {Path(p).resolve() for p in state.kicked}
    for k in state.started_ahead - begun - {current}:  # started ahead, then run by another worker: end its processes
        state.pool.end_ahead(str(k))
    nxt = next((k for k in state.planned if k != current and k not in begun and k not in state.started_ahead), None)
    if nxt is None or nxt not in state.kernels or not selection_keeps(config, state, nxt, "plan"):
        return False
    state.started_ahead.add(nxt)
    kept = frozenset(g for g in state.gates.harness if selection_keeps(config, state, nxt, g))
    state.ahead.prestart_harness(state.context(config, nxt, node_path(config, nxt), collected=kept), ahead=True)
    return True


def worker_trust(handed: dict[str, Any]) -> Trust:
    """The controller's MAC key, which the worker adopts (a fresh one if none was handed)."""
    return Trust.from_hex(handed["kopt_key"]) if "kopt_key" in handed else Trust()
