"""A multi-shape problem's timing is bounded (issue #41: a GPU MODE problem with 5 benchmark shapes had not finished
its timing items after 230 s on the H200): each shape's alternating rounds share a cap, a party the cap ends says
so (``capped``, per shape in the summary over shapes), an unstable shape is not measured twice past its share, and
the kernel-only pass is held to its budget even when a call's inputs are slow to refresh. Stand-ins for the warm
processes and a stand-in clock; what the H200 does is the GPU run named in the commit."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from pytest_kopt.child import cupti as tm
from pytest_kopt.gates import measure
from pytest_kopt.gates.measure import ROUNDS_CAP_S, Rounds, measure_shape, rounds_cap_s


class Clock:
    """A wall clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    perf_counter = monotonic

    def sleep(self, s: float) -> None:
        self.now += s


def test_the_rounds_cap_is_shared_among_the_benchmark_shapes() -> None:
    assert ROUNDS_CAP_S == 38.0
    assert [rounds_cap_s(n) for n in (1, 2, 5, 10)] == [38.0, 19.0, pytest.approx(7.6), 6.0]


def _party_pool(clock: Clock, stops_after: dict[int, int | None], round_s: float) -> Any:
    """A stand-in pool: party i's process stops by its own rule after ``stops_after[i]`` rounds (None: never);
    every round takes ``round_s`` of wall time."""
    rounds: dict[int, int] = {}

    def run(req: dict[str, Any], **_: Any) -> dict[str, Any]:
        i = int(req["round"]["key"].rsplit("-", 1)[1])
        clock.now += round_s
        if req["round"]["final"]:
            return {"event_ms": [0.1] * 3, "stop_reason": "rounds", "party": i}
        rounds[i] = rounds.get(i, 0) + 1
        done = stops_after[i] is not None and rounds[i] >= stops_after[i]
        return {"event_ms": [0.1] * 3, "stop_reason": "converged" if done else None, "sample_wall_s": 0.001}

    return SimpleNamespace(run=run, rounds=rounds)


def test_a_party_that_never_stops_is_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference's rule never stops it (its refresh is slow, say): with 5 shapes the rounds end after the
    shape's 7.6 s, its final result says ``capped``; the candidate stopped by its own rule keeps its reason."""
    clock = Clock()
    monkeypatch.setattr(measure, "time", clock)
    pool = _party_pool(clock, {0: 3, 1: None}, round_s=0.5)
    ctx = SimpleNamespace(pool=pool, settings=SimpleNamespace(gate_timeout_s=60.0), work=None)
    rounds = Rounds(ctx, [({}, None, "k.py"), ({}, None, "ref.py")], cap_s=rounds_cap_s(5))
    rounds.start(0)
    rounds.start(1)
    t0 = clock.now
    finals = rounds.finish()
    assert [f["stop_reason"] for f in finals] == ["rounds", "capped"]
    assert "rounds_cap_s" not in finals[0] and finals[1]["rounds_cap_s"] == pytest.approx(7.6)
    # the loop ends at the first check past the cap: 7.6 s, plus the round under way and the two finals
    assert 7.6 <= clock.now - t0 <= 7.6 + 0.5 + 2 * 0.5
    assert pool.rounds[1] < 20


def test_parties_that_stop_by_their_own_rule_are_not_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(measure, "time", clock)
    pool = _party_pool(clock, {0: 2, 1: 4}, round_s=0.1)
    ctx = SimpleNamespace(pool=pool, settings=SimpleNamespace(gate_timeout_s=60.0), work=None)
    rounds = Rounds(ctx, [({}, None, "k.py"), ({}, None, "ref.py")])
    rounds.start(0)
    rounds.start(1)
    assert [f["stop_reason"] for f in rounds.finish()] == ["rounds", "rounds"]


def test_a_party_alone_takes_rounds_of_half_the_minimum_sampling_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A branch timed alone (a loop's close) asks its process for 0.1 s of samples per round, half the policy's
    0.2 s minimum: the first round and two more reach the minimum, three memory readings for the LEAK check; two
    parties alternate in rounds of 0.05 s each."""
    asked: list[list[int]] = []
    for parties in (1, 2):
        clock = Clock()
        monkeypatch.setattr(measure, "time", clock)
        counts: list[int] = []
        pool = _party_pool(clock, {0: 3, 1: 3}, round_s=0.1)
        run = pool.run

        def counting(req: dict[str, Any], _run: Any = run, _counts: list[int] = counts, **kw: Any) -> dict[str, Any]:
            if not req["round"]["final"]:
                _counts.append(req["round"]["count"])
            return _run(req, **kw)

        pool.run = counting
        ctx = SimpleNamespace(pool=pool, settings=SimpleNamespace(gate_timeout_s=60.0), work=None)
        rounds = Rounds(ctx, [({}, None, "k.py"), ({}, None, "ref.py")][:parties])
        for i in range(parties):
            rounds.start(i)
        rounds.finish()
        asked.append(counts)
    # 1 ms per sample (the stand-in's sample_wall_s): 3 first, then 100 samples a round alone, 50 each of two
    assert measure.SOLO_ROUND_S == pytest.approx(measure.TIMING["min_time_s"] / 2) == pytest.approx(0.1)
    assert asked[0] == [3, 100, 100]
    assert asked[1] == [3, 3, 50, 50, 50, 50]


def _unstable_result() -> dict[str, Any]:
    """A candidate whose launches' host time exceeds the stream hold in every sample: unstable, with a remedy (a
    longer hold)."""
    spread = [0.1, 0.3, 0.12, 0.28, 0.11, 0.29, 0.1, 0.31, 0.13, 0.27, 0.1, 0.3]
    return {"event_ms": spread, "method": "events", "hold_us": 20.0, "launch_host_us": [80.0] * 12,
            "stop_reason": "budget", "cupti": None}


def _measured(monkeypatch: pytest.MonkeyPatch, shapes: int, took_s: float) -> tuple[Any, int]:
    clock = Clock()
    monkeypatch.setattr(measure, "time", clock)
    calls = []

    def once(ctx: Any, req: dict[str, Any]) -> tuple[Any, ...]:
        calls.append(req["timing"].get("hold_us"))
        clock.now += took_s
        result = _unstable_result()
        basis = {"basis": "events", "kernel": result["event_ms"], "reference": [0.2] * 12, "baseline": None,
                 "note": None}
        return result, {"event_ms": [0.2] * 12}, None, SimpleNamespace(ok=True), basis

    monkeypatch.setattr(measure, "_measure_once", once)
    ctx = SimpleNamespace(benchmarks=tuple({"n": 2 ** i} for i in range(shapes)))
    m = measure_shape(ctx, {"timing": {"hold_us": 0}})
    return m, len(calls)


def test_an_unstable_shape_is_not_measured_twice_past_its_share(monkeypatch: pytest.MonkeyPatch) -> None:
    """Five shapes, a first measurement of 9 s (over the shape's 7.6 s): no second one, and the first attempt says
    why; a single shape is measured again as before."""
    m, measured = _measured(monkeypatch, shapes=5, took_s=9.0)
    assert measured == 1 and m.first_attempt.remeasured == ""
    assert m.first_attempt.causes[-1] == "not measured again: this shape's measurement took 9.0 s of its 7.6 s"
    m, measured = _measured(monkeypatch, shapes=1, took_s=9.0)
    assert measured == 2 and m.first_attempt.remeasured.startswith("with a ")
    m, measured = _measured(monkeypatch, shapes=5, took_s=3.0)  # within its share: measured again
    assert measured == 2


def _stand_in_timer(monkeypatch: pytest.MonkeyPatch, refresh_us: float, kernel: tuple[str, float]) -> Any:
    """A timer over the host-work tests' stand-in GPU and CUPTI (cupti-python's client, the stand-in's clock as
    time.perf_counter): two input sets whose refresh takes ``refresh_us`` on the host, a 20 µs flush, a 30 µs hold,
    and a call that launches ``kernel`` (name, µs)."""
    from tests.test_host_work import StandInGpu

    gpu = StandInGpu()
    monkeypatch.setattr(tm, "_BACKEND", {"name": "cupti-python", "activity": gpu, "note": None, "warm_s": 0.0})
    monkeypatch.setattr(tm, "time", SimpleNamespace(perf_counter=lambda: gpu.clock / 1e6))
    return SimpleNamespace(
        torch=SimpleNamespace(cuda=SimpleNamespace(synchronize=gpu.synchronize)), sets=["s0", "s1"], hold_us=30.0,
        t={}, flush=lambda: gpu.launch("flush", 20.0), hold=lambda us: gpu.launch("spin", us),
        refresh=lambda s, k: gpu.host(refresh_us), launch=lambda s: gpu.launch(*kernel))


def test_slow_refreshes_keep_the_kernel_only_pass_near_its_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 10 µs kernel whose inputs take 60 ms to refresh (a problem's own generator on the host): the first batch is
    sized by the call's wall time (5 calls, not 50: 3 s), and each later batch by the budget left, so the pass ends
    near CUPTI's 1.5 s budget instead of running batch after batch past it."""
    timer = _stand_in_timer(monkeypatch, refresh_us=60_000.0, kernel=("scan", 10.0))
    assert tm.cupti_calls(0.01) == 50 and tm.cupti_calls(0.01, 61.0) == 5
    got = tm.cupti_samples(timer, 0.01, 61.0)
    # 5 + 20 + 5 calls (the third batch cut from 25 to what the budget left, at least 5); unbounded, 50 + 20 + 25
    assert (got["batches"], got["calls"], got["spans_us"][0]) == (3, 30, 10.0)
    assert got["profile_s"] <= tm.CUPTI["budget_s"] + 5 * 0.062, got["profile_s"]


def test_later_kernel_only_batches_are_as_long_as_the_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 150 µs kernel (the throughput benchmark's SGEMM at 1024^3): three batches of 50 calls (the first sized by
    :func:`cupti_calls`, the others as long), 150 calls where doubling batches profiled 200, each call's span the
    kernel's own."""
    timer = _stand_in_timer(monkeypatch, refresh_us=50.0, kernel=("sgemm", 150.0))
    got = tm.cupti_samples(timer, 0.15, 0.6)
    assert (got["batches"], got["calls"], got["stop_reason"]) == (3, 150, "converged")
    assert set(got["spans_us"]) == {150.0}
    assert got["records"] == 150 + 3 * 50 * 2 and set(got["times_s"]) == {"names", "capture", "split"}
    # the parts of all three batches: the calls alone (150 x (spin + flush + kernel) of GPU time, on this clock)
    # are in the capture's sum, and the flush recorded alone in the names'
    assert got["times_s"]["capture"] >= 150 * (150.0 + 20.0) / 1e6 and got["times_s"]["names"] > 0
    assert 0 <= got["times_s"]["split"] and sum(got["times_s"].values()) <= got["profile_s"]
