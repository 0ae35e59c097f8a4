"""The agent ends a run on purpose (SKILL.md: the iteration count is a maximum; leave a budget under-filled rather
than add a filler): ``{"finish": "<why>"}`` in the open iteration's ``methods.json``.

- With no method listed, the ``--kopt-run`` step judges nothing and finishes now: the open iteration stays as
  written, unjudged.
- Beside the methods (``{"methods": [...], "finish": "..."}``), the close runs as usual and the run finishes after
  it (as ``--kopt-finalize`` does), whatever iterations are left.

Either way the run is ``completed`` with ``completion`` ``finished``, the reason in ``stop.json`` (exit code 0,
``stop_stage`` ``finish``), ``state.json`` (``stop_reason``), ``summary.md`` and the report (``loop.finish``); the
step's exit code is 0 and ``next.action`` ``done``.
"""

from __future__ import annotations

from pathlib import Path

from ..artifacts import write_text
from ..errors import EXIT_OK
from . import summary
from .layout import RunLayout
from .records import Stop
from .result import StepResult
from .runstate import State
from .view import next_step

#: ``state.completion`` of a run the agent finished, and the stage its stop.json and report name.
FINISHED = "finished"
STAGE = "finish"


def record_finish(run_dir: Path, reason: str, left_open: int | None) -> State:
    """Write the finish into ``stop.json`` and ``state.json`` (completed, ``stop_reason`` the agent's reason,
    ``open_iter`` cleared) and render ``summary.md``. ``left_open``: the iteration the run ended in without
    closing it, or None. Returns the state."""
    layout = RunLayout.of(run_dir)
    details = {"left_open": f"iterv{left_open}"} if left_open else None
    Stop.now(reason, STAGE, EXIT_OK, details).save(layout.stop)
    state = State.update(run_dir, run_status="completed", open_iter=None, completion=FINISHED, stop_reason=reason,
                         stop_stage=STAGE, ablation_step=None)
    summary.plot_history(state.to_json(), run_dir)
    write_text(layout.summary, summary.render_summary(state.to_json(), run_dir))
    return state


def finish_now(run_dir: Path, state: State, reason: str) -> StepResult:
    """End the run at its open iteration without closing it (methods.json holds only ``finish``). Needs no GPU:
    nothing is judged."""
    i = state.open_iter
    state = record_finish(run_dir, reason, i)
    best = RunLayout.of(run_dir).relative(state.best_file)
    speed = (f", {state.baseline_ms / state.best_metric_ms:.2f}x over the baseline"
             if state.baseline_ms and state.best_metric_ms else "")
    ms = f"{state.best_metric_ms:.4f} ms " if state.best_metric_ms else ""
    return StepResult(EXIT_OK, f"run finished by the agent at iterv{i}, which was not closed ({reason}); best "
                               f"{ms}({best}){speed}", next_step(run_dir), stage=STAGE, iteration=i, finish=reason)
