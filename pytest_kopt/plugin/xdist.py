"""pytest-xdist: what the controller hands each worker (environment, GPU, seed, key, run folder) and how it
schedules (one kernel's items on one worker, in gate order), and how a worker takes what it was handed.

Values that cross to a worker are builtins only (execnet cannot carry enums, paths or numpy scalars).
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from ..gates import gpus, hardware
from ..gates.trust import Trust
from .stash import SessionState


class XdistControllerPlugin:
    """Registered on the xdist controller only (pytest-mypy's ``MypyXdistControllerPlugin`` pattern)."""

    def __init__(self, config: pytest.Config, state: SessionState) -> None:
        self.config = config
        self.state = state
        #: GPU UUID -> ids of the live xdist workers pinned to it
        self.gpu_workers: dict[str, set[str]] = {}

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        """``-n N`` (xdist's ``load``) becomes ``loadscope``: one kernel's items go to one worker, in gate order,
        while kernels compile in parallel on different workers (the per-GPU lock keeps GPU work one child at a
        time). Other ``--dist`` modes are the user's choice."""
        if config.getvalue("dist") == "load":
            from xdist.scheduler import LoadScopeScheduling

            return LoadScopeScheduling(config, log)
        return None

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
        themselves, collect the same items and trust each other's reference outputs and correctness records. A
        worker on another host (a gateway that is not ``popen``) detects its own GPUs."""
        env = self.state.env
        node.workerinput["kopt_env"] = env
        if not getattr(getattr(node.gateway, "spec", None), "popen", True):
            node.workerinput["kopt_detect_here"] = True  # another host: its GPUs are not the controller's
        elif env.get("pinned"):
            gpu = gpus.least_loaded(env["gpus"], {u: len(ids) for u, ids in self.gpu_workers.items()})
            if gpu is not None:
                node.workerinput["kopt_gpu"] = gpu
                self.gpu_workers.setdefault(gpu["uuid"], set()).add(node.workerinput["workerid"])
        node.workerinput["kopt_key"] = self.state.trust.hex()
        settings = self.state.settings
        if settings.run_dir is not None:
            node.workerinput["kopt_run_dir"] = str(settings.run_dir)
        if settings.session_seed is not None:
            node.workerinput["kopt_session_seed"] = str(settings.session_seed)
        # the artifacts go where the report says they are: the controller's --kopt-outdir, also on another host
        # (which then needs a filesystem shared with this one; a worker that cannot see it says so)
        node.workerinput["kopt_outdir"] = str(settings.outdir)


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


def worker_trust(handed: dict[str, Any]) -> Trust:
    """The controller's MAC key, which the worker adopts (a fresh one if none was handed)."""
    return Trust.from_hex(handed["kopt_key"]) if "kopt_key" in handed else Trust()
