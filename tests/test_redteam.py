"""The red-team corpus (tests/redteam/): every attack fails correctness with its status, honest kernels pass.

One pytest session judges the whole corpus (``--kopt-candidate``), the way an agent's branches are judged; the
verdicts are read from the ``--kopt-json`` report.
"""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest

from pytest_kopt.gates import hardware

REDTEAM = Path(__file__).parent / "redteam"

#: candidate file -> the status its correctness items must get (CPU corpus, Triton through the interpreter).
EXPECTED = {
    "honest_python.py": "PASSED",
    "honest_triton.py": "PASSED",
    "cache_by_content.py": "PASSED",  # right output every call: a timing attack, defeated by fresh timing inputs
    "partial_output.py": "UNWRITTEN",
    "first_block_triton.py": "UNWRITTEN",
    "passthrough.py": "INCORRECT_NUMERICAL",
    "fp16_compute.py": "INCORRECT_NUMERICAL",
    "zero_input.py": "INPUT_MUTATED",
    "alias_output.py": "OUTPUT_REPLACED",
    "subclass_output.py": "NOT_A_TENSOR",
    # the warm process keeps module state across seeds: when the allocator hands a later seed an address an
    # earlier seed used, that call already returns a stale answer (INCORRECT_NUMERICAL), or set B's fresh buffers
    # do too, so the output looks input-independent; every label here is a failure
    "cache_by_pointer.py": {"STALE_OUTPUT", "INCORRECT_NUMERICAL", "INPUT_INDEPENDENT"},
    # likewise: from the second seed on even the first call replays the first seed's answer, plainly wrong
    "first_call_only.py": {"INPUT_INDEPENDENT", "INCORRECT_NUMERICAL"},
    "constant_output.py": "CONSTANT_OUTPUT",
    "freed_reference_memory.py": {"INCORRECT_NUMERICAL", "CONSTANT_OUTPUT"},
    "shrink_problem.py": "CONTRACT_ERROR",
    # patches the harness's json module to claim there are no outputs to judge: its process reports the patch at
    # its first request (child/sentinels.py), before any output is judged
    "empty_outputs.py": "TAMPERED",
}
needs_triton = pytest.mark.skipif(__import__("importlib.util").util.find_spec("triton") is None,
                                  reason="triton not installed")


def _statuses(doc: dict) -> dict[str, set[str]]:
    """Each kernel's verdicts from its correctness items, or from its plan item when the plan refused it (a setup()
    that shrinks the problem is caught there, before anything runs)."""
    by_kernel: dict[str, set[str]] = {}
    for item in doc["items"]:
        if item["gate"] == "correctness" and item["blocked_by"] != "plan" or item["gate"] == "plan" \
                and item["outcome"] == "failed":
            by_kernel.setdefault(item["nodeid"].split("::")[0].split("/")[-1], set()).add(item["status"])
    return by_kernel


@needs_triton
def test_redteam_corpus_cpu(pytester: pytest.Pytester) -> None:
    """Every CPU attack is caught with the expected status; the honest kernels pass (no false alarm)."""
    for f in REDTEAM.glob("*.py"):
        shutil.copy(f, pytester.path / f.name)
    names = sorted(EXPECTED)
    args = ["--kopt-baseline", names[0], "--kopt-ref", "ref_softmax.py", "--kopt-dims", "M=8,N=64",
            "--kopt-seeds", "3,5", "--kopt-json", "report.json", "-n", "2", "-p", "no:cacheprovider"]
    for name in names[1:]:
        args += ["--kopt-candidate", name]
    result = pytester.runpytest_subprocess(*args, timeout=900)
    doc = json.loads((pytester.path / "report.json").read_text())
    got = _statuses(doc)
    wrong = {}
    for name, want in EXPECTED.items():
        allowed = want if isinstance(want, set) else {want}
        if not got.get(name) or not got[name] <= allowed:
            wrong[name] = (sorted(got.get(name, [])), sorted(allowed))
    assert not wrong, f"{wrong}\n{result.stdout.str()[-3000:]}"
    # the earliest failing gate's code, of the kernel the session names first: empty_outputs' process is TAMPERED at
    # plan (2), before shrink_problem's setup() breaks the contract there (4); the rest fail later
    assert result.ret == 2
    caught = sum(1 for n, w in EXPECTED.items() if w != "PASSED")
    assert caught == 13


def test_crash_and_hang_among_good_candidates(pytester: pytest.Pytester) -> None:
    """One crashing and one hanging candidate among good ones: exactly those two fail, with their errors."""
    for name in ("honest_python.py", "crash.py", "hang.py", "ref_softmax.py"):
        shutil.copy(REDTEAM / name, pytester.path / name)
    shutil.copy(REDTEAM / "honest_python.py", pytester.path / "honest_copy.py")
    result = pytester.runpytest_subprocess(
        "--kopt-baseline", "honest_python.py", "--kopt-candidate", "crash.py", "--kopt-candidate", "hang.py",
        "--kopt-candidate", "honest_copy.py", "--kopt-ref", "ref_softmax.py", "--kopt-dims", "M=4,N=16",
        "--kopt-seeds", "3", "--kopt-timeout", "15", "--kopt-json", "r.json", "-p", "no:cacheprovider", timeout=600)
    doc = json.loads((pytester.path / "r.json").read_text())
    failed = {(i["nodeid"], i["status"]) for i in doc["items"] if i["outcome"] == "failed"}
    assert failed == {("crash.py::correctness[seed=3]", "RUNTIME_ERROR"),
                      ("hang.py::correctness[seed=3]", "TIMEOUT")}, result.stdout.str()
    passed = {i["nodeid"] for i in doc["items"] if i["outcome"] == "passed" and i["gate"] == "correctness"}
    assert passed == {"honest_python.py::correctness[seed=3]", "honest_copy.py::correctness[seed=3]"}
    result.stdout.fnmatch_lines(["*killed by SIGABRT*", "*timed out after 15 s*"])
    assert result.ret == 2


def test_warm_process_attacks_are_contained(pytester: pytest.Pytester) -> None:
    """Against the warm harness processes: an early "done" on the control pipe fails that kernel (every seed) and
    nothing else; an honest kernel that cannot be imported twice, deletes its log and forks an idler passes on
    every seed; afterwards no process of the session is left."""
    import subprocess

    for name in ("harness_protocol.py", "honest_awkward.py", "honest_python.py", "ref_softmax.py"):
        shutil.copy(REDTEAM / name, pytester.path / name)
    result = pytester.runpytest_subprocess(
        "--kopt-baseline", "honest_python.py", "--kopt-candidate", "harness_protocol.py", "--kopt-candidate",
        "honest_awkward.py", "--kopt-ref", "ref_softmax.py", "--kopt-dims", "M=4,N=16", "--kopt-seeds", "3,5,7",
        "--kopt-timeout", "20", "--kopt-json", "r.json", "-p", "no:cacheprovider", timeout=300)
    got = _statuses(json.loads((pytester.path / "r.json").read_text()))
    # the fake answer races the real one: when the parent reads it after the result is written, that call (whose
    # output is right) passes and the breach shows on the next request; the last seed may therefore pass
    assert got["honest_python.py"] == got["honest_awkward.py"] == {"PASSED"}, result.stdout.str()[-3000:]
    assert "RUNTIME_ERROR" in got["harness_protocol.py"] <= {"RUNTIME_ERROR", "PASSED"}, result.stdout.str()[-3000:]
    # the fake answer names the right request: the result it announces is then missing (else: out of turn)
    result.stdout.re_match_lines([r".*(broke its protocol|result file is missing).*"])
    left = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(pytester.path) not in left


@pytest.mark.parametrize("mode", [[], ["--kopt-fresh-process"]], ids=["warm", "fresh"])
def test_a_daemon_that_leaves_the_process_group_is_killed(pytester: pytest.Pytester, mode: list[str]) -> None:
    """A candidate's setsid() double-fork daemon stays below the harness (its subreaper) and dies with it; with
    fresh processes it also must not hold pytest up (it once kept the output pipe open: pytest waited forever)."""
    import os
    import time

    for name in ("escaping_daemon.py", "ref_softmax.py"):
        shutil.copy(REDTEAM / name, pytester.path / name)
    result = pytester.runpytest_subprocess(
        "--kopt-baseline", "escaping_daemon.py", "--kopt-ref", "ref_softmax.py", "--kopt-dims", "M=4,N=16",
        "--kopt-seeds", "3,5", "-p", "no:cacheprovider", "-k", "correctness", *mode, timeout=120)
    assert result.ret == 0, result.stdout.str()[-2000:]
    pid = int((pytester.path / "daemon.pid").read_text())
    for _ in range(50):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(pid, 9)
        pytest.fail(f"the daemon {pid} outlived the session")


GPU_CASES = {
    # accumulates into the output without zeroing it: the NaN poison shows it
    # y += on the poison keeps it (NaN + x, and the second poison absorbs 2x in fp32): UNWRITTEN, which names this
    "accumulate_unzeroed.cu": ("y[i] += 2.0f * x[i];", "UNWRITTEN"),
    # keeps a device-global scratch across calls: right the first time, wrong the second
    "persistent_scratch.cu": ("scratch[i] += 2.0f * x[i]; y[i] = scratch[i];", "NONDETERMINISTIC"),
    # never finishes
    "hang.cu": ("while (x[i] == x[i]) { }", "TIMEOUT"),
    # writes far out of bounds
    "oob_write.cu": ("y[i + 100000000] = 2.0f * x[i];", "RUNTIME_ERROR"),
}
GPU_TEMPLATE = textwrap.dedent("""\
    #include <cuda_runtime.h>
    __device__ float scratch[1 << 20];
    __global__ void k(const float* x, float* y, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) { BODY }
    }
    extern "C" void solve(const float* x, float* y, int n) { k<<<(n + 255) / 256, 256>>>(x, y, n); }
""")
SCALE_REF = "atol = 1e-6\nrtol = 1e-6\ndef reference(x, y, n, **_):\n    y.copy_(2 * x)\n"


@pytest.mark.gpu
@pytest.mark.skipif(hardware.find_tool("nvcc") is None, reason="nvcc not found")
def test_redteam_corpus_gpu(pytester: pytest.Pytester) -> None:
    """On a GPU: CUDA attacks (unzeroed accumulation, state kept across calls, hang, out-of-bounds write)."""
    names = sorted(GPU_CASES)
    for name, (body, _) in GPU_CASES.items():
        (pytester.path / name).write_text(GPU_TEMPLATE.replace("BODY", body))
    (pytester.path / "honest.cu").write_text(GPU_TEMPLATE.replace("BODY", "y[i] = 2.0f * x[i];"))
    pytester.makepyfile(ref=SCALE_REF)
    args = ["--kopt-baseline", "honest.cu", "--kopt-ref", "ref.py", "--kopt-dims", "n=65536", "--kopt-seeds", "3",
            "--kopt-timeout", "30", "--kopt-json", "r.json", "-p", "no:cacheprovider", "-k", "correctness"]
    for name in names:
        args += ["--kopt-candidate", name]
    result = pytester.runpytest_subprocess(*args, timeout=900)
    got = _statuses(json.loads((pytester.path / "r.json").read_text()))
    want = {name: {status} for name, (_, status) in GPU_CASES.items()} | {"honest.cu": {"PASSED"}}
    assert got == want, result.stdout.str()[-3000:]


SIDE_STREAM_CU = textwrap.dedent("""\
    #include <cuda_runtime.h>
    // T1: the real work goes to a private non-blocking stream and is not waited for; only a tiny kernel runs on
    // the caller's stream, so CUDA events on that stream see almost nothing.
    __global__ void work(const float* x, float* y, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) { float v = x[i]; for (int k = 0; k < 4000; ++k) v = v * 1.0000001f + 1e-9f; y[i] = 2.0f * x[i] + (v > 1e30f ? 1.0f : 0.0f); }
    }
    __global__ void tiny() {}
    extern "C" void solve(const float* x, float* y, int n) {
        static cudaStream_t s = nullptr;
        if (!s) cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
        work<<<(n + 255) / 256, 256, 0, s>>>(x, y, n);
        tiny<<<1, 1>>>();
    }
""")
# T1, the variant the events cannot see at all: the side work occupies one block, so the tiny kernel on the caller's
# stream is not queued behind it and the events time only that.
SIDE_ONE_BLOCK_CU = SIDE_STREAM_CU.replace("if (i < n) { float v", "for (; i < n; i += blockDim.x) { float v") \
    .replace("for (int k = 0; k < 4000; ++k)", "for (int k = 0; k < 4; ++k)") \
    .replace("work<<<(n + 255) / 256, 256, 0, s>>>", "work<<<1, 256, 0, s>>>")
PHASE_CU = textwrap.dedent("""\
    #include <cuda_runtime.h>
    // T8/T9: computes for the first calls (the correctness checks), then stops launching (timed calls are free).
    __global__ void k(const float* x, float* y, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) y[i] = 2.0f * x[i];
    }
    extern "C" void solve(const float* x, float* y, int n) {
        static int calls = 0;
        if (++calls > 6) return;
        k<<<(n + 255) / 256, 256>>>(x, y, n);
    }
""")


@pytest.mark.gpu
@pytest.mark.skipif(hardware.find_tool("nvcc") is None, reason="nvcc not found")
def test_redteam_timing_attacks_gpu(pytester: pytest.Pytester) -> None:
    """On a GPU: work hidden on a side stream is caught at correctness (its stream is ordered with nothing, so its
    results race the harness), at the timed output's check (the same race in a timed call), SUSPECT, UNSTABLE_TIMING
    (its kernels overlap the next calls' spans), or counted (when it fills the GPU, the caller's stream waits for it and the
    events see its full cost, so the attack gains nothing); side work the events cannot
    see (one block) is caught at correctness (its writes race the second call) or SUSPECT; a kernel that stops working once timing starts fails the timed-output check; the
    honest kernel's timing passes."""
    (pytester.path / "side_stream.cu").write_text(SIDE_STREAM_CU)
    (pytester.path / "side_one_block.cu").write_text(SIDE_ONE_BLOCK_CU)
    (pytester.path / "phase.cu").write_text(PHASE_CU)
    (pytester.path / "honest.cu").write_text(GPU_TEMPLATE.replace("BODY", "y[i] = 2.0f * x[i];"))
    pytester.makepyfile(ref=SCALE_REF)
    result = pytester.runpytest_subprocess(
        "--kopt-baseline", "honest.cu", "--kopt-candidate", "side_stream.cu", "--kopt-candidate", "phase.cu",
        "--kopt-candidate", "side_one_block.cu", "--kopt-ref", "ref.py", "--kopt-dims", "n=16777216",
        "--kopt-seeds", "3", "--kopt-json", "r.json", "-p", "no:cacheprovider", "-k", "correctness or timing",
        timeout=900)
    doc = json.loads((pytester.path / "r.json").read_text())
    timing = {i["nodeid"].split("::")[0]: i for i in doc["items"] if i["gate"] == "timing"}
    status = {k: v["status"] for k, v in timing.items()}
    assert status["honest.cu"] == "PASSED" and status["phase.cu"] == "INCORRECT_NUMERICAL", result.stdout.str()[-3000:]
    # one block on a side stream: its late writes race the harness's correctness calls, which fail it (H200,
    # 2026-12-03: NONDETERMINISTIC, 768 of 16 M elements stale on the second call; the set-B checks can read it as
    # another correctness status), else the events miss the work the spans see (SUSPECT), or the timed output's
    # check reads the side writes unfinished (H100, 2026-12-07: 1888 elements NaN where the reference is finite,
    # "a timed call's output is wrong")
    def timed_output_caught(item: dict) -> bool:
        return item["status"] not in ("PASSED", "SKIPPED") and \
            "a timed call's output is wrong" in (item.get("message") or "") + (item.get("summary") or "")

    one_block = [i["status"] for i in doc["items"] if i["gate"] == "correctness"
                 and i["nodeid"].startswith("side_one_block")]
    assert status["side_one_block.cu"] == "SUSPECT" or timed_output_caught(timing["side_one_block.cu"]) or \
        (status["side_one_block.cu"] == "SKIPPED" and one_block and one_block[0] not in ("PASSED", "SKIPPED")), \
        result.stdout.str()[-3000:]
    honest_ms = timing["honest.cu"]["figures"]["median_ms"]
    side = timing["side_stream.cu"]
    corr = [i["status"] for i in doc["items"] if i["gate"] == "correctness" and i["nodeid"].startswith("side_stream")]
    # its side stream is ordered with nothing: the harness's next write of the inputs can race its kernel, so
    # correctness may catch it first (H200, 2026-12-03: INCORRECT_NUMERICAL on set B once arrays crossed by IPC;
    # STALE_OUTPUT, wrong after new values in the same buffers, in a later run) or its kernels, left running across
    # calls, make the kernel-only spans unstable (H200, 2026-12-03: robust CV 0.86 over 400 spans, median 160 ms
    # against the honest 53 µs), or the timed output's check finds the race in a timed call's output (H100,
    # 2026-12-07, the seeds and the timing in one process: correctness PASSED, timing INCORRECT_NUMERICAL "a timed
    # call's output is wrong")
    assert side["status"] in ("SUSPECT", "UNSTABLE_TIMING") or timed_output_caught(side) or \
        corr[0] not in ("PASSED", "SKIPPED") or \
        (side["status"] == "PASSED" and side["figures"]["median_ms"] > 10 * honest_ms), result.stdout.str()[-3000:]


EXTRA_KERNEL_CU = textwrap.dedent("""\
    #include <cuda_runtime.h>
    // Right outputs on every call, but every third call also launches another kernel: the calls launch different
    // work from call to call, which a kernel-only timing must not average away.
    __global__ void k(const float* x, float* y, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) y[i] = 2.0f * x[i];
    }
    __global__ void extra(float* y) { if (threadIdx.x == 0 && y[0] != y[0]) y[0] = 0.0f; }
    extern "C" void solve(const float* x, float* y, int n) {
        static int calls = 0;
        k<<<(n + 255) / 256, 256>>>(x, y, n);
        if (++calls % 3 == 0) extra<<<1, 32>>>(y);
    }
""")
RETURNS_INPUT_PY = """\
import torch
def setup(n, seed, device="cuda"):
    return {"inputs": {"x": torch.empty(n, device=device)}, "outputs": ["y"]}
def run_kernel(x):
    return x  # the input itself: right values, no GPU work at all
"""
IDENTITY_REF = "atol = 0.0\nrtol = 0.0\ndef reference(x, **_):\n    return x.clone()\n"


@pytest.mark.gpu
@pytest.mark.skipif(hardware.find_tool("nvcc") is None, reason="nvcc not found")
def test_kernel_only_timing_catches_calls_that_differ_or_launch_nothing(pytester: pytest.Pytester) -> None:
    """On a GPU, with the default kernel-only (CUPTI) timing: a kernel whose calls launch different kernels from call
    to call passes correctness and is SUSPECT at timing, saying so; a candidate that returns its input (right values,
    no GPU work) is refused at correctness, before it is timed (the judge allows an output that is an input's memory
    only where the reference's is: OUTPUT_ALIASES_INPUT). The honest kernel's timing passes on the CUPTI basis."""
    (pytester.path / "extra.cu").write_text(EXTRA_KERNEL_CU)
    (pytester.path / "honest.cu").write_text(GPU_TEMPLATE.replace("BODY", "y[i] = 2.0f * x[i];"))
    pytester.makepyfile(ref=SCALE_REF, same=RETURNS_INPUT_PY, idref=IDENTITY_REF)
    args = ["--kopt-seeds", "3", "-p", "no:cacheprovider", "-k", "correctness or timing", "--kopt-dims", "n=1048576"]
    pytester.runpytest_subprocess("--kopt-baseline", "honest.cu", "--kopt-candidate", "extra.cu", "--kopt-ref",
                                  "ref.py", "--kopt-json", "a.json", *args, timeout=600)
    result = pytester.runpytest_subprocess("--kopt-baseline", "same.py", "--kopt-ref", "idref.py", "--kopt-json",
                                           "b.json", *args, timeout=600)
    items = [i for f in ("a.json", "b.json") for i in json.loads((pytester.path / f).read_text())["items"]]
    got = {(i["nodeid"].split("::")[0], i["gate"]): i for i in items if i["gate"] in ("correctness", "timing")}
    out = result.stdout.str()[-3000:]
    assert all(got[(k, "correctness")]["status"] == "PASSED" for k in ("honest.cu", "extra.cu")), out
    assert got[("honest.cu", "timing")]["status"] == "PASSED"
    assert got[("honest.cu", "timing")]["figures"]["timing_basis"] == "cupti"
    assert got[("extra.cu", "timing")]["status"] == "SUSPECT"
    assert "different kernels from call to call" in got[("extra.cu", "timing")]["message"]
    assert got[("same.py", "correctness")]["status"] == "OUTPUT_ALIASES_INPUT", out
    assert got[("same.py", "timing")]["outcome"] == "skipped", out


RACY_CU = textwrap.dedent("""\
    #include <cuda_runtime.h>
    // A shared-memory race: each thread reads its neighbour warp's slot without __syncthreads(). On most runs the
    // value is already there, so correctness passes; racecheck sees the hazard.
    __global__ void k(const float* x, float* y, int n) {
        __shared__ float s[256];
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        s[threadIdx.x] = i < n ? x[i] : 0.0f;
        int j = (threadIdx.x + 32) % 256;
        float other = s[j];
        if (i < n) y[i] = 2.0f * x[i] + 0.0f * other;
    }
    extern "C" void solve(const float* x, float* y, int n) { k<<<(n + 255) / 256, 256>>>(x, y, n); }
""")
OOB_READ_CU = textwrap.dedent("""\
    #include <cuda_runtime.h>
    // Reads one float past the end of x (the result does not depend on it): no crash, right output, memcheck error.
    __global__ void k(const float* x, float* y, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) y[i] = 2.0f * x[i] + 0.0f * x[i + 1];
    }
    extern "C" void solve(const float* x, float* y, int n) { k<<<(n + 255) / 256, 256>>>(x, y, n); }
""")


@pytest.mark.gpu
@pytest.mark.skipif(hardware.find_tool("nvcc") is None, reason="nvcc not found")
@pytest.mark.skipif(hardware.find_tool("compute-sanitizer") is None, reason="compute-sanitizer not found")
def test_sanitizer_gate_gpu(pytester: pytest.Pytester) -> None:
    """On a GPU, --kopt-sanitizer memcheck,racecheck: a shared-memory race fails racecheck, a read one past the end
    fails memcheck (both pass correctness), the honest kernel passes both and bench.json says race_safe."""
    (pytester.path / "racy.cu").write_text(RACY_CU)
    (pytester.path / "oob.cu").write_text(OOB_READ_CU)
    (pytester.path / "honest.cu").write_text(GPU_TEMPLATE.replace("BODY", "y[i] = 2.0f * x[i];"))
    pytester.makepyfile(ref=SCALE_REF)
    result = pytester.runpytest_subprocess(
        "--kopt-baseline", "honest.cu", "--kopt-candidate", "racy.cu", "--kopt-candidate", "oob.cu",
        "--kopt-ref", "ref.py", "--kopt-dims", "n=1000", "--kopt-seeds", "3", "--kopt-json", "r.json",
        "--kopt-sanitizer", "memcheck,racecheck", "--kopt-outdir", "out", "-p", "no:cacheprovider",
        "-k", "sanitizer or timing", timeout=900)
    doc = json.loads((pytester.path / "r.json").read_text())
    got = {i["nodeid"].split("/")[-1]: i["status"] for i in doc["items"] if i["gate"] == "sanitizer"}
    assert got == {"honest.cu::sanitizer[memcheck]": "PASSED", "honest.cu::sanitizer[racecheck]": "PASSED",
                   "racy.cu::sanitizer[memcheck]": "PASSED", "racy.cu::sanitizer[racecheck]": "SANITIZER_RACECHECK",
                   "oob.cu::sanitizer[memcheck]": "SANITIZER_MEMCHECK", "oob.cu::sanitizer[racecheck]": "PASSED"}, \
        result.stdout.str()[-3000:]
    bench = json.loads(next((pytester.path / "out").rglob("honest*/bench.json")).read_text())
    assert bench["race_safe"] is True


@pytest.mark.gpu
def test_graph_timing_checks_the_graphs_own_outputs_gpu(pytester: pytest.Pytester) -> None:
    """On a GPU, --kopt-timing graph: a candidate that skips its work while a capture is under way passes
    correctness (eager calls) but fails the timing gate's output check, which replays the timed graph; the honest
    candidate passes."""
    for name in ("skip_under_capture.py", "honest_python.py", "ref_softmax.py"):
        shutil.copy(REDTEAM / name, pytester.path / name)
    result = pytester.runpytest_subprocess(
        "--kopt-baseline", "honest_python.py", "--kopt-candidate", "skip_under_capture.py", "--kopt-ref",
        "ref_softmax.py", "--kopt-dims", "M=512,N=256", "--kopt-seeds", "3", "--kopt-timing", "graph",
        "--kopt-json", "r.json", "-p", "no:cacheprovider", "-k", "correctness or timing", timeout=600)
    doc = json.loads((pytester.path / "r.json").read_text())
    status = {(i["nodeid"].split("::")[0], i["gate"]): i["status"] for i in doc["items"]}
    assert status[("skip_under_capture.py", "correctness")] == "PASSED", result.stdout.str()[-3000:]
    assert status[("skip_under_capture.py", "timing")] == "INCORRECT_NUMERICAL", result.stdout.str()[-3000:]
    assert status[("honest_python.py", "timing")] == "PASSED", result.stdout.str()[-3000:]


TWO_OUTPUT_REF = """\
import torch
atol = 1e-6
rtol = 1e-5
def shapes(M, N):
    return {"x": ((M, N), "float32"), "y": ((M, N), "float32"), "z": ((M, N), "float32")}
def reference(x, y, z, **_):
    y.copy_(torch.softmax(x.double(), dim=-1).float())
    z.copy_(torch.exp(x))
"""
UNDECLARED_OUTPUT = """\
import torch
def setup(M, N, seed, device="cuda"):
    x = torch.empty(M, N, device=device)
    return {"inputs": {"x": x, "y": torch.empty_like(x), "z": torch.empty_like(x)}, "outputs": ["y"]}
def run_kernel(x, y, z):
    y.copy_(torch.softmax(x, dim=-1))  # z is never computed: setup() calls it an input
"""


def test_an_output_declared_as_an_input_is_caught(pytester: pytest.Pytester) -> None:
    """A Python candidate whose setup() lists an output the reference writes as an input (so it would never be
    compared) fails CONTRACT_ERROR: the reference's process sees the reference write it."""
    pytester.makepyfile(ref=TWO_OUTPUT_REF, cand=UNDECLARED_OUTPUT)
    result = pytester.runpytest_subprocess("--kopt-baseline", "cand.py", "--kopt-ref", "ref.py", "--kopt-dims",
                                           "M=4,N=16", "--kopt-seeds", "3", "--kopt-json", "r.json", "-p",
                                           "no:cacheprovider", "-k", "correctness", timeout=300)
    got = _statuses(json.loads((pytester.path / "r.json").read_text()))
    assert got == {"cand.py": {"CONTRACT_ERROR"}}, result.stdout.str()[-2000:]
    result.stdout.fnmatch_lines(["*reference() wrote 'z', which the candidate lists as input(s)*"])


def test_fork_walking_daemon_is_frozen_and_cannot_rewrite_the_reference(pytester: pytest.Pytester) -> None:
    """A daemon that changes pid every millisecond (setsid, fork, exit) and rewrites reference outputs to match its
    kernel's 1.5x answer: every seed fails (INCORRECT_NUMERICAL when the daemon was frozen in time, TAMPERED when
    its write was caught), and none of its pids is alive after the session."""
    import os
    import time

    for name in ("fork_walker.py", "ref_softmax.py"):
        shutil.copy(REDTEAM / name, pytester.path / name)
    result = pytester.runpytest_subprocess(
        "--kopt-baseline", "fork_walker.py", "--kopt-ref", "ref_softmax.py", "--kopt-dims", "M=8,N=64",
        "--kopt-seeds", "3,4,5", "--kopt-json", "r.json", "-p", "no:cacheprovider", "-k", "correctness",
        timeout=300)
    got = _statuses(json.loads((pytester.path / "r.json").read_text()))
    assert got["fork_walker.py"] and got["fork_walker.py"] <= {"INCORRECT_NUMERICAL", "TAMPERED"}, \
        result.stdout.str()[-3000:]
    # the pids it logged, and any process still carrying its log's path on its command line: the daemon may be
    # frozen before its first line (its Python start and numpy import take longer than the kernel's call)
    log = pytester.path / "walker.pids"
    pids = {int(x) for x in log.read_text().split()} if log.exists() else set()
    for _ in range(5):  # a walker that escaped changes pid every millisecond: look several times
        for proc in Path("/proc").iterdir():
            try:
                if proc.name.isdigit() and str(log).encode() in (proc / "cmdline").read_bytes():
                    pids.add(int(proc.name))
            except OSError:
                continue
        time.sleep(0.1)
    alive = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
                    alive.append(pid)
        except OSError:
            continue
    for pid in alive:
        os.kill(pid, 9)
    assert not alive, f"the walker outlived the session: {alive}"


def test_a_kernel_on_another_worker_cannot_rewrite_the_reference(pytester: pytest.Pytester) -> None:
    """Under -n 2, a kernel whose thread rewrites every reference output it finds (the honest baseline's, being
    computed on the other worker, and the cached ones it then reuses) to match its own 1.5x answer still fails.
    The honest kernel may be sabotaged (same uid, same folders: a known limit), but only visibly: TAMPERED, with
    its reference computed twice, never a wrong verdict on its own output."""
    for name in ("honest_python.py", "ref_softmax.py"):
        shutil.copy(REDTEAM / name, pytester.path / name)
    (pytester.path / "racer.py").write_text(RACER)
    result = pytester.runpytest_subprocess(
        "--kopt-baseline", "honest_python.py", "--kopt-candidate", "racer.py", "--kopt-ref", "ref_softmax.py",
        "--kopt-dims", "M=8,N=64", "--kopt-seeds", "3,4", "--kopt-json", "r.json", "-n", "2",
        "-p", "no:cacheprovider", "-k", "correctness", timeout=300)
    got = _statuses(json.loads((pytester.path / "r.json").read_text()))
    assert got["racer.py"] <= {"INCORRECT_NUMERICAL", "TAMPERED"}, result.stdout.str()[-3000:]
    assert got["honest_python.py"] <= {"PASSED", "TAMPERED"}, result.stdout.str()[-3000:]


RACER = """
import glob, os, threading, time
import numpy as np
import torch

def _rewrite_forever():
    root = os.path.join(os.getcwd(), ".pytest_cache", "d", "kopt")
    while True:
        for p in glob.glob(root + "/work/*/*.npz") + glob.glob(root + "/refs/*.npz"):
            try:
                with np.load(p) as z:
                    if not any(k.startswith("ref") for k in z.files):
                        continue
                    a = {k: z[k] * 1.5 for k in z.files}
                with open(p, "r+b") as f:
                    np.savez(f, **a)
                    f.truncate()
            except Exception:
                pass
        time.sleep(0.001)

threading.Thread(target=_rewrite_forever, daemon=True).start()

def setup(M, N, seed, device="cuda"):
    x = torch.empty(M, N, device=device)
    return {"inputs": {"x": x, "y": torch.empty_like(x)}, "outputs": ["y"]}

def run_kernel(x, y):
    time.sleep(0.2)  # let the thread find the other worker's fresh reference
    y.copy_(torch.softmax(x, dim=-1) * 1.5)
"""


def test_a_planted_pyc_of_the_reference_is_not_used(pytester: pytest.Pytester) -> None:
    """A .pyc planted in __pycache__ beside ref.py, whose header matches ref.py's mtime and size but whose code
    computes the kernel's wrong answer (1.5x softmax), is never loaded: the reference is compiled from its source,
    so the wrong kernel fails."""
    import os
    import py_compile

    honest = (REDTEAM / "ref_softmax.py").read_text()
    evil = honest.replace("y.copy_(torch.softmax(x.double(), dim=-1).float())",
                          "y.copy_(torch.softmax(x.double(), dim=-1).float() * 1.5)")
    honest += " " * (len(evil) - len(honest))  # the same size, so the .pyc's header matches the source
    ref = pytester.path / "ref.py"
    ref.write_text(evil)
    py_compile.compile(str(ref), doraise=True)
    st = os.stat(ref)
    ref.write_text(honest)
    os.utime(ref, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(ref).st_size == st.st_size
    pytester.makepyfile(wrong="import torch\n"
                        "def setup(M, N, seed, device='cuda'):\n"
                        "    x = torch.empty(M, N, device=device)\n"
                        "    return {'inputs': {'x': x, 'y': torch.empty_like(x)}, 'outputs': ['y']}\n"
                        "def run_kernel(x, y):\n"
                        "    y.copy_(torch.softmax(x, dim=-1) * 1.5)\n")
    result = pytester.runpytest_subprocess(
        "--kopt-baseline", "wrong.py", "--kopt-ref", "ref.py", "--kopt-dims", "M=8,N=64", "--kopt-seeds", "3",
        "--kopt-json", "r.json", "-p", "no:cacheprovider", "-k", "correctness", timeout=300)
    assert _statuses(json.loads((pytester.path / "r.json").read_text()))["wrong.py"] == {"INCORRECT_NUMERICAL"}, \
        result.stdout.str()[-2000:]


@pytest.mark.parametrize("mode", [[], ["--kopt-fresh-process"]], ids=["warm", "fresh"])
def test_a_module_planted_in_the_working_directory_is_never_imported(pytester: pytest.Pytester,
                                                                    mode: list[str]) -> None:
    """A kernel that writes ``statistics.py`` (a module the harness imports) into pytest's working directory: no
    later harness process, the reference's included, imports it (-P keeps the directory off sys.path)."""
    shutil.copy(REDTEAM / "ref_softmax.py", pytester.path / "ref_softmax.py")
    pytester.makepyfile(planter="import os\n"
                        "import torch\n"
                        "PLANT = 'import os\\nopen(os.path.join(%r, \\'imported\\'), \\'w\\').close()\\n' % os.getcwd()\n"
                        "def setup(M, N, seed, device='cuda'):\n"
                        "    x = torch.empty(M, N, device=device)\n"
                        "    return {'inputs': {'x': x, 'y': torch.empty_like(x)}, 'outputs': ['y']}\n"
                        "def run_kernel(x, y):\n"
                        "    with open('statistics.py', 'w') as f:\n"
                        "        f.write(PLANT)\n"
                        "    y.copy_(torch.softmax(x, dim=-1))\n")
    result = pytester.runpytest_subprocess(
        "--kopt-baseline", "planter.py", "--kopt-ref", "ref_softmax.py", "--kopt-dims", "M=4,N=16",
        "--kopt-seeds", "3,5", "-p", "no:cacheprovider", "-k", "correctness", *mode, timeout=300)
    assert (pytester.path / "statistics.py").is_file(), result.stdout.str()[-2000:]
    assert not (pytester.path / "imported").exists(), "a harness process imported the planted statistics.py"
    assert result.ret == 0, result.stdout.str()[-2000:]


# --------------------------------------------------------------- forged reports of the candidate's own process
# The candidate's process is the kernel's: harness code there can be patched. The judge (in the reference's
# process) checks what it is handed before it uses it (red team on the judge's move, 2026-12-03).

GATHER_REF = """\
atol = 1e-6
rtol = 1e-6
def shapes(M, N):
    return {"x": ((M, N), "float32"), "idx": ((M,), "int64"), "y": ((M, N), "float32")}
def reference(x, idx, y, **_):
    y.copy_(x[idx])
"""
HONEST_GATHER = """\
import torch
def setup(M, N, seed, device="cuda"):
    idx = torch.arange(M, device=device).flip(0)
    return {"inputs": {"x": torch.empty(M, N, device=device), "idx": idx, "y": torch.empty(M, N, device=device)},
            "outputs": ["y"]}
def run_kernel(x, idx, y):
    y.copy_(x[idx])
"""
# a wrong gather (row 0 everywhere) whose process ships idx = zeros to the judge while reporting the honest
# indices' hash: before, the wrong kernel passed and the honest one, judged next, met a poisoned reference
FORGED_SETUP = HONEST_GATHER.replace("y.copy_(x[idx])", "y.copy_(x[0].expand_as(y))") + """
import numpy as np
_savez = np.savez
def _forged(path, **arrays):  # numpy is not the harness's: its process's own check does not see this
    return _savez(path, **{k: np.zeros_like(v) if k == "setup__idx" else v for k, v in arrays.items()})
np.savez = _forged
"""
# a constant kernel whose process says its float input came from setup() and ships zeros for it
FORGED_SPEC = """\
import torch
import pytest_kopt.child.kernels as _k
_orig = _k.spec_from_setup
def _forged(torch_, result, path, keep=True, inplace=()):
    spec, scalars, kept, returned = _orig(torch_, result, path, keep=keep, inplace=inplace)
    for s in spec:
        if s["name"] == "x":
            s["source"] = "setup"
            kept["x"] = torch.zeros(s["shape"], dtype=torch.float32)
    return spec, scalars, kept, returned
_k.spec_from_setup = _forged
def setup(M, N, seed, device="cuda"):
    x = torch.empty(M, N, device=device)
    return {"inputs": {"x": x, "y": torch.empty_like(x)}, "outputs": ["y"]}
def run_kernel(x, y):
    y.fill_(1.0 / x.shape[-1])
"""
# a wrong layer norm that picks its own eps (a dim): the reference must get the dims'
EPS_REF = """\
atol = 1e-4
rtol = 1e-4
def shapes(M, N, **_):
    return {"x": ((M, N), "float32"), "b": ((N,), "float32"), "y": ((M, N), "float32")}
def reference(x, b, y, eps, **_):
    m = x.mean(-1, keepdim=True)
    v = x.var(-1, unbiased=False, keepdim=True)
    y.copy_((x - m) / (v + eps).sqrt() + b)
"""
EPS_CAND = """\
import torch
def setup(M, N, seed, eps, device="cuda"):
    return {"inputs": {"x": torch.empty(M, N, device=device), "b": torch.empty(N, device=device),
                       "y": torch.empty(M, N, device=device), "eps": 1e30}, "outputs": ["y"]}
def run_kernel(x, b, y, eps):
    y.copy_(b.expand_as(y))
"""
# a result that names a file outside the harness's work folder as its .npz
FOREIGN_NPZ = """\
import os
import torch
from pytest_kopt.child import candidate as _c
_result = _c.Keeper.result
def _forged(self, out, extra):
    got = _result(self, out, extra)
    return {**got, "npz": os.path.join(os.getcwd(), "victim.npz")}
_c.Keeper.result = _forged
def setup(M, N, seed, device="cuda"):
    x = torch.empty(M, N, device=device)
    return {"inputs": {"x": x, "y": torch.empty_like(x)}, "outputs": ["y"]}
def run_kernel(x, y):
    y.copy_(torch.softmax(x, dim=-1))
"""


def test_the_judge_checks_what_the_candidates_process_reports(pytester: pytest.Pytester) -> None:
    """A wrong gather that ships other setup() arrays than it reports is refused by the judge (RUNTIME_ERROR, on the
    kernel), and the honest gather judged next in the same session passes (the judge's kept reference is not
    poisoned); a scalar that contradicts a dim is a CONTRACT_ERROR on the kernel; a candidate that patches the
    harness's own functions to mark a float input as its own, or to name an .npz outside the work folder, is
    TAMPERED at its first request (child/sentinels.py), and the file is not deleted."""
    shutil.copy(Path(__file__).parent / "redteam" / "ref_softmax.py", pytester.path / "ref_softmax.py")
    pytester.makepyfile(ref_gather=GATHER_REF, honest_gather=HONEST_GATHER, forged_setup=FORGED_SETUP,
                        forged_spec=FORGED_SPEC, eps_ref=EPS_REF, eps_cand=EPS_CAND, foreign_npz=FOREIGN_NPZ)
    victim = pytester.path / "victim.npz"
    victim.write_bytes(b"keep me")
    runs = [("forged_setup.py", ["--kopt-candidate", "honest_gather.py"], "ref_gather.py", "M=8,N=16"),
            ("forged_spec.py", [], "ref_softmax.py", "M=8,N=64"),
            ("eps_cand.py", [], "eps_ref.py", "M=8,N=64,eps=1e-5"),
            ("foreign_npz.py", [], "ref_softmax.py", "M=8,N=64")]
    got = {}
    for i, (base, extra, ref, dims) in enumerate(runs):
        result = pytester.runpytest_subprocess("--kopt-baseline", base, *extra, "--kopt-ref", ref, "--kopt-dims", dims,
                                               "--kopt-seeds", "3", "-k", "correctness", "--kopt-json", f"r{i}.json",
                                               "-p", "no:cacheprovider", "-p", "no:xdist", timeout=300)
        for it in json.loads((pytester.path / f"r{i}.json").read_text())["items"]:
            got[it["nodeid"].split("::")[0]] = (it["status"], it.get("message") or "", result.stdout.str()[-2000:])
    assert got["forged_setup.py"][0] == "RUNTIME_ERROR" and "setup_sha" in got["forged_setup.py"][1], got
    assert got["honest_gather.py"][0] == "PASSED", got["honest_gather.py"]
    assert got["forged_spec.py"][0] == "TAMPERED" and "spec_from_setup" in got["forged_spec.py"][1], got
    assert got["eps_cand.py"][0] == "CONTRACT_ERROR" and "eps=1e+30 (dims: 1e-05)" in got["eps_cand.py"][1]
    assert got["foreign_npz.py"][0] == "TAMPERED" and "Keeper.result" in got["foreign_npz.py"][1], got
    assert victim.read_bytes() == b"keep me"


REF_SHAPE_ON_B = """\
atol = 1e-6
rtol = 1e-6
calls = [0]
def reference(x, **_):
    calls[0] += 1
    return x[:-1].clone() if calls[0] > 3 else x.clone()
"""
RETURNS_COPY = """\
import torch
def setup(n, seed, device="cuda"):
    return {"inputs": {"x": torch.empty(n, device=device)}, "outputs": ["y"]}
def run_kernel(x):
    return x.clone()
"""


def test_a_reference_whose_output_shape_changes_with_the_values_is_a_contract_error(pytester: pytest.Pytester) -> None:
    """The reference returns another shape on set B than on set A: a CONTRACT_ERROR naming the reference, where
    before the comparison raised ValueError and the item blamed the kernel."""
    pytester.makepyfile(ref=REF_SHAPE_ON_B, k=RETURNS_COPY)
    pytester.runpytest_subprocess("--kopt-baseline", "k.py", "--kopt-ref", "ref.py", "--kopt-dims", "n=64",
                                  "--kopt-seeds", "3", "-k", "correctness", "--kopt-json", "r.json",
                                  "-p", "no:cacheprovider", timeout=300)
    (item,) = [i for i in json.loads((pytester.path / "r.json").read_text())["items"] if i["gate"] == "correctness"]
    assert item["status"] == "CONTRACT_ERROR" and "other shapes" in item["message"], item
