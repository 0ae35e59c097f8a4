"""The side-stream probe (pytest_kopt.child.timer.Timer.result): a probe that shows a host gap is taken again, and
the smallest is reported, so another process's passing driver work does not make an honest call SUSPECT while a
call's own work on another stream, which is in every probe, still does. The calls run on a stand-in here: the host
clock is real, each call sleeps the time a schedule gives it, and the synchronise is free."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Callable

from pytest_kopt.child import timer
from pytest_kopt.child.samples import host_gap_exceeds, host_gap_ms, median
from pytest_kopt.gates.suspects import host_gap

EVENTS_MS = 0.012  # an honest 12 µs call's event median (the Triton softmax branches of 2026-12-07)


def _timer(cost_ms: Callable[[int], float]) -> timer.Timer:
    """A Timer whose every figure but the probe is set: synchronised call ``i`` (counted over all probes) takes the
    host ``cost_ms(i)`` (an honest call: its events' :data:`EVENTS_MS`); calibration says a launch and a
    synchronise round trip cost nothing."""
    t = object.__new__(timer.Timer)
    calls = [0]

    def launch(_s: object) -> None:
        wait = cost_ms(calls[0])
        calls[0] += 1
        if wait:
            end = time.perf_counter() + wait / 1e3
            while time.perf_counter() < end:  # a busy wait: sleep() overshoots by more than the gap judged
                pass

    t.torch = SimpleNamespace(cuda=SimpleNamespace(synchronize=lambda: None))
    t.sets, t.launch, t.event_ms = [object()], launch, [EVENTS_MS] * 50
    t.host_launch_ms, t.host_overhead_ms, t.elapsed_s, t.phase_s = 0.0, 0.0, 0.0, {}
    t.throttled, t.launch_host_us, t.readings, t.l2, t.warmup_calls, t.warmup = [], [], [], 0, 0, {}
    t.host_launch_us, t.hold_us, t.memory, t.peak_call, t.memory_note = 0.0, 0.0, [], {}, None
    t.clocks = SimpleNamespace(other_processes=lambda: [])
    return t


def _gap(result: dict) -> float:
    return host_gap_ms(median(result["host_ms"]), EVENTS_MS, 0.0, 0.0)


def test_a_clean_probe_is_taken_once() -> None:
    out = _timer(lambda i: EVENTS_MS).result("converged")
    assert len(out["host_probes_ms"]) == 1 and len(out["host_ms"]) == timer.probe_calls(EVENTS_MS)
    assert not host_gap_exceeds(_gap(out), EVENTS_MS) and host_gap(_gap(out), 0.0, EVENTS_MS) == []


def test_a_gap_in_the_first_probe_only_is_taken_again_and_the_smaller_reported() -> None:
    """The H100 close's SUSPECT branch: every call of one probe at about 0.1 ms (others' driver work beside it)."""
    n = timer.probe_calls(EVENTS_MS)
    out = _timer(lambda i: 0.1 if i < n else EVENTS_MS).result("converged")
    first, second = out["host_probes_ms"]
    assert first >= 0.1 > 0.02 > second >= EVENTS_MS
    assert median(out["host_ms"]) == second
    assert host_gap(_gap(out), median(out["host_ms"]), EVENTS_MS) == []


def test_work_on_another_stream_in_every_probe_stays_suspect() -> None:
    """A call whose real work runs where its events do not see it: every probe shows it, all are taken, and the
    suspect rule still fires on the smallest."""
    out = _timer(lambda i: 0.1).result("converged")
    assert len(out["host_probes_ms"]) == 1 + timer.PROBE_RETRIES
    assert min(out["host_probes_ms"]) >= 0.1
    (finding,) = host_gap(_gap(out), median(out["host_ms"]), EVENTS_MS)
    assert finding[0].startswith("the host clock (synchronised) saw 0.1")


def test_calls_that_skip_their_side_work_after_the_retrys_pause_are_not_let_through() -> None:
    """A call that does its side-stream work in every call but skips all its work once it sees a pause (the
    retry's wait) gives lazy later probes, under the events: the probe that did the work is reported, and stays
    SUSPECT."""
    n = timer.probe_calls(EVENTS_MS)
    out = _timer(lambda i: 0.1 if i < n else 0.0).result("converged")
    assert len(out["host_probes_ms"]) == 1 + timer.PROBE_RETRIES and min(out["host_probes_ms"]) < 0.8 * EVENTS_MS
    assert median(out["host_ms"]) >= 0.1  # the probe that did the work
    (finding,) = host_gap(_gap(out), median(out["host_ms"]), EVENTS_MS)
    assert finding[0].startswith("the host clock (synchronised) saw 0.1")


def test_probed_calls_under_the_timed_calls_events_are_suspect() -> None:
    """Every probe's calls under the timed calls' events: they did less when probed than when timed. Honest calls
    never are (host over events 0.996 at least over 460 H100 timings): a 25 ms kernel's 25.26 ms probe against its
    25.36 ms events passes."""
    from pytest_kopt.gates.suspects import host_under_events

    (finding,) = host_under_events(0.004, 0.05)
    assert finding[0].startswith("the host clock (synchronised) saw 4.00 µs per call, under the 50.00 µs")
    assert host_under_events(25.2596, 25.3562) == [] and host_under_events(0.1016, 0.0122) == []


def test_a_candidate_that_rebinds_the_probe_or_its_rule_in_its_process_is_seen_or_judged_outside_it() -> None:
    """The probe and its gap rule run in the candidate's timing process: rebinding ``Timer._probe`` or
    ``host_gap_exceeds`` there is listed by the sentinels (TAMPERED); the module's thresholds are plain numbers the
    sentinels do not watch, but the verdict reads the pytest process's own (``suspects.host_gap`` and
    ``host_under_events``), so a candidate that lowers ``timer.HOST_UNDER_EVENTS`` to report a lazy probe is still
    SUSPECT."""
    import pytest_kopt.child.protocol  # noqa: F401  (the harness's modules, loaded as in a harness process)
    from pytest_kopt.child import samples, sentinels
    from pytest_kopt.gates.suspects import host_under_events

    guard = sentinels.Sentinels().take().guard()
    saved = (timer.Timer._probe, samples.host_gap_exceeds, timer.HOST_UNDER_EVENTS)
    try:
        timer.Timer._probe = lambda self, events: [0.0]
        samples.host_gap_exceeds = lambda gap, events: False
        got = guard.changed()
        timer.Timer._probe, samples.host_gap_exceeds = saved[:2]
        timer.HOST_UNDER_EVENTS = 0.0  # in the candidate's process: its lazy probe is the one reported
        n = timer.probe_calls(EVENTS_MS)
        out = _timer(lambda i: 0.1 if i < n else 0.0).result("converged")
    finally:
        timer.Timer._probe, samples.host_gap_exceeds, timer.HOST_UNDER_EVENTS = saved
    assert {"pytest_kopt.child.timer.Timer._probe", "pytest_kopt.child.samples.host_gap_exceeds"} <= set(got), got
    assert median(out["host_ms"]) < 0.8 * EVENTS_MS  # the lazy probe got through the candidate's process...
    (finding,) = host_under_events(median(out["host_ms"]), EVENTS_MS)  # ...and the verdict, outside it, reads it
    assert "did less work when not timed" in finding[0]
