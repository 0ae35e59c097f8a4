"""The pytest adapter: options, collection of one item per gate, reporting and SKILL.md's exit codes.

Registered through the ``pytest11`` entry point ``kopt``; the only package that imports pytest. Gate logic lives in
:mod:`pytest_kopt.gates`, the loop in :mod:`pytest_kopt.loop`; nothing here imports torch or touches CUDA.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from ..errors import ConfigError
from ..gates import gpus, hardware
from ..gates.roofline import import_plotting_ahead
from ..loop import state as loop_state
from ..proc.runner import SESSION_PID_ENV
from .early import prestart_harness_early, start_builds_early
from .nodes import KoptFile, KoptItem, pytest_collect_file, pytest_pycollect_makemodule
from .options import SEED_CACHE_KEY, pytest_addoption, pytest_load_initial_conftests, read_settings, usage_error
from .session import ControllerPlugin
from .stash import STATE, SessionState
from .xdist import XdistControllerPlugin, prestart_planned, worker_env, worker_trust

__all__ = ["KoptFile", "KoptItem", "pytest_addoption", "pytest_collect_file", "pytest_configure",
           "pytest_load_initial_conftests", "pytest_pycollect_makemodule", "pytest_report_header",
           "pytest_sessionfinish", "pytest_unconfigure"]


def pytest_configure(config: pytest.Config) -> None:
    """Parse settings once, register markers, aim collection at the kernels, then take this process's role: an
    xdist worker takes what its controller handed it; the controller (or the only process) detects the hardware,
    chooses the session's GPUs, seeds a ``--kopt-init`` run and registers its plugins."""
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU; skipped with the reason when none is visible")
    config.addinivalue_line("markers", "kopt(gate): a pytest-kopt gate item")
    handed: dict[str, Any] = dict(getattr(config, "workerinput", None) or {})
    settings = read_settings(config, handed)
    state = SessionState(settings=settings, kernels=frozenset(settings.kernels) if settings.active else frozenset())
    config.stash[STATE] = state
    if not settings.active:
        return
    if not handed:  # the controller: its workers and every harness process inherit it
        os.environ.setdefault(SESSION_PID_ENV, str(os.getpid()))
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        config.args = [str(k) for k in settings.kernels]
    else:
        for kernel in settings.kernels:
            if not any(Path(a.split("::")[0]).resolve() == kernel for a in config.args):
                config.args.append(str(kernel))
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    if "kopt_env" in handed:  # an xdist worker
        state.env = worker_env(handed)
        state.trust = worker_trust(handed)
        prestart_planned(config, state, handed)
    else:
        prestart_harness_early(config, state)  # torch's imports beside the GPU probe, where one GPU is sure
        tools = start_builds_early(config, state)  # nvcc beside the GPU probe, where the arch is known without it
        state.env = _controller_env(config, settings.gpus, attempts=3 if settings.loop_mode else 1, tools=tools)
        if settings.loop_mode == "init":
            _init_run(state)
        cache = getattr(config, "cache", None)
        if settings.session_seed is not None and cache is not None:
            cache.set(SEED_CACHE_KEY, settings.session_seed)
        config.pluginmanager.register(ControllerPlugin(config, state), "kopt-controller")
        if settings.loop_mode == "run":  # the close's charts are drawn here at the session's end
            import_plotting_ahead()
        if config.pluginmanager.hasplugin("xdist"):
            config.pluginmanager.register(XdistControllerPlugin(config, state), "kopt-xdist-controller")
    if state.env.get("pinned"):
        state.restore_visible = (True, before)


def _controller_env(config: pytest.Config, spec: str | None, attempts: int = 1,
                    tools: dict[str, Any] | None = None) -> dict[str, Any]:
    """Detect the hardware and choose the session's GPUs (``--kopt-gpus``). When the session pins GPUs (several
    used, or the option given), this process is pinned to the first one: the loop's decisions (re-timing, the
    champion's profile) run there. A loop session probes up to ``attempts`` times (SKILL.md step 0: at most 3).
    ``tools``: the tools detected already (:func:`~pytest_kopt.plugin.early.start_builds_early`). Raises
    UsageError for a bad ``--kopt-gpus``."""
    env = hardware.detect(attempts, tools=tools)
    try:
        chosen = gpus.select(env, spec)
    except ConfigError as exc:
        raise usage_error(exc) from None
    if not gpus.should_pin(chosen, spec):
        return env
    os.environ["CUDA_VISIBLE_DEVICES"] = chosen[0]["uuid"]
    return gpus.pinned({**env, "gpus": chosen}, chosen[0])


def _init_run(state: SessionState) -> None:
    """--kopt-init, controller side: create the run folder and state.json before any gate writes into it."""
    s = state.settings
    assert s.run_dir is not None and s.baseline is not None and s.ref is not None
    loop_state.init_state(s.run_dir, s.baseline, s.ref, s.dims, iterations=s.iterations, branches=s.branches,
                          ncu_num=s.ncu_num, noise_pct=s.noise_pct, numerics_mode=s.numerics_mode,
                          seeds=list(s.seeds), env=state.env)


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    """The detected GPU and tools, and the session seed, one line each."""
    state = config.stash.get(STATE, None)
    if state is None or not state.settings.active:
        return None
    s = state.settings
    if s.session_seed is not None:
        seeds = f"kopt seed: {s.session_seed} (replay: --kopt-seed {s.session_seed})"
    else:
        seeds = f"kopt seeds: {','.join(map(str, s.seeds))}"
    return [hardware.header_line(state.env), seeds]


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> Any:
    """After every other plugin's session end (the controller's loop step profiles the champion with the process
    started ahead for it, and may re-time kernels in warm processes): wait for the builds started ahead and for
    matplotlib's import started ahead, and end this process's harness processes (the pool's atexit hook would,
    later)."""
    try:
        return (yield)
    finally:
        state = session.config.stash.get(STATE, None)
        if state is not None:
            from ..gates.roofline import wait_plotting

            state.builds.wait()
            wait_plotting()
            state.pool.shutdown()


def pytest_unconfigure(config: pytest.Config) -> None:
    """End what this process started at configure, where no session end did (a usage error after it, such as
    another plugin's: the builds and harness processes started before the GPU probe), and give
    CUDA_VISIBLE_DEVICES back as it was, when this process pinned itself to a GPU: an in-process pytest run (an
    IDE's, pytester's ``runpytest()``) must leave neither to its caller."""
    state = config.stash.get(STATE, None)
    if state is None:
        return
    state.builds.wait()
    state.pool.shutdown()
    if not state.restore_visible[0]:
        return
    before = state.restore_visible[1]
    if before is None:
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = before
