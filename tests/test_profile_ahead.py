"""The ncu item's profile started ahead (pytest_kopt.scheduler.Scheduler.profile_ahead, the sets of
pytest_kopt.gates.ncu.sets_ahead): its go file, its owner, the set it was started with, and the estimate that picks
the set. The profile itself needs ncu and a GPU
(test_plugin.py::test_gpu_profile_started_ahead_is_used)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_kopt.child import HarnessError
from pytest_kopt.child import profile
from pytest_kopt.gates import ncu
from pytest_kopt.proc.pool import HarnessPool
from pytest_kopt.scheduler import Scheduler


TOKEN = "3f2a"
SHA = hashlib.sha256(TOKEN.encode()).hexdigest()


def test_wait_for_go_returns_once_the_file_holds_its_token(tmp_path: Path) -> None:
    go = tmp_path / "go"
    threading.Timer(0.05, lambda: go.write_text(TOKEN)).start()
    profile.wait_for_go(str(go), 0, SHA, timeout_s=30.0)
    assert go.read_text() == TOKEN


def test_a_go_file_the_kernel_writes_lets_nothing_run(tmp_path: Path) -> None:
    """The kernel's processes work in the same folder and can read the request (the go file's path and the token's
    hash): a go file without the token the gate writes under the GPU lock is ignored, so the profile cannot be
    released to run the kernel beside another measurement."""
    go = tmp_path / "go"
    go.touch()
    with pytest.raises(HarnessError, match="waited 0.2 s for its turn"):
        profile.wait_for_go(str(go), 0, SHA, timeout_s=0.2)
    go.write_text(SHA)  # the hash itself is not the token
    with pytest.raises(HarnessError, match="waited 0.2 s for its turn"):
        profile.wait_for_go(str(go), 0, SHA, timeout_s=0.2)
    go.write_text(TOKEN)
    profile.wait_for_go(str(go), 0, SHA, timeout_s=30.0)


def test_wait_for_go_ends_when_its_owner_has_ended(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pytest process killed while its profile waits: the profile ends (its ncu writes no report) instead of
    waiting for a go that can never come."""
    monkeypatch.setattr(profile, "OWNER_POLL_S", 0.0)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    with pytest.raises(HarnessError, match="pytest process that started this profile ended"):
        profile.wait_for_go(str(tmp_path / "never"), gone.pid, SHA, timeout_s=30.0)


def test_wait_for_go_gives_up_after_its_timeout(tmp_path: Path) -> None:
    with pytest.raises(HarnessError, match="waited 0.05 s for its turn"):
        profile.wait_for_go(str(tmp_path / "never"), 0, SHA, timeout_s=0.05)


def _ctx(tmp_path: Path, collected: frozenset[str] = frozenset({"ncu"}), gpu: bool = True,
         ncu_set: str | None = None) -> SimpleNamespace:
    outdir = tmp_path / "out"
    return SimpleNamespace(kernel=tmp_path / "k.cu", outdir=outdir, collected=collected,
                           gpu={"uuid": "GPU-x"} if gpu else None, tool=lambda name: "/bin/ncu",
                           settings=SimpleNamespace(ncu_set=ncu_set), benchmarks=({"n": 1},))


def _record(folder: Path, name: str, **fields: object) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps(fields))


def _seeds(monkeypatch: pytest.MonkeyPatch, labels: tuple[str, ...] = ("seed=1", "seed=2", "seed=3", "seed=4",
                                                                         "seed=5")) -> None:
    """This session's cases: the seeds ``labels`` at the session's dims and one boundary shape; a record's
    fingerprint is its label's (``fp-<label>``), as a record of this build has."""
    monkeypatch.setattr(ncu, "cases", lambda ctx: [(lb, {"seed": lb, "dims": None}) for lb in labels]
                        + [("n=1", {"seed": "seed=1", "dims": {"n": 1}})])
    monkeypatch.setattr(ncu, "fingerprint", lambda ctx, res, case, device: f"fp-{case['seed']}-{device}")
    monkeypatch.setattr(ncu, "built", lambda ctx: SimpleNamespace(artifact="k.so"))


def _passed(folder: Path, label: str, call_ms: float | None, fp: str | None = None, passed: bool = True) -> None:
    fields: dict[str, object] = {"passed": passed, "fingerprint": fp or f"fp-{label}-cuda"}
    if call_ms is not None:
        fields["call_ms"] = call_ms
    _record(folder, label, **fields)


def test_the_estimate_is_the_fastest_passed_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The set is picked from the smallest warm call of this session's passed seeds (an upper bound of the
    kernel's time); a failed seed's call, a record without a call time, a boundary shape's, another session's
    seed's and an earlier build's (another fingerprint) do not count."""
    _seeds(monkeypatch)
    ctx = _ctx(tmp_path)
    assert ncu.estimated_ms(ctx) is None
    folder = ctx.outdir / "correctness"
    _passed(folder, "seed=1", 12.5)
    _passed(folder, "seed=2", 11.0)
    _passed(folder, "seed=3", 0.5, passed=False)
    _passed(folder, "seed=4", None)
    _passed(folder, "n=1", 0.01)
    _passed(folder, "seed=99", 0.02)  # an earlier session's seed
    _passed(folder, "seed=5", 0.03, fp="fp-of-an-earlier-build")
    assert ncu.estimated_ms(ctx) == 11.0
    assert ncu.choose_set(ncu.estimated_ms(ctx))[0] == "light"
    _passed(folder, "seed=5", 9.5)
    assert ncu.choose_set(ncu.estimated_ms(ctx))[0] == "full"


@pytest.mark.parametrize("why", ["no ncu item", "no GPU", "no estimate", "ncu item ran"])
def test_nothing_starts_ahead_without_an_ncu_item_a_gpu_or_a_set(tmp_path: Path, why: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    _seeds(monkeypatch)
    ctx = _ctx(tmp_path, collected=frozenset({"timing"}) if why == "no ncu item" else frozenset({"ncu"}),
               gpu=why != "no GPU")
    ahead = Scheduler(HarnessPool())
    if why == "ncu item ran":
        _passed(ctx.outdir / "correctness", "seed=1", 2.0)
        assert ahead.take_profile(ctx, "full") == (None, "none started")
    assert ahead.profile_ahead(ctx) == ()
    assert ahead.profile_ahead(ctx, early=why != "no estimate") == ()
    assert ahead._profiles == {}


def test_started_at_the_first_seed_with_both_sets_then_narrowed_by_the_estimate(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The build's thread starts the profile before any seed has a call time: both sets, since either may be the
    one the ncu item picks. The timing gate keeps both while the seeds' estimate is near the 10 ms threshold (12
    ms); at 25 ms (light) it ends the full set's process and keeps the light one running; an early call starts
    nothing new and ends nothing. A failed seed ends them all, and none starts again."""
    started: list[str] = []

    def launch(ctx: SimpleNamespace, set_name: str, dims: object) -> ncu.ProfileAhead:
        started.append(set_name)  # the scheduler launches a set's process only when none of it runs
        return ncu.ProfileAhead(_Proc(True), tmp_path / set_name, time.time())

    monkeypatch.setattr(ncu, "launch_profile", launch)
    _seeds(monkeypatch)
    ctx = _ctx(tmp_path)
    ahead = Scheduler(HarnessPool())
    assert ahead.profile_ahead(ctx, early=True) == ("full", "light")
    full = ahead._profiles[(str(ctx.kernel), "full")].proc
    _passed(ctx.outdir / "correctness", "seed=1", 12.0)  # near the 10 ms threshold: both kept
    assert ahead.profile_ahead(ctx) == ("light",) and not full.killed
    _passed(ctx.outdir / "correctness", "seed=1", 25.0)
    assert ahead.profile_ahead(ctx, early=True) == ("light",)
    assert not full.killed  # an early call ends nothing
    assert ahead.profile_ahead(ctx) == ("light",)
    assert full.killed and list(ahead._profiles) == [(str(ctx.kernel), "light")]
    assert started == ["full", "light"]
    ahead.abandon_profiles(ctx)  # a seed failed: the ncu item is blocked
    assert ahead._profiles == {} and ahead.profile_ahead(ctx, early=True) == ()


def test_a_pinned_set_starts_alone_even_early(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ncu, "launch_profile", lambda ctx, set_name, dims: ncu.ProfileAhead(
        _Proc(True), tmp_path / set_name, time.time()) if set_name == "light" else None)
    ahead = Scheduler(HarnessPool())
    assert ahead.profile_ahead(_ctx(tmp_path, ncu_set="light"), early=True) == ("light",)


class _Proc:
    def __init__(self, alive: bool) -> None:
        self.running = alive
        self.killed = False
        self.proc = SimpleNamespace(returncode=None if alive else 1)

    def alive(self) -> bool:
        return self.running

    def kill(self) -> str:
        self.killed = True
        self.running = False
        return "Traceback: no GPU"


def test_the_gate_takes_the_profile_of_its_set_and_ends_the_others(tmp_path: Path) -> None:
    """Timed at 9 ms the profile was started with the full set; a median of 12 ms picks the light one: the full
    set's process is ended and the gate starts its own. One that ended while it waited is never used."""
    ctx = _ctx(tmp_path)
    ahead = Scheduler(HarnessPool())
    full, light, other = _Proc(True), _Proc(True), _Proc(True)
    key = str(ctx.kernel)
    ahead._profiles = {(key, "full"): ncu.ProfileAhead(full, tmp_path / "g1", time.time()),
                       (key, "light"): ncu.ProfileAhead(light, tmp_path / "g2", time.time()),
                       ("/other.cu", "full"): ncu.ProfileAhead(other, tmp_path / "g3", time.time())}
    taken, note = ahead.take_profile(ctx, "light")
    assert taken is not None and taken.proc is light and not light.killed and note == "used"
    assert full.killed and not other.killed
    assert list(ahead._profiles) == [("/other.cu", "full")]
    dead = _Proc(False)
    ahead._profiles = {(key, "light"): ncu.ProfileAhead(dead, tmp_path / "g4", time.time())}
    taken, note = ahead.take_profile(ctx, "light")
    assert taken is None and dead.killed and ahead._profiles == {}
    assert note.startswith("ended before its turn (exit 1): ") and note.endswith("Traceback: no GPU"), note
    ahead._profiles = {(key, "full"): ncu.ProfileAhead(_Proc(True), tmp_path / "g5", time.time())}
    assert ahead.take_profile(ctx, "light") == (None, "started with the full set")
    assert ahead.take_profile(ctx, "light") == (None, "none started")


def test_profile_phases_of_a_profile_started_ahead() -> None:
    """From the go on: ``start`` is what the process still needed after the gate let it go (0 when it was
    waiting), ``inputs`` runs from its go."""
    at = {"enter": 100.0, "go": 110.5, "inputs": 111.0, "warmup": 111.1, "range": 113.1, "exit": 113.2}
    got = ncu.profile_phases(109.0, 110.0, 113.9, 114.0, at)
    assert got == {"lock": 1.0, "start": 0.5, "inputs": 0.5, "warmup": 0.1, "range": 2.0, "after": 0.8,
                   "read": 0.1}
    at_ready = {**at, "go": 110.002}
    assert ncu.profile_phases(109.0, 110.0, 113.9, 114.0, at_ready)["start"] == pytest.approx(0.002)


def test_a_profile_started_ahead_runs_once_the_gate_releases_it(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole go protocol between the gate and its process, with a stand-in for ncu that waits the way the
    profile mode does (the real one needs a GPU): started by the scheduler's start_profile, the process waits;
    released, it runs and its result is read."""
    fake = tmp_path / "ncu"
    fake.write_text(
        "#!/bin/sh\n"
        "for last; do :; done\n"  # the request file: the last argument after ncu's and Python's
        f'exec {sys.executable} -c "import json, sys; from pytest_kopt.child.profile import wait_for_go; '
        "req = json.load(open(sys.argv[1])); wait_for_go(req['go'], req['owner'], req['go_sha'], 60.0); "
        "open(req['out'] + '.json', 'w').write(json.dumps({'ok': True, 'at': {'released': 1}}))\" \"$last\"\n")
    fake.chmod(0o755)
    ctx = _ctx(tmp_path)
    ctx.tool = lambda name: str(fake)
    ctx.work = tmp_path / "work"
    monkeypatch.setattr(ncu, "built", lambda c: SimpleNamespace(artifact="k.so"))
    monkeypatch.setattr(ncu, "_profile_request", lambda c, res, device, dims: {"mode": "profile", "env": {}})
    scheduler = Scheduler(HarnessPool())
    assert scheduler.start_profile(ctx, "full", None) is True
    ahead = scheduler._profiles[(str(ctx.kernel), "full")]
    req = json.loads(next(ctx.work.glob("ncu-*.req.json")).read_text())
    assert ahead.token and req["go_sha"] == hashlib.sha256(ahead.token.encode()).hexdigest()
    assert ahead.token not in json.dumps(req)  # the kernel's processes can read the request, not the token
    time.sleep(0.5)
    assert ahead.proc.alive()  # waiting for its go
    ahead.release()
    result = ahead.proc.finish(timeout_s=60.0, path="k.cu")
    assert result["ok"] is True and result["at"] == {"released": 1}


def test_the_build_thread_starts_the_profile_once_the_kernel_is_built(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The profile needs the built library, and nothing else the items make: the scheduler starts it right after
    the build, in the build's thread, for a kernel this process runs the ncu item of; once per kernel, also when
    its build began before the process knew its items (the early build at configure); never for another kernel."""
    from pytest_kopt import scheduler
    from pytest_kopt.kinds.builtin import default_kinds

    events: list[tuple[str, str]] = []
    monkeypatch.setattr(scheduler, "ensure_built", lambda c: events.append(("built", c.kernel.name)) or
                        SimpleNamespace(artifact="k.so", cache_hit=True))
    ahead = Scheduler(HarnessPool())
    monkeypatch.setattr(ahead, "profile_ahead", lambda c, early=False: events.append(("profile" if early else
                                                                                      "late", c.kernel.name))
                        or ("full", "light"))
    cuda = default_kinds().by_name("cuda")
    ctxs = [SimpleNamespace(kind=cuda, tool=lambda name: "/bin/nvcc", kernel=tmp_path / n, arch="sm_90a")
            for n in ("a.cu", "b.cu")]
    assert ahead.start_builds(ctxs) == 2  # as at configure: the items are not known yet
    assert ahead.start_builds(ctxs, profile=frozenset({ctxs[0].kernel})) == 0  # a's first item: its build had begun
    assert ahead.start_builds(ctxs, profile=frozenset({ctxs[0].kernel})) == 0
    ahead.shutdown()
    assert sorted(events) == [("built", "a.cu"), ("built", "a.cu"), ("built", "b.cu"), ("profile", "a.cu")]
    assert events.index(("profile", "a.cu")) > events.index(("built", "a.cu"))


def _close(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, started: list[str], ended: list[str],
           shapes: dict[str, tuple[dict[str, int], ...]] | None = None,
           branches: tuple[str, ...] = ("b1", "b2", "b3")) -> tuple[Any, Scheduler]:
    """A loop close's controller (LoopPlugin, which hands each branch's record to the scheduler) over a scheduler
    whose profile starts and ends are recorded (``start_profile``, ``end_profiles``) in its own ``_profiles``; the
    session judges ``branches`` of iterv1 and an ablation."""
    from pytest_kopt.gates.builtin import default_table
    from pytest_kopt.plugin.loop import LoopPlugin

    ahead = Scheduler(HarnessPool())
    profiles: dict[tuple[str, str], Any] = ahead._profiles  # the profiles started ahead (start_profile, end_profiles)
    monkeypatch.setattr(ahead, "start_profile", lambda ctx, set_name, dims: started.append(ctx.kernel.parent.name)
                        or profiles.setdefault((str(ctx.kernel), set_name), object()) is not None)
    monkeypatch.setattr(ahead, "end_profiles", lambda kernel, keep=(): ended.append(kernel.parent.name)
                        or [profiles.pop(k) for k in list(profiles) if k[0] == str(kernel)])
    settings = SimpleNamespace(ncu_set="light", loop_mode="run", run_dir=tmp_path)
    kernels = frozenset([tmp_path / "iterv1" / "branches" / b / "kernel.cu" for b in branches]
                        + [tmp_path / "iterv1" / "ablations" / "m" / "kernel.cu"])
    state = SimpleNamespace(settings=settings, env={"gpu": {"uuid": "x"}}, gates=default_table(), ahead=ahead,
                            kernels=kernels,
                            context=lambda config, kernel, display: SimpleNamespace(
                                kernel=kernel, settings=settings, gpu=True,
                                benchmarks=(shapes or {}).get(kernel.parent.name, ({"n": 1},))))
    return LoopPlugin(SimpleNamespace(), state), ahead


def test_a_close_profiles_each_branch_from_its_first_passed_seed_and_ends_the_slower(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In a loop's close the controller starts a branch's profile at its first passed correctness seed, so a
    champion timed last finds its profile as ready as one timed first (on the H200 the champion timed last had
    started 0.6 s before its profile, which then needed 3.9 s more). A branch timed slower than the fastest so
    far, one whose correctness fails, and a former leader overtaken have theirs ended; ablations are not branches;
    a skipped SASS item and a failed sanitizer item rule out nothing (the decision reads compile, correctness and
    timing)."""
    started: list[str] = []
    ended: list[str] = []
    plugin, ahead = _close(tmp_path, monkeypatch, started, ended)
    run = tmp_path / "iterv1"

    def rec(kernel: str, gate: str, outcome: str = "passed", median: float | None = None,
            case: str | None = None) -> SimpleNamespace:
        return SimpleNamespace(kernel=str(run / kernel / "kernel.cu"), gate=gate, outcome=outcome, case=case,
                               figures={"median_ms": median} if median else {})

    for r in (rec("branches/b1", "correctness", case="seed=1"), rec("branches/b2", "correctness", case="seed=1"),
              rec("branches/b3", "correctness", case="seed=1"), rec("ablations/m", "correctness", case="seed=1"),
              rec("branches/b1", "correctness", case="seed=2"), rec("branches/b3", "sass", "skipped"),
              rec("branches/b2", "sanitizer", "failed")):
        plugin.on_record(r)
    assert started == ["b1", "b2", "b3"] and ended == []
    plugin.on_record(rec("branches/b3", "correctness", "failed", case="seed=2"))
    assert ended == ["b3"]
    plugin.on_record(rec("branches/b2", "timing", median=17.0))
    plugin.on_record(rec("branches/b1", "timing", median=15.6))  # timed last, and the fastest
    assert ended == ["b3", "b2"] and ahead._branches.leader == (15.6, run / "branches/b1" / "kernel.cu")
    assert ahead.profiling == {run / "branches/b1" / "kernel.cu"} and started == ["b1", "b2", "b3"]
    assert [ln for ln in ahead.ahead_log if "ended" in ln] == [
        "b3: profile ended (correctness failed)", "b2: profile ended (slower than b1 (15.6000 ms))"]


def test_a_branch_over_the_cap_starts_once_a_profile_ends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """At most PROFILES_AHEAD profiles wait at once, another kernel's among them; a branch refused at the cap is
    tried again at its next passed item, so when it is timed fastest (the old leader's profile ended) it gets one. A
    kernel of several benchmark shapes gets none: the profile is of its first shape."""
    from pytest_kopt import scheduler

    monkeypatch.setattr(scheduler, "PROFILES_AHEAD", 3)
    started: list[str] = []
    plugin, ahead = _close(tmp_path, monkeypatch, started, [], shapes={"b9": ({"n": 1}, {"n": 2})},
                           branches=("b1", "b2", "b9"))
    for other in ("x.cu", "y.cu"):  # profiles of two other kernels, waiting
        ahead._profiles[(str(tmp_path / other), "light")] = object()

    def rec(name: str, gate: str, median: float | None = None) -> SimpleNamespace:
        return SimpleNamespace(kernel=str(tmp_path / "iterv1" / "branches" / name / "kernel.cu"), gate=gate,
                               outcome="passed",
                               case=None if gate == "timing" else "seed=1",
                               figures={"median_ms": median} if median else {})

    for name in ("b1", "b2", "b9"):
        plugin.on_record(rec(name, "correctness"))
    assert started == ["b1"]  # b2 refused at the cap (x, y and b1 waiting), b9 has several shapes
    plugin.on_record(rec("b1", "timing", 20.0))
    plugin.on_record(rec("b2", "timing", 10.0))  # the fastest: b1's profile ends, b2's starts
    assert started == ["b1", "b2"]
    assert sorted(k.parent.name if k.name == "kernel.cu" else k.name for k in ahead.profiling) == \
        ["b2", "x.cu", "y.cu"]


def test_a_close_of_more_branches_than_the_cap_profiles_only_the_fastest_timed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A close of more branches than PROFILES_AHEAD starts no profile at the seeds: only the fastest branch timed so
    far gets one, at its timing, and an overtaken leader's ends (a close of 32 branches had started 20 profiles at
    their seeds and used one)."""
    started: list[str] = []
    ended: list[str] = []
    names = tuple(f"b{i}" for i in range(1, 7))
    plugin, ahead = _close(tmp_path, monkeypatch, started, ended, branches=names)

    def rec(name: str, gate: str, median: float | None = None) -> SimpleNamespace:
        return SimpleNamespace(kernel=str(tmp_path / "iterv1" / "branches" / name / "kernel.cu"), gate=gate,
                               outcome="passed", case=None if gate == "timing" else "seed=1",
                               figures={"median_ms": median} if median else {})

    for name in names:
        plugin.on_record(rec(name, "correctness"))
    assert started == [] and ahead.profiling == set()
    plugin.on_record(rec("b3", "timing", 0.30))
    assert started == ["b3"]
    plugin.on_record(rec("b1", "timing", 0.40))  # slower: nothing starts
    plugin.on_record(rec("b5", "timing", 0.14))  # the fastest now: b3's ends, b5's starts
    assert started == ["b3", "b5"] and ended == ["b3"]  # b1 had none to end
    assert {k.parent.name for k in ahead.profiling} == {"b5"}
