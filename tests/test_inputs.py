"""Tests for pytest_kopt.gates.inputs: hypothesis-drawn input plans, seed derivation and fresh session seeds."""

from __future__ import annotations

import json

import pytest

from pytest_kopt.gates.inputs import DEFAULT_REGIMES, FORMAT_REGIMES, REGIMES, draw_plan
from pytest_kopt.seeds import derive_seeds, fresh_session_seed

PARAMS = ("scale", "int_lo", "int_hi", "decades")


def params(plan: dict) -> tuple:
    return tuple(plan[k] for k in PARAMS)


def test_regime_tables():
    assert REGIMES == ("normal", "uniform", "small_int", "wide", "problem")
    assert DEFAULT_REGIMES == ("normal", "uniform", "small_int")
    # a KernelBench or GPU MODE problem: its own inputs first (seeds 1 and 5 of five), then kopt's at their shapes
    assert FORMAT_REGIMES == ("problem", "normal", "uniform", "small_int")
    assert [draw_plan(7, i, FORMAT_REGIMES)["regime"] for i in range(5)] == [*FORMAT_REGIMES, "problem"]


# -- draw_plan -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", [0, 1, 12345, 2**31 - 1])
def test_draw_plan_deterministic(seed):
    assert draw_plan(seed, 0) == draw_plan(seed, 0)
    assert draw_plan(seed, 4, REGIMES) == draw_plan(seed, 4, REGIMES)


def test_draw_plan_keys_and_json():
    plan = draw_plan(7, 0)
    assert set(plan) == {"scale", "int_lo", "int_hi", "decades", "regime"}
    assert json.loads(json.dumps(plan)) == plan
    assert type(plan["scale"]) is float
    assert all(type(plan[k]) is int for k in ("int_lo", "int_hi", "decades"))


@pytest.mark.parametrize(("index", "regime"), [
    (0, "normal"), (1, "uniform"), (2, "small_int"), (3, "normal"), (4, "uniform"), (5, "small_int"),
])
def test_default_regimes_cycle_with_index(index, regime):
    assert draw_plan(11, index)["regime"] == regime


def test_custom_regimes_respected():
    regimes = ("wide", "small_int")
    assert [draw_plan(3, i, regimes)["regime"] for i in range(5)] == ["wide", "small_int", "wide", "small_int", "wide"]
    assert [draw_plan(3, i, ("uniform",))["regime"] for i in range(3)] == ["uniform"] * 3


def test_regime_does_not_change_the_drawn_parameters():
    # the parameters come from the seed alone; the index only picks the regime
    assert len({params(draw_plan(5, i)) for i in range(3)}) == 1


@pytest.mark.parametrize("seed", range(12))
def test_draw_plan_parameter_ranges(seed):
    plan = draw_plan(seed, seed)
    assert 0.5 <= plan["scale"] <= 1.0
    assert -8 <= plan["int_lo"] <= -1
    assert 1 <= plan["int_hi"] <= 8
    assert 1 <= plan["decades"] <= 3


def test_draw_plan_scale_rounded_to_six_digits():
    for seed in range(5):
        s = draw_plan(seed, 0)["scale"]
        assert round(s, 6) == s


@pytest.mark.parametrize("regimes", [("normal", "gaussian"), ("Normal",), ("bogus",)])
def test_unknown_regime_raises(regimes):
    with pytest.raises(ValueError, match="unknown value regime"):
        draw_plan(0, 0, regimes)


def test_different_seeds_give_different_parameters():
    sets = {params(draw_plan(seed, 0)) for seed in range(5)}
    assert len(sets) >= 2


def test_different_seeds_give_different_scales():
    # hypothesis' first example is the minimal one for every seed; the plan must not be it for all seeds
    assert len({draw_plan(seed, 0)["scale"] for seed in range(5)}) >= 2


# -- derive_seeds --------------------------------------------------------------------------------------------------

def test_derive_seeds_deterministic():
    assert derive_seeds(42, 8) == derive_seeds(42, 8)


def test_derive_seeds_count_unique_and_range():
    seeds = derive_seeds(42, 50)
    assert isinstance(seeds, tuple)
    assert len(seeds) == 50
    assert len(set(seeds)) == 50
    assert all(type(s) is int and 0 <= s < 2**31 for s in seeds)


def test_derive_seeds_prefix_stable():
    # asking for more seeds extends the list, so a shorter run replays the start of a longer one
    assert derive_seeds(9, 10)[:3] == derive_seeds(9, 3)


@pytest.mark.parametrize("count", [0, 1, 3])
def test_derive_seeds_small_counts(count):
    assert len(derive_seeds(1, count)) == count


def test_derive_seeds_differ_between_session_seeds():
    a, b, c = derive_seeds(1, 5), derive_seeds(2, 5), derive_seeds(2**32 - 1, 5)
    assert a != b and b != c and a != c
    assert not set(a) & set(b)


# -- fresh_session_seed --------------------------------------------------------------------------------------------

def test_fresh_session_seed_range():
    seeds = [fresh_session_seed() for _ in range(200)]
    assert all(type(s) is int and 0 <= s < 2**32 for s in seeds)
    assert len(set(seeds)) > 1
    # 200 draws of 32 bits: some land above 2**31 (probability of none is 2**-200)
    assert max(seeds) >= 2**31


def test_a_drawn_plan_is_kept_so_a_later_draw_needs_no_hypothesis(monkeypatch) -> None:
    """The build's thread starts the ncu profile, whose request draws the first seed's plan; the kernel's first
    item draws it before (KoptItem._kickoff), so that thread never imports or runs hypothesis beside the thread
    that runs the items (two threads importing it deadlocked). The kept draw gives the same plan, and the regime
    still follows the index."""
    import sys

    from pytest_kopt.gates.inputs import draw_plan

    first = draw_plan(424242, 0)
    monkeypatch.setitem(sys.modules, "hypothesis", None)  # any import of hypothesis now raises ImportError
    assert draw_plan(424242, 0) == first
    assert draw_plan(424242, 1) == {**first, "regime": "uniform"}
    with pytest.raises(ImportError):
        draw_plan(424243, 0)
