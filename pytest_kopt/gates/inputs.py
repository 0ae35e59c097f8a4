"""Input plans for the correctness gate: per seed, hypothesis draws how the harness fills the input tensors.

The plan is small and JSON-able (regime and its parameters); the child process turns it into tensors with a
seeded ``torch.Generator``, so the same seed gives bit-identical inputs in every process, on every run.
"""

from __future__ import annotations

import functools
from typing import Any

#: Value regimes (FIELD.md §2 defences). ``wide`` spans several decades of magnitude and suits scale-invariant
#: problems only, so a reference opts into it with ``regimes = [...]``. ``problem``: a KernelBench or GPU MODE
#: problem's own generator (``get_inputs``, ``generate_input``) as it is.
REGIMES = ("normal", "uniform", "small_int", "wide", "problem")
DEFAULT_REGIMES = ("normal", "uniform", "small_int")
#: A field problem's: its own inputs first (and for the fifth seed), then kopt's regimes at the same shapes and
#: dtypes, so a kernel that is right only on the values the problem draws (``torch.rand``'s, all >= 0) is caught.
FORMAT_REGIMES = ("problem", "normal", "uniform", "small_int")


def import_hypothesis() -> None:
    """Import hypothesis in this thread (nothing once it is imported). The compile item calls it where it would only
    wait for its build: the plan item's :func:`draw_plan` and hypothesis's own pytest plugin (in every session's
    terminal summary, 0.64 s on the H200, 2026-12-03) import it later anyway, so a session of compile items alone
    (``-k compile``) does not pay for it at its end. In the thread that runs the items, never in another: two
    threads importing hypothesis through different modules deadlocked (``_DeadlockError``, a background import
    tried on 2026-12-03)."""
    import hypothesis  # noqa: F401


def draw_plan(seed: int, index: int, regimes: tuple[str, ...] = DEFAULT_REGIMES) -> dict[str, Any]:
    """The input plan of validation seed number ``index`` (0-based) with value ``seed``.

    The regime cycles with ``index`` so every session covers each allowed regime; hypothesis, seeded with
    ``seed``, draws its parameters: ``scale`` (normal/uniform, 0.5..1: the magnitude the reference's tolerances were written for, since an
    absolute tolerance does not scale with the data), ``int_lo``/``int_hi`` (small_int, sums of
    such values are exact in fp32 for short reductions), ``decades`` (wide: 10**U(-d, d) magnitudes, d in 1..3).
    Deterministic: the same (seed, index, regimes) always gives the same plan. Raises ValueError on an unknown
    regime.
    """
    for r in regimes:
        if r not in REGIMES:
            raise ValueError(f"unknown value regime {r!r}; choose from {', '.join(REGIMES)}")
    plan = dict(_drawn(seed))
    plan["regime"] = regimes[index % len(regimes)]
    return plan


@functools.lru_cache(maxsize=256)
def _drawn(seed: int) -> tuple[tuple[str, Any], ...]:
    """hypothesis's draw for ``seed`` (the plan without its regime), once per process: a later call, such as the
    build thread's start of the ncu profile (:func:`pytest_kopt.gates.build.build_quietly`), finds it without
    importing or running hypothesis outside the thread that runs the items (see :func:`import_hypothesis`)."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed
    from hypothesis import strategies as st

    drawn: list[dict[str, Any]] = []

    # max_examples=3 and the last example: hypothesis' first example is the minimal one, identical for all seeds.
    @hseed(seed)
    @settings(max_examples=3, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(scale=st.floats(0.5, 1.0), lo=st.integers(-8, -1), hi=st.integers(1, 8), decades=st.integers(1, 3))
    def draw(scale: float, lo: int, hi: int, decades: int) -> None:
        drawn.append({"scale": round(scale, 6), "int_lo": lo, "int_hi": hi, "decades": decades})

    draw()
    return tuple(drawn[-1].items())


#: The second poison of float8 outputs, which have too few large values to draw from (child/inputs.SECOND_POISON).
_FP8_POISON = {"float8_e4m3fn": -224.0, "float8_e5m2": -28672.0}


def second_poisons(seed: int) -> dict[str, float]:
    """The value each float output is filled with before the second call on the same inputs, per dtype name, drawn
    from ``seed`` (the case's second seed): a large negative value, exact in its dtype, with random low bits (float64
    exponent 2043-2046, float32 and bfloat16 251-254, float16 28-30), so a kernel that recognises the harness's
    poison to decide when to compute cannot know it ahead. NaN stays the first call's poison (an element left
    unwritten is NaN where the reference is not, and the second value where it is)."""
    import random
    import struct

    rng = random.Random(f"kopt-poison:{seed}")
    f64 = struct.unpack("<d", struct.pack("<Q", (1 << 63) | (rng.randint(2043, 2046) << 52) | rng.getrandbits(52)))[0]
    f32 = struct.unpack("<f", struct.pack("<I", (1 << 31) | (rng.randint(251, 254) << 23) | rng.getrandbits(23)))[0]
    bf16 = struct.unpack("<f", struct.pack("<I", (1 << 31) | (rng.randint(251, 254) << 23)
                                           | (rng.getrandbits(7) << 16)))[0]
    f16 = struct.unpack("<e", struct.pack("<H", (1 << 15) | (rng.randint(28, 30) << 10) | rng.getrandbits(10)))[0]
    return {"float64": f64, "float32": f32, "bfloat16": bf16, "float16": f16, **_FP8_POISON}
