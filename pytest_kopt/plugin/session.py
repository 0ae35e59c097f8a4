"""What exists only on the controller (or the single process without xdist): the ledger of item reports, the
session's exit code, the PR gate and saved baselines, the loop's session-end step, the JSON report and the
terminal summary (pytest-mypy's controller-plugin pattern: a class registered in ``pytest_configure``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from .. import prgate
from ..artifacts import Bench
from ..loop import session as loop_session
from ..loop.layout import is_branch_kernel
from ..loop import state as loop_state
from .ledger import Ledger
from .options import FAILED_SEED_CACHE_KEY
from .stash import SessionState
from .terminal import summary


#: The most branch profiles a loop's close keeps waiting at once (each holds a CUDA context on the GPU, and its
#: start imports torch under ncu beside the workers' items; the cap is a judgement, not a measured optimum).
PROFILES_AHEAD = 4


class ControllerPlugin:
    """Collects every kopt item's report, sets SKILL.md's exit code, closes the loop's step, compares kernels,
    writes ``--kopt-json`` and prints the summary."""

    def __init__(self, config: pytest.Config, state: SessionState) -> None:
        self.config = config
        self.state = state
        self.ledger = Ledger()
        self.stdout_doc: str | None = None
        self.loop_result: dict[str, Any] | None = None
        self.errors: list[str] = []
        self.comparisons: list[dict[str, Any]] = []
        #: in a loop's close: the fastest branch timed so far (median ms, kernel path), the branches a start was
        #: tried for, those ruled out as champion (an item failed or skipped, or timed slower than the fastest), and
        #: what was done for each (shown with -v)
        self.leader: tuple[float, Path] | None = None
        self.tried: set[Path] = set()
        self.ruled_out: set[Path] = set()
        self.ahead_log: list[str] = []

    @property
    def profiling(self) -> set[Path]:
        """The kernels whose profile started ahead waits in this process's pool
        (:func:`pytest_kopt.gates.ncu.start_profile` puts it there, :func:`pytest_kopt.gates.ncu.end_ahead` takes it
        out)."""
        return {Path(key[0]) for key in self.state.pool.ahead}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Keep one record per kopt item; in a loop's close, start the likely champions' profiles."""
        before = len(self.ledger.records)
        self.ledger.add(report)
        if self.state.settings.loop_mode == "run" and len(self.ledger.records) > before:
            self._profile_branches_ahead(self.ledger.records[-1])

    def _profile_branches_ahead(self, rec: Any) -> None:
        """Start each branch's profile with the run's ncu set at its first passed correctness seed
        (:func:`pytest_kopt.gates.ncu.start_profile`), at most :data:`PROFILES_AHEAD` at once (a branch over the
        cap is tried again at its next passed item), so ncu's start (Python, torch, the CUDA context under ncu:
        about 6.5 s on the H200) overlaps the rest of the close and the champion's profile
        (:func:`pytest_kopt.loop.session.finish_run`) finds it waiting; a branch timed last is then no later than
        one timed first. A branch whose compile, correctness or timing item fails, whose correctness or timing
        skips, or whose timing is slower than the fastest branch's so far, has its profile ended (and none
        started). A kernel of several benchmark shapes gets none. A champion the decision picks otherwise is
        profiled from the start, as before."""
        from ..gates.ncu import start_profile

        kernel = Path(rec.kernel) if rec.kernel else None
        if kernel is None or not is_branch_kernel(kernel, self.state.settings.run_dir) \
                or not self.state.settings.ncu_set \
                or not self.state.env.get("gpu") or kernel in self.ruled_out:
            return
        ctx = self.state.context(self.config, kernel, str(kernel))
        if len(ctx.benchmarks) > 1:
            return  # the profile is of the first benchmark shape, the decision of all: left to the close
        median = rec.figures.get("median_ms")
        slower = None
        if (rec.outcome == "failed" and rec.gate in loop_session.BRANCH_GATES) or \
                (rec.outcome == "skipped" and rec.gate in ("correctness", "timing")):
            slower = f"{rec.gate} {rec.outcome}"
        elif rec.outcome != "passed":
            return
        elif rec.gate == "timing" and not rec.case and isinstance(median, (int, float)):
            if self.leader is not None and self.leader[0] <= median:
                slower = f"{median:.4f} ms, slower than {self.leader[1].parent.name}"
            else:
                if self.leader is not None:
                    self._rule_out(ctx, self.leader[1], f"slower than {kernel.parent.name} ({median:.4f} ms)")
                self.leader = (float(median), kernel)
        if slower is not None:
            self._rule_out(ctx, kernel, slower)
            return
        if kernel in self.tried or not (rec.gate == "correctness" or self.leader and self.leader[1] == kernel):
            return
        if len(self.profiling) >= PROFILES_AHEAD:  # tried again at its next passed item (as the fastest, say)
            return
        self.tried.add(kernel)
        try:
            started = start_profile(ctx, self.state.settings.ncu_set, None)
        except Exception as exc:  # noqa: BLE001  (a start ahead never fails a session: the champion's profile
            started, why = False, f"{type(exc).__name__}: {exc}"  # starts its own, and reports what fails)
        else:
            why = "" if started else "no build or no ncu"
        self.ahead_log.append(f"{kernel.parent.name} ({rec.gate} passed): " + (
            "profile started ahead" if started else f"not started ({why})"))

    def _rule_out(self, ctx: Any, kernel: Path, why: str) -> None:
        from ..gates.ncu import end_ahead

        self.ruled_out.add(kernel)
        if kernel in self.profiling:
            end_ahead(ctx, kernel)
            self.ahead_log.append(f"{kernel.parent.name}: profile ended ({why})")

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        """Map pytest's "tests failed" (1) to SKILL.md's code when every failure is a gate's; run the loop's step;
        compare kernels; write the JSON report."""
        settings = self.state.settings
        pytest_status = session.exitstatus
        cache = getattr(self.config, "cache", None)
        if cache is not None and settings.session_seed is not None and any(r.outcome == "failed"
                                                                            for r in self.ledger.records):
            cache.set(FAILED_SEED_CACHE_KEY, settings.session_seed)
        code = self.ledger.exit_code()
        if code is not None and pytest_status == pytest.ExitCode.TESTS_FAILED and not self.ledger.other_failures():
            session.exitstatus = code
        # pytest's own "interrupted" (2) and "internal error" (3) share numbers with SKILL.md's codes: decide on the
        # status pytest itself reported, before any mapping
        if settings.loop_mode is not None and pytest_status in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED) \
                and not self.config.option.collectonly:  # --co runs nothing: there is no step to take
            self.loop_result = self._finish_loop()
            # the process exit of a loop step is the loop's outcome (SKILL.md 0/2/3/4): a failing branch among
            # passing ones is reported in the JSON's loop.branches, not by the exit code
            if session.exitstatus in (0, code) and not self.ledger.other_failures():
                session.exitstatus = int(self.loop_result["exit_code"])
        self.comparisons = self._pr_gate() + self._saved_baselines()
        if any(c.get("fails") for c in self.comparisons) and session.exitstatus == 0:
            session.exitstatus = 2  # SKILL.md's kernel-validation code: the candidate regressed
        if settings.json_path:
            loop = {**loop_state.run_view(settings.run_dir), **self.loop_result, "run_dir": str(settings.run_dir),
                    "mode": settings.loop_mode} if self.loop_result and settings.run_dir else None
            doc = self.ledger.document(exit_code=int(session.exitstatus), settings=settings, env=self.state.env,
                                       comparisons=self.comparisons, loop=loop)
            if settings.json_path == "-":
                self.stdout_doc = json.dumps(doc, default=str, allow_nan=False)  # printed last, in unconfigure
            else:
                try:
                    Path(settings.json_path).parent.mkdir(parents=True, exist_ok=True)
                    Path(settings.json_path).write_text(json.dumps(doc, indent=2, default=str, allow_nan=False) + "\n")
                except OSError as exc:
                    self.errors.append(f"--kopt-json: could not write {settings.json_path}: {exc}")

    def _bench(self, kernel: Path) -> Bench | None:
        return Bench.load(self.state.settings.artifact_dir(Path(kernel).resolve()))

    def _pr_gate(self) -> list[dict[str, Any]]:
        """--kopt-fail-slower: each candidate's timing samples against the baseline's (see
        :func:`pytest_kopt.prgate.verdict`): the baseline timed in the candidate's own rounds when it was, else the
        baseline's timing gate. A candidate without valid timing (it failed a gate, or no GPU) gets verdict
        NOT_TIMED and the gate's own failure decides."""
        settings = self.state.settings
        if settings.fail_slower_pct is None or not settings.candidates or settings.baseline is None:
            return []
        base = self._bench(settings.baseline)
        base_samples = base.valid_samples if base else None
        out = []
        for cand in settings.candidates:
            bench = self._bench(cand)
            cs = bench.valid_samples if bench else None
            pr = (bench.pr_baseline or {}) if bench else {}
            same = pr.get("kernel") and Path(pr["kernel"]).resolve() == Path(settings.baseline).resolve()
            paired = pr.get("samples_ms") if same and pr.get("samples_ms") else None
            entry: dict[str, Any] = {"baseline": str(settings.baseline), "candidate": str(cand)}
            if bench is not None and bench.shapes:
                entry.update(self._pr_shapes(base, bench))
                out.append(entry)
                continue
            if cs is None or (paired is None and base_samples is None):
                entry.update(verdict="NOT_TIMED", fails=False)
            else:
                entry.update(prgate.verdict(paired or base_samples, cs, settings.fail_slower_pct),
                             interleaved=paired is not None)
            out.append(entry)
        return out

    def _pr_shapes(self, base: Bench | None, bench: Bench) -> dict[str, Any]:
        """The PR gate over several benchmark shapes: per shape the baseline's samples (timed in the candidate's
        rounds, else its own timing gate's) against the candidate's; the verdict on the geometric mean of the
        speedups (:func:`pytest_kopt.prgate.verdict_shapes`). NOT_TIMED when any shape lacks valid timing."""
        settings = self.state.settings
        theirs = base.shape_benches() if base else {}
        pairs, rows = [], []
        for label, cb in bench.shape_benches().items():
            cs = cb.valid_samples if cb else None
            pr = (cb.pr_baseline or {}) if cb else {}
            same = pr.get("kernel") and Path(pr["kernel"]).resolve() == Path(settings.baseline).resolve()
            bs = pr.get("samples_ms") if same and pr.get("samples_ms") else None
            bb = theirs.get(label)
            bs = bs or (bb.valid_samples if bb else None)
            rows.append({"shape": label, "timed": bool(cs and bs)})
            if cs and bs:
                pairs.append((bs, cs))
        if len(pairs) < len(rows) or not pairs:
            return {"verdict": "NOT_TIMED", "fails": False, "shapes": rows}
        per = [prgate.verdict(b, c, settings.fail_slower_pct) for b, c in pairs]
        for row, v in zip(rows, per):
            row.update(speedup=v["speedup"], ci95=v["ci95"], verdict=v["verdict"])
        return {**prgate.verdict_shapes(pairs, settings.fail_slower_pct), "per_shape": rows}

    def _saved_baselines(self) -> list[dict[str, Any]]:
        """--kopt-save / --kopt-compare through pytest-benchmark's storage, keyed by GPU model."""
        settings = self.state.settings
        if not settings.save and not settings.compare:
            return []
        gpu = (self.state.env.get("gpu") or {}).get("name")
        if not gpu:
            self.errors.append("--kopt-save/--kopt-compare: no GPU, nothing was timed")
            return []
        try:
            from .. import saved
        except ImportError:  # pragma: no cover - pytest-benchmark is the optional [benchmark] extra
            self.errors.append("--kopt-save/--kopt-compare need pytest-benchmark: pip install pytest-benchmark")
            return []
        current = {settings.label(k): b.valid_samples for k in settings.kernels
                   if (b := self._bench(k)) is not None and b.valid_samples}
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

    def _finish_loop(self) -> dict[str, Any]:
        """--kopt-init: stop the run or open iteration 1; --kopt-run: close the open iteration."""
        settings = self.state.settings
        assert settings.run_dir is not None

        def ctx_for(kernel: Path) -> Any:
            return self.state.context(self.config, kernel, str(kernel))

        if settings.loop_mode == "init":
            assert settings.baseline is not None
            return loop_session.finish_init(settings.run_dir, ctx_for(settings.baseline), self.ledger.records).to_json()
        return loop_session.finish_run(settings.run_dir, ctx_for, self.ledger.records, settings.finalize).to_json()

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        """One line per gate item: outcome and its key figures (or the reason it skipped/failed)."""
        code = self.ledger.exit_code()
        if self.loop_result is not None:
            code = int(self.loop_result["exit_code"])
        summary(terminalreporter, self.config.get_verbosity(), self.ledger.records, self.comparisons,
                self.loop_result, self.errors, code)
        if self.ahead_log and self.config.get_verbosity() > 0:
            for line in self.ahead_log:
                terminalreporter.write_line(f"kopt champion profile ahead: {line}")

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        """``--kopt-json -``: the document as the very last line of stdout (one line: ``tail -n 1`` reads it)."""
        if self.stdout_doc is not None:
            sys.stdout.write("\n" + self.stdout_doc + "\n")
            sys.stdout.flush()
