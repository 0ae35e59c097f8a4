"""The typed results of the loop's steps: :class:`StepResult` (what ``--kopt-init`` or ``--kopt-run`` decided,
the ``--kopt-json`` report's ``loop`` section) and :class:`Closing` (what a close concludes on)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from ..errors import EXIT_CONFIG, ConfigError
from .schema import problem_lines

#: ``stage`` of a step that did its work: ``setup`` (iteration 1 opened), ``near_peak`` (the baseline is at the
#: roofline: the run completed at set-up), ``branch_explore`` (a close's first step: the champion's ablations are
#: asked for), ``conclude`` (an iteration closed), ``finish`` (the agent ended the run). A stop's stage is the gate
#: or loop stage it names (``hardware``, ``correctness``, ``branch_explore``, ``ncu``...), a bad file's its gate.
STAGES = ("setup", "near_peak", "branch_explore", "conclude", "finish")

if TYPE_CHECKING:
    from .gates import Context


@dataclass(frozen=True, slots=True)
class StepResult:
    """One loop step's outcome. ``exit_code`` is SKILL.md's (:data:`pytest_kopt.errors.EXIT_OK`, ``EXIT_KERNEL``,
    ``EXIT_HARDWARE``, ``EXIT_CONFIG``), ``message`` one sentence, ``next`` what to do next
    (:func:`pytest_kopt.loop.view.next_step`), ``stage`` where the step ended (:data:`STAGES` on success; the
    stage a stop names, the gate of a bad file otherwise); the rest are the report's ``loop`` fields a step fills
    (None: not shown): ``baseline_ms`` (ms), the close's ``iteration``, ``branches`` (each judged branch),
    ``champion``, ``champion_ms`` (ms), ``improved``, ``compared_against`` (the best ``improved`` was judged
    against: ``best_ms``, ``best_file``, ``source``, ``threshold_ms``), ``ablations`` (method -> judged ablation),
    ``ablations_needed``, ``stale_ablations`` (method -> the branch its ablation was built from), ``attribution``,
    ``residual`` (the gain no method explains, :func:`pytest_kopt.loop.decisions.residual`), ``sass``,
    ``verdicts``, ``failed_branches``, ``not_written`` (branch folders left empty), ``finish`` (the reason the
    agent gave for ending the run) and ``error`` (a bad loop file met at the step's end: ``message``, ``fix``,
    ``path``, ``problems``)."""

    exit_code: int
    message: str
    next: dict[str, Any] | None = None
    stage: str | None = None
    iteration: int | None = None
    baseline_ms: float | None = None
    branches: list[dict[str, Any]] | None = None
    champion: str | None = None
    champion_ms: float | None = None
    improved: bool | None = None
    compared_against: dict[str, Any] | None = None
    ablations: dict[str, dict[str, Any]] | None = None
    ablations_needed: list[str] | None = None
    stale_ablations: dict[str, str] | None = None
    attribution: dict[str, dict[str, Any]] | None = None
    residual: dict[str, Any] | None = None
    sass: dict[str, str] | None = None
    verdicts: dict[str, str] | None = None
    failed_branches: list[str] | None = None
    not_written: list[str] | None = None
    finish: str | None = None
    error: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        """The fields that are set, by name: the report's ``loop`` keys (the controller adds the run's view)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}

    @classmethod
    def config_error(cls, exc: ConfigError, next_step: dict[str, Any] | None) -> "StepResult":
        """A step stopped by a bad loop file (exit 4): the run is left as it was."""
        listed = problem_lines(exc)
        head = exc.message.split(":\n", 1)[0]
        more = f" (and {len(listed) - 1} more: error.problems)" if len(listed) > 1 else ""
        message = head if listed == [exc.message] else f"{head}: {listed[0]}{more}"
        return cls(EXIT_CONFIG, message, next_step, stage=exc.gate or "loop",
                   error={"status": exc.status, "gate": exc.gate or "loop", "message": exc.message, "fix": exc.fix,
                          "path": exc.path, "problems": problem_lines(exc)})


@dataclass(frozen=True, slots=True)
class Closing:
    """What a close concludes on (:func:`pytest_kopt.loop.conclude.conclude`): the iteration ``i``, every branch's
    ``results``, the ``champion`` (one of them, ``median_ms`` the time decided on), the claimed ``methods``, each
    method's ablation time ``ab_ms`` (ms, None: missing or failed) and the ``judged`` ablations, ``why`` (method ->
    why its attribution is inconclusive), the same-GPU ``decision`` of the branch step and the ablation step's
    (``ablation_decision``), ``best_ms_now`` (the best so far re-timed beside the champion, ms, or None),
    ``champion_ctx`` (its gate context), ``champion_bench`` (its bench.json as the branch step saw it, or None to
    read it now), ``finalize``, ``finish`` (the agent's reason to end the run after this close, or None),
    ``not_written`` (branch folders left empty) and ``steps`` (the machine each step of the close ran on)."""

    run_dir: Path
    i: int
    results: list[dict[str, Any]]
    champion: Mapping[str, Any]
    methods: list[str]
    ab_ms: dict[str, float | None]
    judged: dict[str, dict[str, Any]]
    champion_ctx: "Context"
    why: dict[str, str] = field(default_factory=dict)
    decision: Mapping[str, Any] | None = None
    ablation_decision: Mapping[str, Any] | None = None
    best_ms_now: float | None = None
    champion_bench: Mapping[str, Any] | None = None
    finalize: bool = False
    finish: str | None = None
    not_written: list[str] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
