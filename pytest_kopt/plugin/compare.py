"""The comparison concerns, on the controller: the pull-request gate (``--kopt-fail-slower``: each candidate's
timing against the baseline's) and saved baselines (``--kopt-save``/``--kopt-compare``, in pytest-benchmark's
storage). Each is a plugin registered only when its option is given (pytest's ``stepwise`` pattern)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .. import prgate
from ..artifacts import Bench
from ..errors import EXIT_KERNEL, ConfigError
from .ledger import SessionOutcome
from .stash import SessionState

#: (option name, help, metavar) of these concerns' options (:mod:`pytest_kopt.plugin.options` adds them).
OPTIONS = (
    ("fail-slower", "PR gate: fail when a --kopt-candidate is confidently slower than the baseline by more than "
                    "this many percent (e.g. 3)", "PCT"),
    ("save", "Save every kernel's timing samples as a baseline NAME (pytest-benchmark's storage format)", "NAME"),
    ("compare", "Compare every kernel's timing with the newest saved baseline NAME of the same GPU model", "NAME"),
    ("storage", "Folder of saved baselines (default .benchmarks, pytest-benchmark's)", "DIR"),
)


#: Why saved baselines cannot work without pytest-benchmark, and the fix.
NO_BENCHMARK = "saved baselines are stored in pytest-benchmark's format, and pytest-benchmark is not installed"
NO_BENCHMARK_FIX = "pip install pytest-benchmark (or pytest-kopt[benchmark]), or leave out --kopt-save/--kopt-compare"


def benchmark_installed() -> bool:
    """True when pytest-benchmark, whose storage saved baselines use (:mod:`pytest_kopt.saved`), can be imported."""
    import importlib.util

    return importlib.util.find_spec("pytest_benchmark") is not None


def _fail_regressions(session: pytest.Session, entries: list[dict[str, Any]]) -> None:
    if any(c.get("fails") for c in entries) and session.exitstatus == 0:
        session.exitstatus = EXIT_KERNEL  # SKILL.md's kernel-validation code: a candidate regressed


class PrGatePlugin:
    """``--kopt-fail-slower PCT`` with candidates: each candidate's timing samples against the baseline's
    (:func:`pytest_kopt.prgate.verdict`): the baseline timed in the candidate's own rounds when it was, else the
    baseline's timing gate. A candidate without valid timing (it failed a gate, or no GPU) gets verdict NOT_TIMED
    and the gate's own failure decides."""

    def __init__(self, state: SessionState) -> None:
        self.state = state

    def on_record(self, record: Any) -> None:
        """Nothing: the gate reads the kernels' ``bench.json`` at the end."""

    def finish(self, session: pytest.Session, outcome: SessionOutcome) -> None:
        """Add one comparison per candidate to ``outcome``; exit 2 when one fails the gate."""
        entries = self.compare()
        outcome.comparisons += entries
        _fail_regressions(session, entries)

    def _bench(self, kernel: Path) -> Bench | None:
        return Bench.load(self.state.artifact_dir(kernel))

    def compare(self) -> list[dict[str, Any]]:
        """The comparisons: ``baseline``, ``candidate``, and :func:`pytest_kopt.prgate.verdict`'s fields."""
        settings = self.state.settings
        assert settings.fail_slower_pct is not None and settings.baseline is not None
        base = self._bench(settings.baseline)
        base_samples = base.valid_samples if base else None
        out = []
        for cand in settings.candidates:
            bench = self._bench(cand)
            cs = bench.valid_samples if bench else None
            paired = self._paired(bench)
            entry: dict[str, Any] = {"baseline": str(settings.baseline), "candidate": str(cand)}
            if bench is not None and bench.shapes:
                entry.update(self._shapes(base, bench))
            elif cs is None or (paired is None and base_samples is None):
                entry.update(verdict="NOT_TIMED", fails=False)
            else:
                entry.update(prgate.verdict(paired or base_samples, cs, settings.fail_slower_pct),
                             interleaved=paired is not None)
            out.append(entry)
        return out

    def _paired(self, bench: Bench | None) -> list[float] | None:
        """The baseline's samples timed in ``bench``'s own rounds, when they were and are of this baseline."""
        pr = (bench.pr_baseline or {}) if bench else {}
        baseline = self.state.settings.baseline
        same = pr.get("kernel") and baseline is not None and Path(pr["kernel"]).resolve() == Path(baseline).resolve()
        return pr.get("samples_ms") if same and pr.get("samples_ms") else None

    def _shapes(self, base: Bench | None, bench: Bench) -> dict[str, Any]:
        """The PR gate over several benchmark shapes: per shape the baseline's samples (timed in the candidate's
        rounds, else its own timing gate's) against the candidate's; the verdict on the geometric mean of the
        speedups (:func:`pytest_kopt.prgate.verdict_shapes`). NOT_TIMED when any shape lacks valid timing."""
        pct = self.state.settings.fail_slower_pct
        assert pct is not None
        theirs = base.shape_benches() if base else {}
        pairs, rows = [], []
        for label, cb in bench.shape_benches().items():
            cs = cb.valid_samples if cb else None
            bb = theirs.get(label)
            bs = self._paired(cb) or (bb.valid_samples if bb else None)
            rows.append({"shape": label, "timed": bool(cs and bs)})
            if cs and bs:
                pairs.append((bs, cs))
        if len(pairs) < len(rows) or not pairs:
            return {"verdict": "NOT_TIMED", "fails": False, "shapes": rows}
        per = [prgate.verdict(b, c, pct) for b, c in pairs]
        for row, v in zip(rows, per):
            row.update(speedup=v["speedup"], ci95=v["ci95"], verdict=v["verdict"])
        return {**prgate.verdict_shapes(pairs, pct), "per_shape": rows}


class SavedBaselinesPlugin:
    """``--kopt-save`` / ``--kopt-compare`` through pytest-benchmark's storage, keyed by GPU model. Raises
    ConfigError (a usage error, before any item runs) when pytest-benchmark is not installed."""

    def __init__(self, state: SessionState) -> None:
        if not benchmark_installed():
            raise ConfigError(f"--kopt-save/--kopt-compare: {NO_BENCHMARK}", fix=NO_BENCHMARK_FIX)
        self.state = state

    def on_record(self, record: Any) -> None:
        """Nothing: the kernels' ``bench.json`` are read at the end."""

    def finish(self, session: pytest.Session, outcome: SessionOutcome) -> None:
        """Compare with the saved baseline and/or save this session's samples; exit 2 when a comparison fails."""
        entries = self.compare(outcome.errors)
        outcome.comparisons += entries
        _fail_regressions(session, entries)

    def compare(self, errors: list[str]) -> list[dict[str, Any]]:
        """Each kernel's samples against the newest saved baseline of its label, and the save."""
        settings = self.state.settings
        gpu = (self.state.env.get("gpu") or {}).get("name")
        if not gpu:
            errors.append("--kopt-save/--kopt-compare: no GPU, nothing was timed")
            return []
        if not benchmark_installed():  # checked at configure too; a session that lost it since still says why
            errors.append(f"--kopt-save/--kopt-compare: {NO_BENCHMARK}")
            return []
        from .. import saved
        current = {settings.label(k): b.valid_samples for k in settings.kernels
                   if (b := Bench.load(self.state.artifact_dir(k))) is not None and b.valid_samples}
        out: list[dict[str, Any]] = []
        if settings.compare:
            old = saved.load_latest(settings.storage, settings.compare, gpu)
            threshold = settings.fail_slower_pct if settings.fail_slower_pct is not None else 3.0
            for label, samples in current.items():
                entry: dict[str, Any] = {"baseline": f"saved:{settings.compare}:{label}", "candidate": label}
                if not old or label not in old or not old[label]:
                    entry.update(verdict="NOT_SAVED", fails=False)
                else:
                    entry.update(prgate.verdict(old[label], samples, threshold))
                    entry["fails"] = entry["fails"] and settings.fail_slower_pct is not None
                out.append(entry)
        if settings.save and current:
            env = self.state.env
            entries = [saved.benchmark_entry(label, s, {"dims": settings.dims, "gpu": gpu})
                       for label, s in current.items()]
            saved.save(settings.storage, settings.save, gpu, entries,
                       {"gpu": gpu, "driver": env.get("driver_version"), "packages": env.get("packages")})
        return out
