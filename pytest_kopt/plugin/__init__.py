"""The pytest adapter: options, kopt's own hooks, collection of one item per gate, and one plugin per concern.

Registered through the ``pytest11`` entry point ``kopt``; the only package that imports pytest. Gate logic lives in
:mod:`pytest_kopt.gates`, kernel kinds in :mod:`pytest_kopt.kinds`, the loop in :mod:`pytest_kopt.loop`; nothing
here imports torch or touches CUDA. ``pytest_configure`` builds the session's kinds and gate table through kopt's
hooks (:mod:`~pytest_kopt.plugin.hookspec`), takes this process's role and registers the concerns' plugins that the
options turn on: report and terminal (always, on the controller), the loop's step, the PR gate, saved baselines, the
xdist controller (pytest's ``LFPlugin``/``StepwisePlugin``/``LogXML`` pattern).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from ..errors import ConfigError
from ..gates import gpus, hardware
from ..gates.builtin import builtin_gates
from ..gates.pins import Pins
from ..gates.table import Gate, GateTable
from ..kinds.base import Kind, KindSet
from ..kinds.builtin import builtin_kinds
from ..proc.runner import SESSION_PID_ENV
from . import compare, hookspec, loop, options, report, summary_md, tidy
from .compare import PrGatePlugin, SavedBaselinesPlugin
from .early import prestart_harness_early, runs_no_items, start_builds_early
from .ledger import Ledger, SessionOutcome
from .loop import LoopPlugin, init_run
from .nodes import GPU_MARKER, KoptFile, KoptItem, node_path, pytest_collect_file, pytest_pycollect_makemodule
from .options import SEED_CACHE_KEY, read_settings, usage_error
from .progress import ProgressPlugin, terminal_out
from .report import ReportPlugin
from .stash import STATE, SessionState, cache_dir
from .summary_md import SummaryMdPlugin
from .terminal import TerminalPlugin
from .xdist import (XdistControllerPlugin, local_workers, prestart_next_planned, prestart_planned, worker_env,
                    worker_trust)

__all__ = ["KoptFile", "KoptItem", "pytest_addhooks", "pytest_addoption", "pytest_collect_file",
           "pytest_collection_modifyitems", "pytest_configure", "pytest_kopt_gates", "pytest_kopt_kinds",
           "pytest_load_initial_conftests", "pytest_pycollect_makemodule", "pytest_report_header",
           "pytest_sessionfinish", "pytest_unconfigure"]

#: Each concern's options, declared beside its plugin, in the order ``pytest --help`` lists them.
_CONCERNS = (options, report, compare, loop, summary_md)


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    """kopt's own hooks: ``pytest_kopt_gates`` and ``pytest_kopt_kinds``."""
    pluginmanager.add_hookspecs(hookspec)


def pytest_addoption(parser: pytest.Parser) -> None:
    """The ``kopt`` option group: every concern's ``--kopt-*`` options and flags, each with its ini twin."""
    for module in _CONCERNS:
        options.add_options(parser, module.OPTIONS, getattr(module, "FLAGS", ()))


def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser, args: list[str]) -> None:
    """A ``--kopt-*`` flag no concern defines stops the session with the closest real one; in a kopt session
    pytest-benchmark's own plugin is off (:func:`~pytest_kopt.plugin.tidy.benchmark_plugin_off`)."""
    flags = [f"--kopt-{n[0]}" for m in _CONCERNS for n in (*m.OPTIONS, *getattr(m, "FLAGS", ()))]
    options.check_known(args, flags, early_config.invocation_params.dir)
    tidy.benchmark_plugin_off(early_config, args)


@pytest.hookimpl(trylast=True)
def pytest_kopt_gates(config: pytest.Config) -> list[Gate]:
    """kopt's own gates (:func:`pytest_kopt.gates.builtin.builtin_gates`)."""
    return builtin_gates()


@pytest.hookimpl(trylast=True)
def pytest_kopt_kinds(config: pytest.Config) -> list[Kind]:
    """kopt's own kinds, asked after every plugin's (:func:`pytest_kopt.kinds.builtin.builtin_kinds`)."""
    return builtin_kinds()


def session_registries(config: pytest.Config) -> tuple[KindSet, GateTable]:
    """The session's kinds and gate table, from every plugin's answer to kopt's hooks. Raises UsageError for two
    kinds or gates of one name, or a gate placed before its prerequisites."""
    try:
        kinds = KindSet([k for answer in config.hook.pytest_kopt_kinds(config=config) for k in answer or ()])
        mine = builtin_gates()
        added = [g for answer in config.hook.pytest_kopt_gates(config=config) for g in answer or () if g not in mine]
        gates = GateTable.build(mine, added)
    except ConfigError as exc:
        raise usage_error(exc, config) from None
    return kinds, gates


def pytest_configure(config: pytest.Config) -> None:
    """Parse settings once, register markers, build the session's kinds and gates, aim collection at the kernels,
    then take this process's role: an xdist worker takes what its controller handed it; the controller (or the
    only process) detects the hardware, chooses the session's GPUs, seeds a ``--kopt-init`` run and registers the
    concerns' plugins."""
    config.addinivalue_line("markers", f"{GPU_MARKER}: a pytest-kopt gate item that runs on the GPU (kopt skips it "
                                       "with the reason when none is visible; select with -m 'not kopt_gpu')")
    config.addinivalue_line("markers", "kopt(gate): a pytest-kopt gate item")
    handed: dict[str, Any] = dict(getattr(config, "workerinput", None) or {})
    kinds, gates = session_registries(config)
    settings = read_settings(config, handed, tuple(sorted(kinds.suffixes)))
    state = SessionState(settings=settings, kinds=kinds, gates=gates,
                         kernels=frozenset(settings.kernels) if settings.active else frozenset())
    config.stash[STATE] = state
    if not settings.active:
        return
    if not handed:  # the controller: its workers and every harness process inherit it
        os.environ.setdefault(SESSION_PID_ENV, str(os.getpid()))
    state.restore_hypothesis = tidy.hypothesis_home(settings.outdir)  # before any harness process starts
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        config.args = [str(k) for k in settings.kernels]
    else:
        for kernel in settings.kernels:
            if not any(Path(a.split("::")[0]).resolve() == kernel for a in config.args):
                config.args.append(str(kernel))
    for kernel in settings.kernels:
        try:
            state.kind_of(kernel)
        except ConfigError as exc:
            raise usage_error(exc, config) from None
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    if "kopt_pins" in handed:  # the files as they were when the controller started, before any kernel's code ran
        state.pins = Pins.from_json(handed["kopt_pins"])
    else:
        state.take_pins()
    if "kopt_env" in handed:  # an xdist worker
        state.env = worker_env(handed)
        state.trust = worker_trust(handed)
        state.pool.attach_fork_server(handed.get("kopt_fork_server"))  # the controller's: torch imported once
        prestart_planned(config, state, handed)
    else:
        # one fork server for the session, its torch import beside the probe and the workers' start
        if not runs_no_items(config):
            state.pool.share_fork_server(cache_dir(config) / "work", local_workers(config))
        prestart_harness_early(config, state)  # torch's imports beside the GPU probe, where one GPU is sure
        tools = start_builds_early(config, state)  # nvcc beside the GPU probe, where the arch is known without it
        state.env = _controller_env(config, settings.gpus, attempts=3 if settings.loop_mode else 1, tools=tools)
        if settings.loop_mode == "init":
            init_run(state)
        cache = getattr(config, "cache", None)
        if settings.session_seed is not None and cache is not None:
            cache.set(SEED_CACHE_KEY, settings.session_seed)
        _register_concerns(config, state)
    if state.env.get("pinned"):
        state.restore_visible = (True, before)


def _register_concerns(config: pytest.Config, state: SessionState) -> None:
    """The controller's plugins, each only where its option is on: the loop's step (``--kopt-init``/``--kopt-run``),
    the PR gate (``--kopt-fail-slower`` with candidates), saved baselines (``--kopt-save``/``--kopt-compare``), the
    CI summary (``--kopt-summary-md``, or GitHub Actions), the xdist controller (xdist installed); report and
    terminal always, and the progress note (not under ``-q``). The report plugin runs the concerns' session-end
    steps in this order: the loop's, then the comparisons, then the CI summary (which reads what they added)."""
    s = state.settings
    concerns: list[Any] = []
    if s.loop_mode is not None:
        concerns.append(LoopPlugin(config, state))
        if s.loop_mode == "run":  # the close's charts are drawn here at the session's end
            state.ahead.import_plotting_ahead()
    if s.fail_slower_pct is not None and s.candidates and s.baseline is not None:
        concerns.append(PrGatePlugin(state))
    if s.save or s.compare:
        try:
            concerns.append(SavedBaselinesPlugin(state))
        except ConfigError as exc:
            raise usage_error(exc, config) from None
    md = summary_md.summary_path(config)
    if md is not None or summary_md.in_actions():  # last: it reads what the loop and the comparisons added
        concerns.append(SummaryMdPlugin(config, state.gates, state.env, md))
    outcome = SessionOutcome(Ledger(state.gates, tuple(str(k) for k in s.kernels)))
    for c in concerns:
        config.pluginmanager.register(c, f"kopt-{type(c).__name__}")
    config.pluginmanager.register(ReportPlugin(config, state, outcome, concerns), "kopt-report")
    config.pluginmanager.register(TerminalPlugin(config, outcome, state.gates, state.ahead.ahead_log),
                                  "kopt-terminal")
    if config.get_verbosity() >= 0:
        kernels = frozenset(node_path(config, k) for k in s.kernels)
        config.pluginmanager.register(ProgressPlugin(config, kernels, state.pool.timing_samples,
                                                     state.pool.round_samples.clear, terminal_out()), "kopt-progress")
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(XdistControllerPlugin(config, state), "kopt-xdist-controller")


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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In every process that collects: a ``--kopt-init`` on a machine that does not allow generation runs its
    hardware items only (:func:`~pytest_kopt.plugin.loop.keep_hardware_only`)."""
    state = config.stash.get(STATE, None)
    if state is not None and state.settings.active:
        loop.keep_hardware_only(state, config, items)


@pytest.hookimpl(tryfirst=True)  # before a skip marker's or the item's own setup can end the phase
def pytest_runtest_setup(item: pytest.Item) -> None:
    """On an xdist worker with kernels planned for it, at a kernel's timing item (at its first correctness item
    where the session runs no timing item of it): start the next planned kernel's harness processes
    (:func:`~pytest_kopt.plugin.xdist.prestart_next_planned`). Not at the first correctness item where a timing
    follows: at a close's start the next kernels' processes made their CUDA contexts beside every worker's first
    ones, some 40 at once, 5 to 10 s each (H100, 2026-12-07); the timing's wait for the GPU covers their start."""
    state = item.config.stash.get(STATE, None)
    if state is None or not state.planned or not isinstance(item, KoptItem) \
            or item.gate.name not in ("correctness", "timing"):
        return
    kernel = Path(item.path).resolve()
    if kernel in state.led:
        return
    if item.gate.name == "correctness" and "timing" in state.collected.get(kernel, frozenset()):
        return  # its timing item starts them (the gates this process collected, noted at its first item)
    state.led.add(kernel)
    prestart_next_planned(item.config, state, kernel)


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
    """After every other plugin's session end (the loop's step profiles the champion with the process started ahead
    for it, and may re-time kernels in warm processes): wait for the work started ahead (builds, matplotlib's
    import, profiles no ncu item took) and end this process's harness processes (the pool's atexit hook would,
    later)."""
    try:
        return (yield)
    finally:
        state = session.config.stash.get(STATE, None)
        if state is not None:
            state.ahead.shutdown()
            state.pool.shutdown()


def pytest_unconfigure(config: pytest.Config) -> None:
    """End what this process started at configure, where no session end did (a usage error after it, such as
    another plugin's: the builds and harness processes started before the GPU probe), and give
    CUDA_VISIBLE_DEVICES back as it was, when this process pinned itself to a GPU: an in-process pytest run (an
    IDE's, pytester's ``runpytest()``) must leave neither to its caller."""
    state = config.stash.get(STATE, None)
    if state is None:
        return
    state.ahead.shutdown()
    state.pool.shutdown()
    tidy.restore(state.restore_hypothesis)
    if not state.restore_visible[0]:
        return
    before = state.restore_visible[1]
    if before is None:
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = before
