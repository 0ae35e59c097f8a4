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


def _timer(extra_ms: Callable[[int], float]) -> timer.Timer:
    """A Timer whose every figure but the probe is set: call ``i`` (counted over all probes) costs the host
    ``extra_ms(i)`` beyond nothing; calibration says a launch and a synchronise round trip cost nothing."""
    t = object.__new__(timer.Timer)
    calls = [0]

    def launch(_s: object) -> None:
        wait = extra_ms(calls[0])
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
    out = _timer(lambda i: 0.0).result("converged")
    assert len(out["host_probes_ms"]) == 1 and len(out["host_ms"]) == timer.probe_calls(EVENTS_MS)
    assert not host_gap_exceeds(_gap(out), EVENTS_MS) and host_gap(_gap(out), 0.0, EVENTS_MS) == []


def test_a_gap_in_the_first_probe_only_is_taken_again_and_the_smaller_reported() -> None:
    """The H100 close's SUSPECT branch: every call of one probe at about 0.1 ms (others' driver work beside it)."""
    n = timer.probe_calls(EVENTS_MS)
    out = _timer(lambda i: 0.1 if i < n else 0.0).result("converged")
    first, second = out["host_probes_ms"]
    assert first >= 0.1 > 0.02 > second
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
