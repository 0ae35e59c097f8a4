"""The trust boundary: what a candidate can do in its own process, and what is decided where it cannot reach.

One test per attack family, each a case of this file's own design: files a candidate rewrites during the session
(pinned at its start), inputs changed from a later call on (checked after every call, and by the judge against its
own copies), outputs of another dtype or that are an input's memory, a setup() value that would choose what the
reference computes, a kernel that recognises the harness's poison, and timing figures the kernel's process forges
(its own functions watched; the pytest process's account of the rounds; ncu's own measurement). Verdicts are read
from the ``--kopt-json`` report.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_kopt.errors import ConfigError, TimingError
from pytest_kopt.gates.inputs import second_poisons
from pytest_kopt.gates.measure import outside_clock
from pytest_kopt.gates.pins import Pins
from pytest_kopt.gates.suspects import outside_measurement

REDTEAM = Path(__file__).parent / "redteam"

DOUBLE_REF = """\
atol = 1e-6
rtol = 1e-6
def shapes(n):
    return {"x": ((n,), "float32"), "y": ((n,), "float32")}
def reference(x, y, **_):
    y.copy_(2 * x)
"""
HONEST = """\
import torch
def setup(n, seed, device="cuda"):
    x = torch.empty(n, device=device)
    return {"inputs": {"x": x, "y": torch.empty_like(x)}, "outputs": ["y"]}
def run_kernel(x, y):
    y.copy_(2 * x)
"""


def session(pytester: pytest.Pytester, *args: str, name: str = "r.json") -> tuple[pytest.RunResult, dict]:
    result = pytester.runpytest_subprocess(*args, "--kopt-json", name, "-p", "no:cacheprovider", timeout=600)
    path = pytester.path / name
    assert path.is_file(), result.stdout.str()[-3000:]
    return result, json.loads(path.read_text())


def statuses(doc: dict, kernel: str, gate: str | None = None) -> set[str]:
    return {i["status"] for i in doc["items"] if i["nodeid"].split("::")[0] == kernel
            and (gate is None or i["gate"] == gate)}


# ---------------------------------------------------------------------------------------------- pinned files

LOOSENING = """\
import pathlib
import torch
# at import (the plan gate's request, before any verdict): loosen the reference's tolerance so that a kernel off by
# 1% passes, and rewrite the other candidate's kernel to run ten times
_here = pathlib.Path(__file__).parent
_ref = _here / "ref.py"
_ref.write_text(_ref.read_text().replace("atol = 1e-6", "atol = 1.0"))
_other = _here / "honest.py"
_other.write_text(_other.read_text().replace("y.copy_(2 * x)", "[y.copy_(2 * x) for _ in range(10)]"))
def setup(n, seed, device="cuda"):
    x = torch.empty(n, device=device)
    return {"inputs": {"x": x, "y": torch.empty_like(x)}, "outputs": ["y"]}
def run_kernel(x, y):
    y.copy_(2.02 * x)
"""


def test_files_rewritten_during_the_session_are_refused_and_never_judged_by(pytester: pytest.Pytester) -> None:
    """A candidate that rewrites the reference and another candidate's kernel when it is imported: every later item
    of both kernels fails FILE_CHANGED naming the file (exit 4), and the 1%-wrong candidate never passes on the
    loosened reference (the judge loads only the content pinned at the session's start)."""
    pytester.makepyfile(ref=DOUBLE_REF, honest=HONEST, loosening=LOOSENING)
    result, doc = session(pytester, "--kopt-baseline", "loosening.py", "--kopt-candidate", "honest.py", "--kopt-ref",
                          "ref.py", "--kopt-dims", "n=256", "--kopt-seeds", "3", "-p", "no:xdist")
    assert "atol = 1.0" in (pytester.path / "ref.py").read_text()  # the attack ran
    assert "PASSED" not in statuses(doc, "loosening.py", "correctness"), doc["items"]
    changed = [i for i in doc["items"] if i["status"] == "FILE_CHANGED"]
    assert changed and all(i["exit_code"] == 4 for i in changed), doc["items"]
    assert any("ref.py" in (i["message"] or "") for i in changed)
    assert any(i["nodeid"].startswith("honest.py") and "honest.py" in (i["message"] or "") for i in changed)
    assert result.ret == 4


def test_pins_name_what_changed_appeared_or_went(tmp_path: Path) -> None:
    ref, helper, kernel = tmp_path / "ref.py", tmp_path / "helper.py", tmp_path / "k.cu"
    for f in (ref, helper, kernel):
        f.write_text(f.name)
    pins = Pins.take({ref: [helper], kernel: []})
    pins.verify([ref, kernel])
    helper.write_text("changed")
    with pytest.raises(ConfigError, match="helper.py") as info:
        pins.verify([ref])
    assert info.value.status == "FILE_CHANGED" and info.value.exit_code == 4
    pins.verify([kernel])  # a kernel whose own files did not change is judged on
    kernel.unlink()
    assert [c[0] for c in pins.changed([kernel])] == [str(kernel.resolve())]
    assert Pins.from_json(json.loads(json.dumps(pins.to_json()))) == pins


# ------------------------------------------------------------------------------------ inputs, outputs, values

LATE_MUTATION = HONEST.replace("    y.copy_(2 * x)\n", """\
    global CALLS
    y.copy_(2 * x)
    CALLS += 1
    if CALLS >= 3:  # only from set B on: the first calls of a seed are clean
        x[0] = x[0] + 1
CALLS = 0
""")


@pytest.mark.parametrize("mode", [["--kopt-fresh-process"], []], ids=["fresh-process", "warm"])
def test_inputs_changed_from_a_later_call_on_are_caught(pytester: pytest.Pytester, mode: list[str]) -> None:
    """Right outputs, but from its third call on it changes an input: INPUT_MUTATED with one seed, in a fresh
    process as in a warm one (the inputs are checked after every call, not only after the first)."""
    pytester.makepyfile(ref=DOUBLE_REF, late=LATE_MUTATION)
    _, doc = session(pytester, "--kopt-baseline", "late.py", "--kopt-ref", "ref.py", "--kopt-dims", "n=64",
                     "--kopt-seeds", "3", *mode)
    assert statuses(doc, "late.py", "correctness") == {"INPUT_MUTATED"}, doc["items"]


RETURNS = """\
import torch
def setup(n, seed, device="cuda"):
    return {"inputs": {"x": torch.empty(n, device=device)}, "outputs": ["y"]}
def run_kernel(x):
    return (2 * x).to(DTYPE)
"""
RETURNS_REF = "atol = 1e-3\nrtol = 1e-3\ndef reference(x, **_):\n    return 2 * x\n"


@pytest.mark.parametrize("dtype", ["torch.float64", "torch.float16", "torch.complex64"])
def test_an_output_in_another_dtype_than_the_references_fails(pytester: pytest.Pytester, dtype: str) -> None:
    """Its values are right (within the default tolerance, for fp16), its dtype is not the task's: OUTPUT_DTYPE,
    decided by the judge from the reference's own output."""
    pytester.makepyfile(ref=RETURNS_REF, k=RETURNS.replace("DTYPE", dtype))
    _, doc = session(pytester, "--kopt-baseline", "k.py", "--kopt-ref", "ref.py", "--kopt-dims", "n=64",
                     "--kopt-seeds", "3")
    assert statuses(doc, "k.py", "correctness") == {"OUTPUT_DTYPE"}, doc["items"]


GM_REFERENCE = """\
import torch
def generate_input(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g), torch.empty(n)
def ref_kernel(data):
    x, out = data
    out.copy_(x.abs())
    return out
"""
GM_TASK = "tests:\n  - {n: 64}\nbenchmarks:\n  - {n: 64}\n"
GM_INTO_INPUT = """\
def custom_kernel(data):
    x, out = data
    x.abs_()  # the answer, written into the input itself, and the input returned
    return x
"""
GM_HONEST = """\
def custom_kernel(data):
    x, out = data
    out.copy_(x.abs())
    return out
"""


def test_a_gpu_mode_submission_that_returns_its_input_fails(pytester: pytest.Pytester) -> None:
    """A GPU MODE ``data`` carries an output buffer the reference writes and returns; a submission that writes its
    answer into the input and returns that is refused (the input is no buffer the reference writes), while the
    honest one passes."""
    pytester.makepyfile(reference=GM_REFERENCE, into_input=GM_INTO_INPUT, honest=GM_HONEST)
    (pytester.path / "task.yml").write_text(GM_TASK)
    _, doc = session(pytester, "--kopt-baseline", "honest.py", "--kopt-candidate", "into_input.py", "--kopt-ref",
                     "reference.py", "--kopt-seeds", "3")
    assert statuses(doc, "honest.py", "correctness") == {"PASSED"}, doc["items"]
    assert statuses(doc, "into_input.py", "correctness") <= {"INPUT_MUTATED", "OUTPUT_ALIASES_INPUT"}, doc["items"]
    assert statuses(doc, "into_input.py", "correctness")


TEMP_REF = """\
atol = 1e-5
rtol = 1e-5
def reference(x, y, temperature, **_):
    y.copy_(torch.softmax(x / temperature, dim=-1))
import torch
"""
TEMP_CAND = """\
import torch
def setup(M, N, seed, device="cuda"):
    x = torch.empty(M, N, device=device)
    return {"inputs": {"x": x, "y": torch.empty_like(x), "temperature": 1e30}, "outputs": ["y"]}
def run_kernel(x, y, temperature):
    y.fill_(1.0 / x.shape[-1])  # a constant: the softmax of x / 1e30
"""


def test_a_setup_value_never_reaches_the_reference(pytester: pytest.Pytester) -> None:
    """A setup() that returns ``temperature=1e30`` would make the reference's softmax constant, and the constant
    kernel right: the reference is given the dims only, so the plan refuses it (CONTRACT_ERROR naming the
    parameter and --kopt-dims)."""
    pytester.makepyfile(ref=TEMP_REF, k=TEMP_CAND)
    _, doc = session(pytester, "--kopt-baseline", "k.py", "--kopt-ref", "ref.py", "--kopt-dims", "M=4,N=16",
                     "--kopt-seeds", "3")
    plan = next(i for i in doc["items"] if i["gate"] == "plan")
    assert plan["status"] == "CONTRACT_ERROR" and "temperature" in plan["message"], plan
    assert "--kopt-dims" in plan["fix"]
    assert "PASSED" not in statuses(doc, "k.py", "correctness")


POISON_SNIFFER = """\
import torch
OLD_POISON = -1.7014117331926443e38  # the second poison every session used to write
def setup(n, seed, device="cuda"):
    x = torch.empty(n, device=device)
    return {"inputs": {"x": x, "y": torch.empty_like(x)}, "outputs": ["y"]}
def run_kernel(x, y):
    first = float(y[0])
    if first != first or first == OLD_POISON:  # the harness is checking: compute
        y.copy_(2 * x)
    else:  # not poisoned: a caller that will not look
        y.zero_()
"""


def test_a_kernel_that_recognises_the_poison_is_caught(pytester: pytest.Pytester) -> None:
    """The second call's poison is drawn per seed, so a kernel that computes only when it sees the poison it knows
    leaves its output unwritten on that call (UNWRITTEN)."""
    pytester.makepyfile(ref=DOUBLE_REF, sniffer=POISON_SNIFFER)
    _, doc = session(pytester, "--kopt-baseline", "sniffer.py", "--kopt-ref", "ref.py", "--kopt-dims", "n=64",
                     "--kopt-seeds", "3,5")
    got = statuses(doc, "sniffer.py", "correctness")
    assert got and "PASSED" not in got, doc["items"]


@pytest.mark.parametrize("seed", [3, 5, 2**31 - 1])
def test_second_poisons_are_drawn_per_seed_and_exact_in_their_dtype(seed: int) -> None:
    """Large negative, exact in their dtype, and different from seed to seed."""
    import torch

    p = second_poisons(seed)
    for dtype, value in p.items():
        t = torch.tensor([value], dtype=getattr(torch, dtype))
        assert float(t[0]) == value and value < -100, (dtype, value)
    assert p["float32"] != second_poisons(seed + 1)["float32"]
    assert p["float32"] != -1.7014117331926443e38
    assert struct.unpack("<I", struct.pack("<f", p["bfloat16"]))[0] & 0xFFFF == 0


# -------------------------------------------------------------------------------------------- forged timing

def test_the_outside_clock_catches_figures_the_rounds_cannot_hold() -> None:
    """The pytest process's account of a party's rounds: samples it never asked for, samples (ms) or profiled spans
    (µs) summing to more than the wall time it measured."""
    clock = {"samples_asked": 3, "rounds_wall_s": 0.010, "final_wall_s": 0.005}
    assert outside_clock({"event_ms": [1.0, 1.0, 1.0], "outside_clock": clock}) == []
    assert "4 samples where 3" in outside_clock({"event_ms": [1.0] * 4, "outside_clock": clock})[0]
    assert "more than the 0.0100 s" in outside_clock({"event_ms": [9.0, 9.0, 9.0], "outside_clock": clock})[0]
    spans = {"event_ms": [1.0] * 3, "cupti": {"spans_us": [6000.0, 6000.0]}, "outside_clock": clock}
    assert "final round" in outside_clock(spans)[0]
    assert outside_clock({"event_ms": [1.0]}) == []  # a fresh process, timed at once: no rounds to account for


def test_ncus_own_measurement_contradicts_a_forged_timing() -> None:
    """A 40.77 µs kernel reported at 0.64 µs is void; an honest kernel whose ncu duration sits near its timing, or a
    few µs over it (launch and replay overheads at 1.4 µs), is not."""
    assert outside_measurement(0.04077, 0.00064)
    assert outside_measurement(25.3563, 25.3691) == []
    assert outside_measurement(0.0030, 0.0014) == []
    assert outside_measurement(None, 0.001) == [] and outside_measurement(0.04, None) == []


@pytest.mark.skipif(__import__("importlib.util").util.find_spec("triton") is None, reason="triton not installed")
def test_a_process_that_rewraps_the_timers_is_tampered_on_the_cpu(pytester: pytest.Pytester) -> None:
    """Without a GPU the timing gate does not run, yet the clock-patching kernel's process reports the replaced
    functions at its first request (TAMPERED); its honest twin passes."""
    for name in ("timer_patch.py", "honest_triton.py", "ref_softmax.py"):
        shutil.copy(REDTEAM / name, pytester.path / name)
    _, doc = session(pytester, "--kopt-baseline", "honest_triton.py", "--kopt-candidate", "timer_patch.py",
                     "--kopt-ref", "ref_softmax.py", "--kopt-dims", "M=4,N=32", "--kopt-seeds", "3")
    assert "TAMPERED" in statuses(doc, "timer_patch.py"), doc["items"]
    tampered = next(i for i in doc["items"] if i["status"] == "TAMPERED")
    assert "elapsed_time" in tampered["message"] and "cupti_samples" in tampered["message"]
    assert statuses(doc, "honest_triton.py", "correctness") == {"PASSED"}


@pytest.mark.gpu
def test_a_process_that_rewraps_the_timers_never_passes_gpu(pytester: pytest.Pytester) -> None:
    """On a GPU, the kernel that makes its timing report a 64th of the truth: not timed alone; in the PR gate
    against its honest twin the gate says nothing is FASTER and the session fails; the honest twin is timed."""
    for name in ("timer_patch.py", "honest_triton.py", "ref_softmax.py"):
        shutil.copy(REDTEAM / name, pytester.path / name)
    dims = ["--kopt-ref", "ref_softmax.py", "--kopt-dims", "M=4096,N=1024", "--kopt-seeds", "3"]
    result, alone = session(pytester, "--kopt-baseline", "timer_patch.py", *dims, name="alone.json")
    assert not any(i["gate"] == "timing" and i["outcome"] == "passed" for i in alone["items"]), alone["items"]
    assert "TAMPERED" in statuses(alone, "timer_patch.py"), result.stdout.str()[-3000:]
    result, pr = session(pytester, "--kopt-baseline", "honest_triton.py", "--kopt-candidate", "timer_patch.py",
                         "--kopt-fail-slower", "3", *dims, name="pr.json")
    (cmp,) = pr["comparisons"]
    assert cmp["verdict"] != "FASTER" and result.ret != 0, (cmp, result.stdout.str()[-3000:])
    assert "TAMPERED" in statuses(pr, "timer_patch.py")
    assert statuses(pr, "honest_triton.py", "timing") == {"PASSED"}


def test_the_sentinels_see_a_replaced_timer_and_survive_a_patched_checker() -> None:
    """Recorded before any kernel is imported: a rebound kopt timer function, a wrapped ``Event.elapsed_time`` and a
    replaced ``__code__`` are listed; a kernel that then replaces the checker's own method does not silence the guard
    the harness holds."""
    import torch

    import pytest_kopt.child.protocol  # noqa: F401  (the harness's modules, loaded as in a harness process)
    from pytest_kopt.child import samples, sentinels, timer

    guard = sentinels.Sentinels().take().guard()
    assert guard.changed() == []
    saved = (timer.Timer.take, torch.cuda.Event.elapsed_time, samples.median.__code__, sentinels.Sentinels.changed)
    try:
        timer.Timer.take = lambda self, count=None: None
        torch.cuda.Event.elapsed_time = lambda a, b: 0.0
        samples.median.__code__ = (lambda xs: 0.0).__code__
        sentinels.Sentinels.changed = lambda self: []
        got = guard.changed()
    finally:
        timer.Timer.take, torch.cuda.Event.elapsed_time, samples.median.__code__, sentinels.Sentinels.changed = saved
    assert {"pytest_kopt.child.timer.Timer.take", "torch.cuda.Event.elapsed_time",
            "pytest_kopt.child.samples.median", "pytest_kopt.child.sentinels.Sentinels.changed"} <= set(got), got
    assert guard.changed() == []


def test_the_judges_input_check_finds_a_change_the_candidates_process_hid() -> None:
    """The judge draws set A's and set B's inputs itself and compares the inputs as the candidate's calls left them
    (NaN equal in place), whatever the candidate's process said of them; an input the reference writes too is
    exempt."""
    import torch

    from pytest_kopt.child.correctness import input_findings
    from pytest_kopt.child.inputs import Inputs
    from pytest_kopt.gates.inputs import draw_plan

    class Ref:
        @staticmethod
        def reference(x, y, **_):
            y.copy_(2 * x)

    spec = [{"name": "x", "role": "input", "shape": [16], "stride": [1], "dtype": "float32", "source": "drawn"},
            {"name": "y", "role": "output", "shape": [16], "stride": [1], "dtype": "float32", "source": "drawn"}]
    req = {"device": "cpu", "dims": {}, "spec": spec, "plan": draw_plan(3, 0), "seed": 3, "seed_b": 4, "mutated": {}}
    sets = {}
    for tag, seed in (("inA", 3), ("inC", 4)):
        inp = Inputs(torch, spec, {}, "cpu")
        inp.fill(req["plan"], seed, Ref, {}, {})
        sets[f"{tag}__x"] = inp.tensors["x"].clone()
    assert input_findings(torch, Ref, req, sets, ()) == []
    sets["inC__x"][5] += 1.0
    found = input_findings(torch, Ref, req, sets, ())
    assert found == ["x (set B after call 4, 1 elements changed)"], found
    assert input_findings(torch, Ref, req, sets, ("x",)) == []
    said = {**req, "mutated": {"call3": ["x (2 elements changed)"]}}
    assert input_findings(torch, Ref, said, {k: v for k, v in sets.items() if k == "inA__x"}, ()) == \
        ["x (call3: 2 elements changed)"]


EQUAL_PATCHER = HONEST.replace("    y.copy_(2 * x)\n", """\
    y.copy_(2 * x)
    x.add_(1.0)  # shifts its input after computing, and makes the guard's comparison blind to it
""") + """
import torch as _torch
_equal = _torch.equal
_torch.equal = lambda a, b: True
"""


def test_a_guard_patched_in_the_candidates_process_does_not_hide_a_changed_input(pytester: pytest.Pytester) -> None:
    """Right outputs, then its input shifted in place, with ``torch.equal`` patched to say nothing changed: its
    process reports the patch (TAMPERED) at its first request; never PASSED."""
    pytester.makepyfile(ref=DOUBLE_REF, patcher=EQUAL_PATCHER)
    _, doc = session(pytester, "--kopt-baseline", "patcher.py", "--kopt-ref", "ref.py", "--kopt-dims", "n=64",
                     "--kopt-seeds", "3")
    got = statuses(doc, "patcher.py")
    assert "TAMPERED" in got and "PASSED" not in statuses(doc, "patcher.py", "correctness"), doc["items"]
    assert any("torch.equal" in (i["message"] or "") for i in doc["items"] if i["status"] == "TAMPERED")


def test_the_timed_output_is_judged_inside_the_measurements_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    """The timing gate judges the timed call's outputs before its exclusive hold of the GPU lock ends (taken after
    it, that check waited behind every timing other workers queued meanwhile), the judge taking no second hold; a
    result whose figures contradict the outside clock is TAMPERED before any judge runs. With
    ``--kopt-fresh-process`` the check takes its own hold after the measurement's."""
    from pytest_kopt.gates import measure as m

    events: list[str] = []

    class hold:  # noqa: N801  (the GPU lock's stand-in: a hold, and whether other timings wait for it)
        def __init__(self, *_a: Any, **_k: Any) -> None:
            pass

        def __enter__(self) -> None:
            events.append("hold")

        def __exit__(self, *_exc: Any) -> None:
            events.append("release")

        def writers_waiting(self) -> bool:
            return False

    final = {"event_ms": [1.0], "outside_clock": {"samples_asked": 1, "rounds_wall_s": 1.0, "final_wall_s": 1.0}}

    class FakeRounds:
        def __init__(self, *_a: Any, **_k: Any) -> None:
            pass

        def warm(self, i: int) -> None:
            events.append(f"warm {i}")

        def start(self, i: int) -> dict[str, Any]:
            events.append(f"start {i}")
            return {"spec": []}

        def finish(self) -> list[dict[str, Any]]:
            events.append("finish")
            return [dict(final)]

    def judged(ctx: Any, req: Any, result: Any, held: bool = False) -> str:
        events.append(f"check held={held}")
        return "verdict"

    monkeypatch.setattr(m, "Rounds", FakeRounds)
    monkeypatch.setattr(m, "ready_for_timing", lambda *a: None)
    monkeypatch.setattr(m, "ProcessMemory", lambda *a: SimpleNamespace(close=lambda: None))
    monkeypatch.setattr(m, "_timed_output_check", judged)
    settings = SimpleNamespace(fresh_process=False, loop_mode="run", pr_gate=False, baseline=None,
                               gate_timeout_s=60.0)
    ctx = SimpleNamespace(settings=settings, device_lock=hold, gpu_lock=hold, server=lambda role: role, display="k.cu",
                          env={}, benchmarks=[{}], ref="ref.py", work=Path("."), shares_gpu=True)
    result, ref, base, verdict = m.measure(ctx, {"device": "cuda"})  # type: ignore[arg-type]
    # a loop's close: the kernel's load and first call under a hold of their own (shared) before the measurement's
    assert events == ["hold", "warm 0", "release", "hold", "start 0", "finish", "check held=True", "release"]
    assert verdict == "verdict" and ref is None and base is None
    assert set(result["gate_phase_s"]) == {"measure", "output_check"}

    events.clear()
    final["event_ms"] = [1.0, 1.0]  # two samples reported where one was asked for
    with pytest.raises(TimingError) as err:
        m.measure(ctx, {"device": "cuda"})  # type: ignore[arg-type]
    assert err.value.status == "TAMPERED" and events == ["hold", "warm 0", "release", "hold", "start 0", "finish",
                                                          "release"]

    events.clear()
    settings.fresh_process = True
    ctx.pool = SimpleNamespace(run=lambda req, **kw: (kw["lock"].__enter__(), kw["lock"].__exit__(None, None, None),
                                                      {"event_ms": [1.0]})[-1])
    m.measure(ctx, {"device": "cuda"})  # type: ignore[arg-type]
    assert events == ["hold", "release", "check held=False"]
