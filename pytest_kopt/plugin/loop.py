"""The loop concern, on the controller: ``--kopt-init`` seeds a run directory (its folder and state.json made at
configure, before any gate writes into it; the baseline's step at the session's end), ``--kopt-run`` closes the
open iteration at the session's end, or finishes the run without judging anything when methods.json says so; in a
close, the likely champions' profiles are started as their records arrive. Registered only in a loop session
(pytest's ``stepwise`` pattern)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .. import defaults
from ..gates.hardware import generation_problem
from ..loop import session as loop_session
from ..loop import state as loop_state
from ..loop.layout import is_branch_kernel
from ..loop.schema import loop_error
from .ledger import SessionOutcome
from .options import raw, usage_error
from .stash import SessionState

#: (option name, help, metavar) and (flag, help) of this concern (:mod:`pytest_kopt.plugin.options` adds them).
OPTIONS = (
    ("run", "Close the open iteration of this run directory (branches and ablations the agent wrote)", "DIR"),
    ("iterations", f"Loop: maximum number of iterations for --kopt-init (default {defaults.ITERATIONS})", "N"),
    ("branches", f"Loop: branch folders per iteration for --kopt-init (default {defaults.BRANCHES})", "K"),
    ("noise", f"Loop: noise threshold in percent for improvement and attribution (default {defaults.NOISE_PCT:g})",
     "PCT"),
    ("numerics-mode", f"Loop: {', '.join(defaults.NUMERICS_MODES[:-1])} or {defaults.NUMERICS_MODES[-1]} (default "
                      f"{defaults.NUMERICS_MODE}; approximate admits tolerance-changing methods, every correctness "
                      "check still runs)", "MODE"),
    ("compile-jobs", "nvcc builds at once: auto (default; SKILL.md's: half the CPUs, at most 4, within the "
                     "available memory less 2 GiB at 2 GiB a CUDA build and 4 GiB a CUTLASS one) or N; a build "
                     "killed for want of memory is retried once, alone", "auto|N"),
)
FLAGS = (
    ("init", "Create a run directory beside the baseline: all strict gates, baseline profile, iteration 1 opened"),
    ("finalize", "With --kopt-run: complete the run after this close and render summary.md"),
)


def init_run(state: SessionState) -> None:
    """--kopt-init, controller side: create the run folder and state.json before any gate writes into it."""
    s = state.settings
    assert s.run_dir is not None and s.baseline is not None and s.ref is not None
    loop_state.init_state(s.run_dir, s.baseline, s.ref, s.dims, iterations=s.iterations, branches=s.branches,
                          ncu_num=s.ncu_num, noise_pct=s.noise_pct, numerics_mode=s.numerics_mode,
                          seeds=list(s.seeds), env=state.env)


def hardware_only(state: SessionState) -> bool:
    """True for a ``--kopt-init`` on a machine that does not allow generation (SKILL.md step 0: the run stops at
    once, whatever the gates say): the session runs its hardware items only (:func:`keep_hardware_only`), and its
    kernels are not judged. The same answer in every process (the xdist workers read the controller's probe)."""
    return state.settings.loop_mode == "init" and generation_problem(state.env) is not None


def keep_hardware_only(state: SessionState, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Where :func:`hardware_only` holds, only the hardware items run, which report why; every other item is
    deselected: its result would be thrown away (the Triton softmax example's correctness ran some 170 s in
    Triton's interpreter on a GPU-less machine before the step stopped with exit 3). Called in every process that
    collects."""
    if not hardware_only(state):
        return
    keep = [i for i in items if getattr(getattr(i, "gate", None), "name", None) == "hardware"]
    if len(keep) < len(items):
        kept = {id(i) for i in keep}
        config.hook.pytest_deselected(items=[i for i in items if id(i) not in kept])
        items[:] = keep


class LoopPlugin:
    """The loop's session-end step (:func:`pytest_kopt.loop.session.finish_init` /
    :func:`~pytest_kopt.loop.session.finish_run`) and, in a close, the branches' profiles started ahead
    (:meth:`pytest_kopt.scheduler.Scheduler.on_branch_record`)."""

    def __init__(self, config: pytest.Config, state: SessionState) -> None:
        self.config = config
        self.state = state
        #: a --kopt-run whose methods.json only finishes the run: nothing is judged (pytest_kopt.loop.finish)
        self.finishing = False
        #: how many branches the close judges (the session's branch kernels), once a record needs it
        self._branches: int | None = None

    def pytest_configure(self, config: pytest.Config) -> None:
        """A close refuses an option --kopt-init fixed for the run, given with another value (a usage error, exit
        4), and learns whether it finishes the run. (Registered during kopt's configure, this runs at once.)"""
        settings = self.state.settings
        if settings.loop_mode != "run" or settings.run_dir is None:
            return
        given = {name: raw(config, name) for name in loop_session.RUN_FIXED}
        found = loop_session.fixed_option_problems(settings.run_dir, given)
        if found:
            raise usage_error(loop_error(f"--kopt-run {settings.run_dir}: an option differs from the run's", found,
                                         path=settings.run_dir / "state.json", fix="leave the option out: a close "
                                         "uses the values --kopt-init fixed for the run"), config)
        self.finishing = loop_session.finishing(settings.run_dir)

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        """A finishing step judges no kernel: every item is deselected (the run's best kernel is the session's
        kernel only so that the session runs)."""
        if self.finishing and items:
            config.hook.pytest_deselected(items=list(items))
            items[:] = []

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool | None:
        """A finishing step runs no item, here or on xdist's workers (their collection is never scheduled)."""
        return True if self.finishing else None

    def on_record(self, record: Any) -> None:
        """In a close: a branch's record may start (or end) its profile ahead of the champion's."""
        settings = self.state.settings
        if settings.loop_mode != "run" or not record.kernel or settings.run_dir is None:
            return
        kernel = Path(record.kernel)
        if not is_branch_kernel(kernel, settings.run_dir):
            return
        ctx = self.state.context(self.config, kernel, str(kernel))
        if self._branches is None:  # the session's kernels are fixed: counted once
            self._branches = max(1, sum(is_branch_kernel(k, settings.run_dir) for k in self.state.kernels))
        self.state.ahead.on_branch_record(ctx, record, self.state.gates.branch_strict, self._branches)

    def finish(self, session: pytest.Session, outcome: SessionOutcome) -> None:
        """The loop's step, when pytest itself ended the session normally (its "interrupted" 2 and "internal error"
        3 share numbers with SKILL.md's codes) and ran items (not ``--co``); the process exit of a loop step is the
        loop's outcome (SKILL.md 0/2/3/4): a failing branch among passing ones is reported in the JSON's
        ``loop.branches``, not by the exit code."""
        settings = self.state.settings
        ran = (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED)
        if self.finishing:  # nothing was collected or run on purpose
            ran = (*ran, pytest.ExitCode.NO_TESTS_COLLECTED)
        if outcome.pytest_status not in ran or self.config.option.collectonly or settings.run_dir is None:
            return
        ledger = outcome.ledger
        code = ledger.exit_code()
        self.state.ahead.wait_plotting()  # the close's charts: never two threads importing matplotlib
        result = self._step(ledger.records)
        if result.get("next"):
            # a rerun that writes this session's report
            report = Path(settings.json_path) if settings.json_path not in (None, "-") else None
            result["next"] = loop_state.rerun_writing(result["next"], report)
        if self.finishing or (session.exitstatus in (0, code) and not ledger.other_failures()):
            session.exitstatus = int(result["exit_code"])
        outcome.loop = {**loop_state.run_view(settings.run_dir), **result, "run_dir": str(settings.run_dir),
                        "mode": settings.loop_mode}

    def _step(self, records: list[Any]) -> dict[str, Any]:
        """--kopt-init: stop the run or open iteration 1; --kopt-run: close the open iteration."""
        settings = self.state.settings
        assert settings.run_dir is not None

        def ctx_for(kernel: Path) -> Any:
            return self.state.context(self.config, kernel, str(kernel))

        if settings.loop_mode == "init":
            assert settings.baseline is not None
            return loop_session.finish_init(settings.run_dir, ctx_for(settings.baseline), records,
                                            env=self.state.env).to_json()
        # this step's machine (the session's probe): recorded in the run, its generation_allowed and arch read
        return loop_session.finish_run(settings.run_dir, ctx_for, records, settings.finalize, env=self.state.env,
                                       arch=settings.arch).to_json()
