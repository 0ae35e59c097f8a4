"""The loop's own records, each a frozen dataclass that reads and writes its file (pyperf's ``Run``/``Benchmark``
pattern: the record owns its format and its validation against ``registries/loop_schema.json``):
``stop.json``, ``attribution.json``, ``sass_check.json``, ``branch_results.json`` and ``decision.json``.

``state.json`` is :class:`pytest_kopt.loop.runstate.State`, built on the same :class:`Record` base.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import math
from pathlib import Path
from typing import Any, ClassVar, Mapping, TypeVar

from ..artifacts import write_json
from . import schema

R = TypeVar("R", bound="Record")


def plain(value: Any) -> Any:
    """``value`` as JSON data: tuples as lists, records as their ``to_json()``, mappings as dicts, a NaN or an
    infinity as None (JSON has no such numbers, and the loop's reader refuses them)."""
    if isinstance(value, Record):
        return value.to_json()
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class Record:
    """A loop file as a dataclass: ``KIND`` names its schema (``$defs/<KIND>``), ``FIX`` what to do about a bad
    one. :meth:`load` reads strictly (UTF-8, JSON, schema; a bad file raises the loop's ConfigError, exit 4),
    :meth:`save` validates before it writes atomically. Fields whose value is None and whose name is in
    ``OMIT_NONE`` are left out of the file."""

    __slots__ = ()
    KIND: ClassVar[str] = ""
    FIX: ClassVar[str] = "restore the file as pytest-kopt wrote it, or start the run over with --kopt-init"
    OMIT_NONE: ClassVar[frozenset[str]] = frozenset()

    def to_json(self) -> dict[str, Any]:
        """The record as its file's JSON object."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if f.name == "extra":
                continue
            if value is None and f.name in self.OMIT_NONE:
                continue
            out[f.name] = plain(value)
        extra = getattr(self, "extra", None)
        if extra:
            out.update({k: plain(v) for k, v in extra.items() if k not in out})
        return out

    @classmethod
    def from_json(cls: type[R], doc: Any, path: Path | str) -> R:
        """The record of a document read from ``path``, validated first. Raises the loop's ConfigError."""
        schema.check(doc, cls.KIND, path, fix=cls.FIX)
        return build(cls, doc)

    @classmethod
    def load(cls: type[R], path: Path) -> R:
        """The record in ``path``. Raises the loop's ConfigError when it is missing or invalid."""
        return cls.from_json(schema.read_json(path, fix=cls.FIX), path)

    def save(self, path: Path) -> Path:
        """Validate, then write ``path`` atomically. Raises the loop's ConfigError when the record breaks its
        schema (a fault of the code that built it)."""
        doc = self.to_json()
        schema.check(doc, self.KIND, path, fix="report this as a pytest-kopt bug")
        return write_json(path, doc)


def build(cls: type[R], doc: Mapping[str, Any]) -> R:
    """A record from a (validated) document: its fields by name; other keys go to ``extra`` where the record has
    one, else are dropped."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    known = {k: v for k, v in doc.items() if k in names and k != "extra"}
    if "extra" in names:
        known["extra"] = {k: v for k, v in doc.items() if k not in names}
    return cls(**known)


_record = dataclasses.dataclass(frozen=True, slots=True)


@_record
class Stop(Record):
    """``stop.json`` (SKILL.md: every failure after the state exists writes it): ``stop_reason``, ``stop_stage``,
    ``exit_code`` (2, 3 or 4; 0 for a run the agent finished on purpose, ``stop_stage`` ``finish``), ``details``
    (the branch results of a validation stop, or None), ``time`` (ISO 8601, seconds)."""

    KIND: ClassVar[str] = "stop"
    stop_reason: str
    stop_stage: str
    exit_code: int
    details: Any = None
    time: str = ""

    @classmethod
    def now(cls, reason: str, stage: str, exit_code: int, details: Any = None) -> "Stop":
        """A stop stamped with the current local time."""
        return cls(reason, stage, int(exit_code), details, _dt.datetime.now().isoformat(timespec="seconds"))


@_record
class Attribution(Record):
    """``attribution.json`` (SKILL.md 3h): the champion's median (ms), the noise threshold (%), per method
    ``ms_without``, ``attribution_ms``, ``attribution_pct``, ``contributed`` (None: inconclusive) and ``reason``,
    and the ``residual``: the iteration's gain that no method's ablation explains
    (:func:`pytest_kopt.loop.decisions.residual`; None without a best to compare against)."""

    KIND: ClassVar[str] = "attribution"
    OMIT_NONE: ClassVar[frozenset[str]] = frozenset({"residual"})
    champion_ms: float
    noise_threshold_pct: float
    methods: dict[str, dict[str, Any]]
    residual: dict[str, Any] | None = None


@_record
class SassCheck(Record):
    """``sass_check.json`` (SKILL.md 3i): per method its status (``pass``, ``fail``, ``inconclusive``,
    ``not_applicable``, ``tool_error``) and its evidence (the opcodes required, found and missing, or why it
    cannot be shown)."""

    KIND: ClassVar[str] = "sass_check"
    methods: dict[str, str]
    evidence: dict[str, Any]


@_record
class BranchResults(Record):
    """``branch_results.json`` (SKILL.md 3e): the iteration, every judged branch, the champion (None when every
    branch failed), the same-GPU ``decision``; while the close waits for the champion's ablations,
    ``awaiting_ablations`` (method ids); ``not_written``: the branch folders the agent left empty."""

    KIND: ClassVar[str] = "branch_results"
    OMIT_NONE: ClassVar[frozenset[str]] = frozenset({"awaiting_ablations", "not_written"})
    iter: int
    branches: list[dict[str, Any]]
    champion: str | None
    decision: dict[str, Any] | None = None
    awaiting_ablations: list[str] | None = None
    not_written: list[str] | None = None


@_record
class Decision(Record):
    """``decision.json`` (``decision_ablations.json`` for a close's second step): a decision made from times of one
    GPU (:func:`pytest_kopt.loop.branch_step.same_gpu_decision`): the GPU, the GPUs the gates measured on, whether
    the champion was contested, the re-timed medians (ms) and their CIs, why the rest needed no re-timing."""

    KIND: ClassVar[str] = "decision"
    method: str
    gpu_uuid: str | None
    gpu_index: int | None
    measured_on: list[str]
    finalist_margin_pct: float
    max_finalists: int
    champion_contest: bool
    retimed_ms: dict[str, float]
    retimed_ci95_ms: dict[str, list[float]]
    robust: dict[str, str]
    kernels: dict[str, str]
    stop_reasons: dict[str, Any]
    reported_gpu: dict[str, Any]
    best_note: str | None
