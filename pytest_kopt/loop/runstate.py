"""``state.json`` as one typed record: :class:`State` reads it (UTF-8, JSON, ``$defs/state`` of
``registries/loop_schema.json``), checks its paths against the run's layout, and writes it (merged with what is
on disk, validated, atomically). Its on-disk field names are SKILL.md's (step 1, schema v5) plus pytest-kopt's
own; nothing else builds or parses that document.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Mapping

from .. import defaults
from ..errors import ConfigError
from . import schema
from .decisions import select_champion
from .layout import KERNEL_SUFFIXES, RunLayout
from .pins import file_sha256, schema_problem
from .records import Record, build

#: SKILL.md's state schema version.
SKILL_SCHEMA = 5
#: pytest-kopt's state format (the fields beyond SKILL.md's: pinned inputs, the close's ablation step).
KOPT_STATE_VERSION = 1
BUCKETS = ("effective", "ineffective", "implementation_failed", "unverified")
_STATE_FIX = ("restore state.json as pytest-kopt wrote it (the loop writes it after every step), or start a new run "
              "with --kopt-init")


@dataclass(frozen=True, slots=True)
class AblationStep(Record):
    """``state.ablation_step``: a close whose first step judged the branches and waits for the champion's
    ablations. ``champion`` (``b2``), ``champion_kernel`` (its path), ``champion_sha256`` (of the kernel as
    judged), ``champion_ms`` (ms), ``champion_bench`` (its bench.json then), ``methods`` (the claims the branches
    were judged under), ``needed`` (the methods whose ablation of the champion is asked for), ``ready`` (the
    ablations already usable), ``best_ms_now`` (the best so far, re-timed beside the champion, or None),
    ``results`` (every branch), ``decision`` (the first step's same-GPU decision), ``finalize``, ``finish`` (the
    agent's reason to end the run after the close, or None), ``steps`` (the machine the branch step ran on) and
    ``champion_sass_sha256`` (each ``sass/*.sass`` file of the champion's folder, by name: the SASS the second step
    verifies the methods on)."""

    KIND: ClassVar[str] = "ablation_step"
    iter: int
    champion: str
    champion_kernel: str
    champion_sha256: str
    champion_ms: float
    methods: list[str]
    needed: list[str]
    results: list[dict[str, Any]]
    finalize: bool
    ready: dict[str, dict[str, Any]] = field(default_factory=dict)
    champion_bench: dict[str, Any] | None = None
    best_ms_now: float | None = None
    decision: dict[str, Any] | None = None
    finish: str | None = None
    steps: list[dict[str, Any]] = field(default_factory=list)
    champion_sass_sha256: dict[str, str] = field(default_factory=dict)

    def champion_problem(self) -> str | None:
        """None while the champion is the one the first step judged, else why not: its kernel (SHA-256), the branch
        the first step's results make champion (:func:`~pytest_kopt.loop.decisions.select_champion` over their
        finalists, with its kernel and median). Its SASS is :meth:`sass_problem`'s."""
        if file_sha256(Path(self.champion_kernel)) != self.champion_sha256:
            return (f"the champion {self.champion_kernel} is gone or changed since the close's branch step judged "
                    "it")
        best = select_champion([r for r in self.results if r.get("finalist", True)])
        if best is None or (best.get("branch"), best.get("kernel"), best.get("median_ms")) != (
                self.champion, self.champion_kernel, self.champion_ms):
            picked = "none" if best is None else f"{best.get('branch')} ({best.get('median_ms')} ms)"
            return (f"ablation_step names {self.champion} ({self.champion_ms} ms) the champion, but its branch results "
                    f"make {picked} the champion")
        return None

    def sass_problem(self, folder: Path) -> str | None:
        """None while the champion's artifact ``folder`` holds the SASS files kopt last dumped
        (``champion_sass_sha256``: the branch step's, or a second step's that judged the champion again), else
        which changed, came or went."""
        now = champion_sass(folder)
        if now == self.champion_sass_sha256:
            return None
        changed = sorted(n for n in set(now) | set(self.champion_sass_sha256)
                         if now.get(n) != self.champion_sass_sha256.get(n))
        return f"{folder / 'sass'}: {', '.join(changed)} changed since kopt dumped the champion's SASS"


def champion_sass(folder: Path) -> dict[str, str]:
    """The SHA-256 of each ``sass/*.sass`` file of a kernel's artifact ``folder``, by file name ({} without any)."""
    return {p.name: str(file_sha256(p)) for p in sorted((folder / "sass").glob("*.sass")) if p.is_file()}


@dataclass(frozen=True, slots=True)
class State(Record):
    """A run's ``state.json``. Times in ms, ``noise_threshold_pct`` in percent; ``history``, ``roofline_history``
    and ``frontier`` hold one JSON object per iteration or branch (see the schema); ``pinned_sha256`` maps each
    pinned copy's path in the run to its SHA-256 (:mod:`pytest_kopt.loop.pins`); ``extra`` keeps keys this
    version does not know, so a merge never drops them."""

    KIND: ClassVar[str] = "state"
    FIX: ClassVar[str] = _STATE_FIX
    run_dir: str
    baseline_file: str
    ref_file: str
    ref_source: str
    best_file: str
    env: dict[str, Any]
    validation_seeds: list[int]
    dims: dict[str, Any]
    schema_version: int = SKILL_SCHEMA
    kopt_state_version: int = KOPT_STATE_VERSION
    best_metric_ms: float | None = None
    best_ncu_rep: str | None = None
    iterations_total: int = defaults.ITERATIONS
    ncu_num: int = defaults.NCU_NUM
    branches: int = defaults.BRANCHES
    noise_threshold_pct: float = defaults.NOISE_PCT
    numerics_mode: str = defaults.NUMERICS_MODE
    selected_methods: list[str] = field(default_factory=list)
    effective_methods: list[str] = field(default_factory=list)
    ineffective_methods: list[str] = field(default_factory=list)
    implementation_failed_methods: list[str] = field(default_factory=list)
    unverified_methods: list[str] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)
    roofline_history: list[dict[str, Any]] = field(default_factory=list)
    frontier: list[dict[str, Any]] = field(default_factory=list)
    run_status: str = "initializing"
    generation_allowed: bool = False
    stop_reason: str | None = None
    stop_stage: str | None = None
    hardware_attempts: list[Any] = field(default_factory=list)
    verified_iterations: int = 0
    last_verified_iter: int = 0
    open_iter: int | None = None
    pinned_sha256: dict[str, str] = field(default_factory=dict)
    registries_sha256: dict[str, str] = field(default_factory=dict)
    baseline_ms: float | None = None
    best_sass: dict[str, str] = field(default_factory=dict)
    best_gpu_uuid: str | None = None
    ncu_set: str | None = None
    completion: str | None = None
    ablation_step: AblationStep | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, doc: Any, path: Path | str) -> "State":
        """The state of a document read from ``path``. Raises the loop's ConfigError (exit 4) listing every
        field that breaks the schema."""
        if isinstance(doc, dict) and doc.get("kopt_state_version") not in (None, KOPT_STATE_VERSION):
            raise schema.loop_error(f"{path} was written by another version of pytest-kopt",
                                    [f"state.json: kopt_state_version is {doc.get('kopt_state_version')!r}, this "
                                     f"pytest-kopt reads {KOPT_STATE_VERSION}"], path=path,
                                    fix="finish the run with the pytest-kopt that seeded it, or start a new run")
        schema.check(doc, cls.KIND, path, fix=cls.FIX)
        state = build(cls, doc)
        step = doc.get("ablation_step")
        return dataclasses.replace(state, ablation_step=build(AblationStep, step) if step else None)

    @classmethod
    def load(cls, run_dir: Path) -> "State":  # type: ignore[override]
        """The state of the run ``run_dir``. Raises the loop's ConfigError when the folder holds no state.json
        (it is not a run) or a bad one."""
        path = RunLayout.of(run_dir).state
        if not path.is_file():
            raise schema.loop_error(f"{run_dir} is not a run directory", [f"{path}: no such file"], path=path,
                                    fix="pass a run_YYYYMMDD_HHMMSS folder made by --kopt-init")
        doc = schema.read_json(path, fix=_STATE_FIX)
        changed = schema_problem(doc)
        if changed is not None:
            raise schema.loop_error(f"{run_dir}: the schema its files are checked against changed since --kopt-init",
                                    [changed], path=path, fix="run the step with the pytest-kopt that seeded the run "
                                    "(reinstall it), or start a new run with --kopt-init")
        return cls.from_json(doc, path)

    def save(self, run_dir: Path) -> "State":  # type: ignore[override]
        """Validate and write ``run_dir/state.json`` atomically; returns self."""
        Record.save(self, RunLayout.of(run_dir).state)
        return self

    def replace(self, changes: Mapping[str, Any]) -> "State":
        """This state with ``changes`` (field name -> value; an unknown name is kept in ``extra``; an
        ``ablation_step`` given as a dict becomes an :class:`AblationStep`)."""
        names = {f.name for f in dataclasses.fields(self)}
        known = {k: v for k, v in changes.items() if k in names and k != "extra"}
        if isinstance(known.get("ablation_step"), Mapping):
            known["ablation_step"] = build(AblationStep, known["ablation_step"])
        unknown = {k: v for k, v in changes.items() if k not in names}
        if unknown:
            known["extra"] = {**self.extra, **unknown}
        return dataclasses.replace(self, **known)

    @classmethod
    def update(cls, run_dir: Path, **changes: Any) -> "State":
        """Merge ``changes`` into the state on disk (never replace it wholesale) and write it; returns the new
        state. Raises the loop's ConfigError when the state on disk or the result is invalid."""
        return cls.load(run_dir).replace(changes).save(run_dir)

    @property
    def buckets(self) -> dict[str, list[str]]:
        """SKILL.md 3j's method buckets by name (``effective``...)."""
        return {b: list(getattr(self, f"{b}_methods")) for b in BUCKETS}

    @property
    def pending(self) -> AblationStep | None:
        """The open iteration's ablation step (a close waiting for the champion's ablations), else None (an
        ablation step of another iteration is stale)."""
        step = self.ablation_step
        return step if step is not None and self.open_iter is not None and step.iter == self.open_iter else None

    def path_problems(self, layout: RunLayout) -> list[str]:
        """What in this state does not fit the run it lies in: ``run_dir`` not this folder; ``ref_file`` not the
        run's private copy ``reference/<name>``; ``best_file`` not the baseline's copy or an iteration's champion
        copy; ``open_iter`` beyond ``iterations_total`` or without its folder; an ablation step whose champion
        kernel is not that branch's kernel. Each path is resolved (symlinks followed): none may lead outside."""
        out = []
        root = layout.root.resolve()
        if Path(self.run_dir).resolve() != root:
            out.append(f"state.json: run_dir is {self.run_dir}, not this run directory ({layout.root}); a run cannot "
                       "be moved or copied")
        ref = Path(self.ref_file)
        if ref != layout.reference(ref.name):
            out.append(f"state.json: ref_file is {self.ref_file}, not the run's private copy "
                       f"{layout.reference(Path(self.ref_source).name)}")
        elif (problem := layout.contained(ref)) is not None:
            out.append(f"state.json: ref_file: {problem}")
        best = Path(self.best_file)
        allowed = [layout.baseline_kernel(Path(self.baseline_file).name)]
        allowed += [layout.iteration(h["iter"]).kernel(s) for h in self.history for s in KERNEL_SUFFIXES]
        if best not in allowed:
            out.append(f"state.json: best_file is {self.best_file}, neither the baseline's copy nor an iteration's "
                       "champion copy (iterv<i>/kernel.<ext>)")
        elif best.exists() and (problem := layout.contained(best)) is not None:
            out.append(f"state.json: best_file: {problem}")
        i = self.open_iter
        if i is not None:
            if i > self.iterations_total:
                out.append(f"state.json: open_iter is {i}, beyond iterations_total {self.iterations_total}")
            it = layout.iteration(i).dir
            if not it.is_dir() or (problem := layout.contained(it)) is not None:
                what = "not a folder" if not it.is_dir() else problem
                out.append(f"state.json: open_iter is {i}, but {it} is {what}")
        step = self.pending
        if step is not None:
            want = [layout.iteration(step.iter).branch_dir(step.champion) / f"kernel{s}" for s in KERNEL_SUFFIXES]
            if Path(step.champion_kernel) not in want:
                out.append(f"state.json: ablation_step.champion_kernel is {step.champion_kernel}, not the kernel of "
                           f"branch {step.champion} of {layout.iteration(step.iter).name}")
        return out

    def check_paths(self, layout: RunLayout) -> None:
        """Raise the loop's ConfigError listing :meth:`path_problems`, when there are any."""
        found = self.path_problems(layout)
        if found:
            raise schema.loop_error(f"{layout.state} does not fit the run directory {layout.root}", found,
                                    path=layout.state, fix=_STATE_FIX)


def load_or_none(run_dir: Path) -> State | None:
    """The run's state, or None when it has none or a bad one (for views that must not fail: a report, a
    summary of a broken run)."""
    try:
        return State.load(run_dir)
    except ConfigError:
        return None
