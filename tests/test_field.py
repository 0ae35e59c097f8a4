"""Field cases from public bug reports and bad inputs: each one a clear verdict at the right gate, with the status,
the exit code and a message that names the cause and the fix (asserted through the ``--kopt-json`` report)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from pytest_kopt.errors import ConfigError
from pytest_kopt.gates import hardware
from pytest_kopt.gates.contract import parse_solve_signature
from pytest_kopt.gates.plan import CONTEXT_BYTES, memory_estimate
from pytest_kopt.gates.timing import unstable_causes
from pytest_kopt.settings import parse_dims

needs_nvcc = pytest.mark.skipif(hardware.find_tool("nvcc") is None, reason="nvcc not found")
needs_triton = pytest.mark.skipif(__import__("importlib.util").util.find_spec("triton") is None,
                                  reason="triton not installed")
needs_cutlass = pytest.mark.skipif(__import__("importlib.util").util.find_spec("cutlass_library") is None,
                                   reason="nvidia-cutlass not installed")

SCALE_REF = """\
atol = 1e-6
rtol = 1e-6
def shapes(n):
    return {"x": ((n,), "float32"), "y": ((n,), "float32")}
def reference(x, y, **_):
    y.copy_(2 * x)
"""
SCALE_CU = """\
#include <cuda_runtime.h>
__global__ void scale(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i];
}
extern "C" void solve(const float* x, float* y, int n) {
    scale<<<(n + 255) / 256, 256>>>(x, y, n);
}
"""
PY_SETUP = """\
import torch
def setup(n, seed, device="cuda"):
    x = {x}
    y = {y}
    return {{"inputs": {{"x": x, "y": y}}, "outputs": ["y"]}}
def run_kernel(x, y):
    y.copy_(2 * x)
"""


def session(pytester: pytest.Pytester, *args: str) -> tuple[pytest.RunResult, dict[str, dict], dict]:
    """A subprocess session; its JSON report's items by node id (without the file part), and the report."""
    result = pytester.runpytest_subprocess(*args, "--kopt-json", "r.json", "-p", "no:cacheprovider", timeout=600)
    path = pytester.path / "r.json"
    assert path.is_file(), result.stdout.str()[-3000:] + result.stderr.str()[-2000:]
    doc = json.loads(path.read_text())
    return result, {i["nodeid"].split("::", 1)[1]: i for i in doc["items"]}, doc


def failed_at(items: dict[str, dict], gate: str, status: str) -> dict:
    item = items[gate]
    assert (item["outcome"], item["status"]) == ("failed", status), item
    return item


# ------------------------------------------------------------------------------------------ silently passed

ARCH_GUARDED = SCALE_CU.replace("    int i = blockIdx.x", "#if __CUDA_ARCH__ >= 1000\n    int i = blockIdx.x").replace(
    "    if (i < n) y[i] = 2.0f * x[i];\n", "    if (i < n) y[i] = 2.0f * x[i];\n#endif\n")


@needs_nvcc
def test_a_kernel_compiled_out_by_an_arch_guard_fails_sass(pytester: pytest.Pytester) -> None:
    """A kernel whose body is under ``#if __CUDA_ARCH__ >= 1000``, built for sm_90a, is ``LDC; EXIT``: sass fails
    as EMPTY_KERNEL naming the function and the guard's line (before, it passed on 16 instructions)."""
    pytester.makefile(".cu", k=ARCH_GUARDED)
    pytester.makepyfile(ref=SCALE_REF)
    result, items, doc = session(pytester, "--kopt-baseline", "k.cu", "--kopt-ref", "ref.py", "--kopt-dims", "n=64",
                                 "--kopt-seeds", "1", "-k", "compile or sass")
    item = failed_at(items, "sass", "EMPTY_KERNEL")
    assert "_Z5scalePKfPfi" in item["message"] and "compiled out for this arch" in item["message"]
    result.stdout.fnmatch_lines(["*k.cu:3: #if __CUDA_ARCH__ >= 1000*", "*fix: give sm_90a a code path*"])
    assert doc["exit_code"] == result.ret == 2


@needs_nvcc
def test_a_solve_without_a_kernel_of_its_own_is_not_applicable_for_sass(pytester: pytest.Pytester) -> None:
    """solve() that only copies (or calls a library): sass is NOT_APPLICABLE with the reason, not a
    HARDWARE_UNAVAILABLE "PTX only?" failure."""
    pytester.makefile(".cu", k='#include <cuda_runtime.h>\nextern "C" void solve(const float* x, float* y, int n) '
                               '{ cudaMemcpy(y, x, n * 4, cudaMemcpyDeviceToDevice); }\n')
    pytester.makepyfile(ref=SCALE_REF)
    result, items, doc = session(pytester, "--kopt-baseline", "k.cu", "--kopt-ref", "ref.py", "--kopt-dims", "n=64",
                                 "--kopt-seeds", "1", "-k", "compile or sass")
    assert (items["sass"]["outcome"], items["sass"]["status"]) == ("skipped", "NOT_APPLICABLE"), items["sass"]
    assert "launches no kernel of its own" in items["sass"]["message"]
    assert result.ret == 0


COL_REF = SCALE_REF.replace('"x": ((n,), "float32"), "y": ((n,), "float32")',
                            '"x": ((8, n // 8), "float32"), "y": ((8, n // 8), "float32")')


@pytest.mark.parametrize(("ref", "x", "y", "buffer", "message"), [
    (COL_REF, "torch.empty(n // 8, 8, device=device).t()", "torch.empty(8, n // 8, device=device)", "x",
     "has strides [1, 8], not [8, 1]"),
    (SCALE_REF, "torch.empty(n, device=device)", "torch.empty(1, device=device).expand(n)", "y",
     "share memory (an expand() or a stride of 0)"),
])
def test_layout_belongs_to_the_harness(pytester: pytest.Pytester, ref: str, x: str, y: str, buffer: str,
                                       message: str) -> None:
    """A setup() buffer in a layout the problem does not give (column-major), or one whose elements share memory
    (an expand()): the plan gate fails with CONTRACT_ERROR naming the buffer and the fix (before, the first passed on
    the layout it chose, the second crashed the harness with SIGSEGV)."""
    pytester.makepyfile(ref=ref, k=PY_SETUP.format(x=x, y=y))
    result, items, doc = session(pytester, "--kopt-baseline", "k.py", "--kopt-ref", "ref.py", "--kopt-dims", "n=64",
                                 "--kopt-seeds", "1")
    item = failed_at(items, "plan", "CONTRACT_ERROR")
    assert message in item["message"] and f"'{buffer}'" in item["message"], item["message"]
    assert items["correctness[seed=1]"]["blocked_by"] == "plan"
    assert doc["exit_code"] == result.ret == 4


def test_a_problem_that_cannot_fit_is_refused_with_the_estimate(pytester: pytest.Pytester) -> None:
    """A problem of terabytes: where a gate will allocate it here (a Python candidate's correctness on the CPU), the
    plan gate refuses it with the figure and the fix; a .cu on a machine without a GPU gets the estimate reported
    (before, such a run exited 0 with no estimate). The H200 check refuses it against the GPU's free memory."""
    pytester.makepyfile(ref=SCALE_REF, k=PY_SETUP.format(x="torch.empty(n, device=device)",
                                                         y="torch.empty(n, device=device)"))
    result, items, doc = session(pytester, "--kopt-baseline", "k.py", "--kopt-ref", "ref.py", "--kopt-dims",
                                 f"n={10**12}", "--kopt-seeds", "1")
    item = failed_at(items, "plan", "TOO_LARGE")
    assert "of this machine's memory" in item["message"] and "3725.3 GiB each" in item["message"]
    assert "smaller --kopt-dims" in result.stdout.str() and items["correctness[seed=1]"]["blocked_by"] == "plan"
    assert doc["exit_code"] == result.ret == 4
    # the refusal keeps its estimate: in the item's figures and in plan.json (before: neither)
    assert item["figures"]["set_bytes"] == 8 * 10**12 and item["figures"]["buffers"] == 2
    plan = json.loads(next(pytester.path.glob(".kopt/**/plan.json")).read_text())
    assert plan["estimate"]["set_bytes"] == 8 * 10**12
    pytester.makefile(".cu", k=SCALE_CU.replace("int n", "long long n"))
    _, items, _ = session(pytester, "--kopt-baseline", "k.cu", "--kopt-ref", "ref.py", "--kopt-dims", f"n={10**12}",
                          "--kopt-seeds", "1", "-k", "plan")
    if not hardware.probe_gpus()["gpus"]:
        assert items["plan"]["status"] == "PASSED" and items["plan"]["figures"]["set_bytes"] == 8 * 10**12
        assert "7450.6 GiB per set" in items["plan"]["summary"]
        assert "per harness process (no GPU to check against)" in items["plan"]["summary"]


def test_the_plan_reports_the_estimate(pytester: pytest.Pytester) -> None:
    """A case that fits: the plan item says how much a set and a harness process take, in its figures."""
    pytester.makefile(".cu", k=SCALE_CU)
    pytester.makepyfile(ref=SCALE_REF)
    result, items, _ = session(pytester, "--kopt-baseline", "k.cu", "--kopt-ref", "ref.py", "--kopt-dims",
                               "n=1048576", "--kopt-seeds", "1", "-k", "plan")
    plan = items["plan"]
    assert plan["status"] == "PASSED", result.stdout.str()[-2000:]
    assert plan["figures"]["set_bytes"] == 8 * 2**20 and plan["figures"]["buffers"] == 2
    assert "8 MiB per set" in plan["summary"]


def test_memory_estimate_counts_every_copy() -> None:
    """The estimate's parts (bytes): 2 sets + the inputs + the four calls' kept outputs for the candidate; for the
    judge 1 set + 2 x inputs + both sides' four outputs + the fast path's float64 blocks, beside the candidate's
    kept outputs; the rotating sets + the L2 flush for timing; 8 x outputs on the host."""
    spec = [{"name": "x", "role": "input", "shape": [1024], "dtype": "float32"},
            {"name": "y", "role": "output", "shape": [512], "dtype": "float16"}]
    est = memory_estimate(spec, l2_bytes=1000, rotating_fraction=0.25, free_bytes=10_000)
    assert (est["set_bytes"], est["input_bytes"], est["output_bytes"]) == (5120, 4096, 1024)
    assert est["candidate_bytes"] == 2 * 5120 + 4096 + 4 * 1024 + CONTEXT_BYTES
    assert est["reference_bytes"] == 5120 + 2 * 4096 + 8 * 1024 + 6 * 8 * 1024 + CONTEXT_BYTES
    assert est["timing_bytes"] == 1 * 5120 + 2000 + CONTEXT_BYTES
    assert est["host_bytes"] == 8 * 1024
    assert est["device_bytes"] == est["reference_bytes"] + 4 * 1024 > est["candidate_bytes"]


def test_nan_policy_catches_an_output_left_unwritten_where_the_reference_is_nan(pytester: pytest.Pytester) -> None:
    """The reference is NaN at the last element; a kernel that never writes it keeps the poison there: UNWRITTEN,
    where before the NaN poison matched the NaN reference and the item passed. A pass record counts NaNs."""
    pytester.makepyfile(ref=SCALE_REF.replace("y.copy_(2 * x)", "y.copy_(2 * x); y[-1] = float('nan')"),
                        hole=PY_SETUP.format(x="torch.empty(n, device=device)", y="torch.empty(n, device=device)")
                        .replace("y.copy_(2 * x)", "y[:-1].copy_(2 * x[:-1])"),
                        good=PY_SETUP.format(x="torch.empty(n, device=device)", y="torch.empty(n, device=device)")
                        .replace("y.copy_(2 * x)", "y.copy_(2 * x); y[-1] = float('nan')"))
    result, items, _ = session(pytester, "--kopt-baseline", "good.py", "--kopt-candidate", "hole.py", "--kopt-ref",
                               "ref.py", "--kopt-dims", "n=64", "--kopt-seeds", "1", "-k", "correctness")
    doc = json.loads((pytester.path / "r.json").read_text())
    by = {i["nodeid"]: i for i in doc["items"]}
    good, hole = by["good.py::correctness[seed=1]"], by["hole.py::correctness[seed=1]"]
    assert good["status"] == "PASSED" and (good["figures"]["nan_out"], good["figures"]["nan_ref"]) == (1, 1)
    assert hole["status"] == "UNWRITTEN" and "1 element(s) left unwritten" in hole["message"]
    result.stdout.fnmatch_lines(["*unwritten at [[]63[]] (the reference is NaN there too)*"])


@needs_nvcc
@needs_cutlass
def test_a_wrong_cutlass_path_warns_and_says_which_headers_were_used(pytester: pytest.Pytester,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """CUTLASS_PATH=/nonexistent: a KoptCutlassWarning names it and the headers used instead, and the compile item
    says where the headers came from (before, the wheel's headers were used silently)."""
    ex = Path(__file__).resolve().parent.parent / "examples" / "gemm_cutlass"
    for f in ex.iterdir():
        (pytester.path / f.name).write_bytes(f.read_bytes())
    monkeypatch.setenv("CUTLASS_PATH", "/nonexistent")
    result, items, _ = session(pytester, "--kopt-baseline", "gemm_cutlass.cu", "--kopt-ref", "ref.py",
                               "--kopt-dims", "M=128,N=128,K=64", "--kopt-seeds", "1", "-k", "compile", "-W",
                               "always")
    assert items["compile"]["status"] == "PASSED", result.stdout.str()[-2000:]
    assert "CUTLASS headers from" in items["compile"]["summary"]
    assert items["compile"]["figures"]["cutlass_include"].endswith("include")
    result.stdout.fnmatch_lines(["*KoptCutlassWarning: CUTLASS_PATH=/nonexistent holds no include/cutlass/cutlass.h*"])


def test_solve_chosen_by_ifdef_is_the_branch_nvcc_compiles() -> None:
    """#ifdef picks solve(): preflight reads the branch the host pass compiles (undefined macros are 0), not the
    first one it sees."""
    src = textwrap.dedent("""\
        #ifdef USE_FAST
        extern "C" void solve(const float* a, float* b, int n) {}
        #else
        extern "C" void solve(const float* x, float* y, int n) {}
        #endif
        """)
    assert [p.name for p in parse_solve_signature(src, "k.cu")] == ["x", "y", "n"]
    assert [p.name for p in parse_solve_signature("#define USE_FAST\n" + src, "k.cu")] == ["a", "b", "n"]


def test_reference_names_that_match_no_buffer_fail_preflight(pytester: pytest.Pytester) -> None:
    """solve(a, b) and reference(x, y, **kwargs): a preflight CONTRACT_ERROR naming both sets of names (before,
    **kwargs made preflight pass and a CPU run was green)."""
    pytester.makefile(".cu", k=SCALE_CU.replace("const float* x, float* y, int n) {\n    scale", "const float* a, "
                                                "float* b, int n) {\n    scale").replace("(x, y, n);", "(a, b, n);"))
    pytester.makepyfile(ref="def reference(x, y, **kwargs):\n    y.copy_(2 * x)\n")
    result, items, doc = session(pytester, "--kopt-baseline", "k.cu", "--kopt-ref", "ref.py", "--kopt-dims", "n=64",
                                 "--kopt-seeds", "1")
    item = failed_at(items, "preflight", "CONTRACT_ERROR")
    assert "reference() takes x, y" in item["message"] and "solve's buffers: a, b" in item["message"]
    assert doc["exit_code"] == result.ret == 4


@needs_nvcc
def test_cutlass_included_through_a_local_header_is_detected(pytester: pytest.Pytester) -> None:
    """A .cu that includes CUTLASS through its own header is a CUTLASS kernel (preflight says so, and the build
    gets CUTLASS's include folders) instead of failing with "cutlass/...: No such file"."""
    pytester.makefile(".cuh", wrap="#pragma once\n#include <cutlass/cutlass.h>\n")
    pytester.makefile(".cu", k='#include "wrap.cuh"\n' + SCALE_CU)
    pytester.makepyfile(ref=SCALE_REF)
    _, items, _ = session(pytester, "--kopt-baseline", "k.cu", "--kopt-ref", "ref.py", "--kopt-dims", "n=64",
                          "--kopt-seeds", "1", "-k", "preflight or compile")
    assert items["preflight"]["figures"]["kind"] == "cutlass"
    if __import__("importlib.util").util.find_spec("cutlass_library") is not None:
        assert items["compile"]["status"] == "PASSED", items["compile"]


# ------------------------------------------------------------------------------------------ wrong gate or verdict

BF16_REF = """\
import torch
atol = 0
rtol = 1e-2
def shapes(M, K):
    return {"a": ((M, K), "bfloat16"), "b": ((K,), "bfloat16"), "y": ((M,), "bfloat16")}
def reference(a, b, y, **_):
    # accumulated in the inputs' dtype, 64 products at a time: in bf16 each partial sum rounds (percent errors)
    acc = torch.zeros_like(y)
    for k in range(0, a.shape[1], 64):
        acc += a[:, k:k + 64] @ b[k:k + 64]
    y.copy_(acc)
"""
BF16_KERNEL = """\
import torch
def setup(M, K, seed, device="cuda"):
    a = torch.empty(M, K, dtype=torch.bfloat16, device=device)
    b = torch.empty(K, dtype=torch.bfloat16, device=device)
    return {"inputs": {"a": a, "b": b, "y": torch.empty(M, dtype=torch.bfloat16, device=device)}, "outputs": ["y"]}
def run_kernel(a, b, y):
    y.copy_((a.float() @ b.float()).to(torch.bfloat16))
"""


def test_a_tolerance_the_reference_itself_cannot_meet_is_a_contract_error(pytester: pytest.Pytester) -> None:
    """A bf16 reference with atol=0, rtol=1e-2 against a kernel that accumulates in fp32, at K=4096: not "fix the
    kernel" but UNMEETABLE_TOLERANCE (exit 4), with the reference's own error against float64."""
    pytester.makepyfile(ref=BF16_REF, k=BF16_KERNEL)
    result, items, doc = session(pytester, "--kopt-baseline", "k.py", "--kopt-ref", "ref.py", "--kopt-dims",
                                 "M=64,K=4096", "--kopt-seeds", "1", "-k", "correctness")
    item = failed_at(items, "correctness[seed=1]", "UNMEETABLE_TOLERANCE")
    assert "the reference cannot meet its own tolerance: against float64" in item["message"]
    assert "loosen atol/rtol" in result.stdout.str()
    assert doc["exit_code"] == result.ret == 4


SLOW_TRITON = """\
import torch
import triton
import triton.language as tl


@triton.jit
def slow(x_ptr, y_ptr, n, REPS: tl.constexpr):
    i = tl.program_id(0)
    acc = tl.load(x_ptr + i)
    for _ in range(REPS):
        acc = acc * 1.0
    tl.store(y_ptr + i, 2 * acc)


def setup(n, seed, device="cuda"):
    x = torch.empty(n, device=device)
    return {"inputs": {"x": x, "y": torch.empty_like(x)}, "outputs": ["y"]}


def run_kernel(x, y):
    slow[(x.numel(),)](x, y, x.numel(), REPS=100000)
"""


@needs_triton
def test_a_slow_kernel_under_the_interpreter_is_told_so(pytester: pytest.Pytester) -> None:
    """A Triton kernel too slow for the CPU interpreter hits --kopt-timeout: the fix names the interpreter and
    smaller dims, not an infinite loop."""
    pytester.makepyfile(ref=SCALE_REF, k=SLOW_TRITON)
    result, items, _ = session(pytester, "--kopt-baseline", "k.py", "--kopt-ref", "ref.py", "--kopt-dims",
                               "n=4096", "--kopt-seeds", "1", "--kopt-timeout", "3", "-k", "correctness")
    failed_at(items, "correctness[seed=1]", "TIMEOUT")
    result.stdout.fnmatch_lines(["*fix: Triton's interpreter runs the kernel on the CPU*smaller --kopt-dims*"])


@pytest.mark.parametrize(("kernel", "dims", "gate", "words"), [
    (PY_SETUP.format(x="torch.empty(n, device=device)", y="torch.empty(n, device=device)").replace(
        "def setup(n, seed", "def setup(n, k, seed"), "n=64", "preflight", "setup() needs k, which --kopt-dims does not give"),
    (PY_SETUP.format(x="torch.empty(n, device=device)", y="torch.empty(n, device=device)"), "n=-1", "preflight",
     "n=-1: setup() takes sizes"),
    (PY_SETUP.format(x="torch.empty(n, device=device)", y="torch.empty(n, device=device)").replace(
        '"outputs": ["y"]', '"outputs": []'), "n=64", "preflight", "setup() lists no outputs"),
    (PY_SETUP.format(x="torch.empty(n, device=device)", y="torch.empty(n, device=device)"), "n=0", "plan",
     "has no elements"),
])
def test_bad_dims_and_setups_fail_before_anything_runs(pytester: pytest.Pytester, kernel: str, dims: str, gate: str,
                                                       words: str) -> None:
    """Missing dims for setup(), a negative size, no outputs at all, an empty problem: each a
    CONTRACT_ERROR at preflight (or at plan, which sees the buffers) naming the dim or buffer, exit 4 (before, each
    failed at compile or correctness with a harness traceback)."""
    pytester.makepyfile(ref=SCALE_REF, k=kernel)
    result, items, doc = session(pytester, "--kopt-baseline", "k.py", "--kopt-ref", "ref.py", "--kopt-dims", dims,
                                 "--kopt-seeds", "1")
    item = failed_at(items, gate, "CONTRACT_ERROR")
    assert words in item["message"], item["message"]
    assert doc["exit_code"] == result.ret == 4


def test_dims_are_ascii_numbers_with_leading_zeros_allowed() -> None:
    """``M=08`` is the integer 8 (not 8.0), hex stays hex, other scripts' digits are refused."""
    assert parse_dims("M=08,N=0x10") == {"M": 8, "N": 16} and type(parse_dims("M=08")["M"]) is int
    with pytest.raises(ConfigError, match="ASCII digits"):
        parse_dims("M=٦٤")


def test_a_mistyped_option_gets_a_did_you_mean(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess("--kopt-dim", "M=4", timeout=120)
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*unknown option --kopt-dim*", "*did you mean --kopt-dims?*"])


@needs_nvcc
def test_compiler_warnings_show_in_the_compile_item(pytester: pytest.Pytester) -> None:
    """nvcc's warnings are in the compile item's summary and figures (before, only in the build cache's
    manifest)."""
    pytester.makefile(".cu", k=SCALE_CU.replace("    int i =", "    int unused = 3;\n    int i ="))
    pytester.makepyfile(ref=SCALE_REF)
    _, items, _ = session(pytester, "--kopt-baseline", "k.cu", "--kopt-ref", "ref.py", "--kopt-dims", "n=64",
                          "--kopt-seeds", "1", "-k", "compile")
    c = items["compile"]
    assert c["status"] == "PASSED" and c["figures"]["compiler_warnings"] >= 1
    assert "k.cu:3: warning" in c["figures"]["first_warning"] and "compiler warning(s)" in c["summary"]


# ------------------------------------------------------------------------------------------ a false alarm

def test_unstable_timing_is_diagnosed_before_it_fails() -> None:
    """What the timed process recorded names the cause: host work inside solve() (launches longer than the stream
    hold), another process on the GPU, throttled clocks; host work and other processes lead to one more
    measurement (a longer hold; a short wait)."""
    busy = {"hold_us": 50.0, "launch_host_us": [20.0] * 80 + [400.0] * 20, "gpu_processes": [{"pid": 4242}],
            "throttled": [False] * 100}
    got = unstable_causes(busy)
    assert len(got["causes"]) == 2 and "20% of the samples" in got["causes"][0] and "pids 4242" in got["causes"][1]
    assert got["remedy"] == "with a 820 µs hold and after 2 s" and got["hold_us"] == 820.0 and got["wait_s"] == 2.0
    quiet = unstable_causes({"hold_us": 50.0, "launch_host_us": [20.0] * 100, "gpu_processes": [],
                             "throttled": [True] * 30 + [False] * 70})
    assert quiet["remedy"] == "" and quiet["causes"] == ["30 of 100 samples ran at throttled clocks (power/thermal "
                                                         "slowdown or an SM clock under 75% of its maximum)"]


def test_the_sessions_own_processes_are_not_other_load_on_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The unstable-timing diagnosis names other processes on the GPU; the session's own reference and candidate
    processes (descendants of the pytest controller, KOPT_SESSION_PID) hold contexts too and are not that load
    (before: only the timed process itself was left out, so a quiet GPU read as shared)."""
    import os
    import subprocess

    from pytest_kopt.child.clocks import same_session

    monkeypatch.setenv("KOPT_SESSION_PID", str(os.getpid()))
    child = subprocess.Popen(["sleep", "5"])
    grandchild = subprocess.Popen(["sh", "-c", "sleep 5 & wait"])
    try:
        assert same_session(child.pid) and same_session(grandchild.pid) and same_session(os.getpid())
        assert not same_session(1) and not same_session(os.getppid())
        assert not same_session(child.pid, root=os.getppid() + 10**6)
    finally:
        child.kill()
        grandchild.kill()


def test_cupti_records_split_into_calls_by_when_the_host_launched_them() -> None:
    """A call whose kernel is the flush's own (torch.sum: the H200's fidelity run read sum_4M as 'no kernel of the
    call was recorded', every one taken for a flush) is still one call per flush; a side-stream kernel that runs
    during the next flush stays its call's; a record without a launch is counted, never placed."""
    from pytest_kopt.child.cupti import calls_by_launch

    windows = [(0.0, 5.0), (10.0, 15.0), (20.0, 25.0)]  # host time of each flush's range
    launches = {1: 1.0, 2: 6.0, 3: 11.0, 4: 16.0, 5: 17.0, 6: 21.0, 7: -3.0}
    records = [(100, 140, "reduce_kernel", 1), (141, 150, "reduce_kernel", 2),  # flush, then a call's torch.sum
               (150, 190, "reduce_kernel", 3), (191, 200, "reduce_kernel", 4), (195, 230, "side", 5),
               (230, 270, "reduce_kernel", 6), (0, 1, "setup", 7), (300, 301, "orphan", 99)]
    segments, unmatched = calls_by_launch(records, launches, windows)
    assert [[n for _, _, n in seg] for seg in segments] == [["reduce_kernel"], ["reduce_kernel", "side"], []]
    assert segments[1] == [(191, 200, "reduce_kernel"), (195, 230, "side")] and unmatched == 1


def test_cupti_records_split_into_calls_at_each_whole_flush() -> None:
    """The flush (a sum over 2x L2) launches two kernels on an H200; each pair is one boundary, so a call of one
    kernel is one segment of one record (before: every flush read as two boundaries, and each call as an empty one
    beside a full one, 50 empty calls of 50). A call that launched nothing is still an empty segment."""
    from pytest_kopt.child.cupti import call_segments

    f = {"reduce", "fill"}
    ev = [(0, 1, "fill"), (1, 2, "reduce"), (3, 4, "k"), (5, 6, "fill"), (6, 7, "reduce"), (8, 9, "k"), (9, 10, "k2"),
          (11, 12, "fill"), (12, 13, "reduce"), (14, 15, "fill"), (15, 16, "reduce"), (17, 18, "k")]
    segs = call_segments(ev, f, 2)
    assert [[n for _, _, n in s] for s in segs] == [["k"], ["k", "k2"], [], ["k"]]
    assert [[n for _, _, n in s] for s in call_segments([(0, 1, "f"), (2, 3, "k"), (4, 5, "f")], {"f"}, 1)] \
        == [["k"], []]


def test_cupti_python_records_become_device_records_and_launches() -> None:
    """cupti-python's activity records (kernels, memcpy, memset; the runtime and driver calls) become the device
    records (start µs, end µs, name, correlation id) and the launches (correlation id -> host µs) that
    calls_by_launch splits; a record of no duration and kinds it did not ask for are left out. The records are
    built here in cupti-python's shape: what an H200 delivers is checked by the GPU tests."""
    from types import SimpleNamespace as R

    from pytest_kopt.child.cupti import CuptiActivity

    kinds = {"CONCURRENT_KERNEL": 10, "MEMCPY": 1, "MEMSET": 2, "RUNTIME": 5, "DRIVER": 6, "OVERHEAD": 13}
    act = CuptiActivity.__new__(CuptiActivity)  # the parsing alone: no CUPTI here
    act._kernel, act._names, act._api = 10, {1: "Memcpy", 2: "Memset"}, {5, 6}
    act.device, act.launches = [], {}
    # CUPTI's timestamps count ns since the Unix epoch (an H200's read 1796289127342887185 on 2026-12-03): as float
    # µs they keep only quarter-µs steps, so a 1.408 µs kernel read 1.25 or 1.5 µs; times are µs after the
    # session's start
    act.origin = t0 = 1_796_289_127_342_000_000
    act._completed([
        R(kind=kinds["RUNTIME"], correlation_id=7, start=t0 + 1_000, end=t0 + 3_000),
        R(kind=kinds["CONCURRENT_KERNEL"], correlation_id=7, start=t0 + 10_000, end=t0 + 11_408, name="add"),
        R(kind=kinds["DRIVER"], correlation_id=8, start=t0 + 4_000, end=t0 + 5_000),
        R(kind=kinds["MEMSET"], correlation_id=8, start=t0 + 36_000, end=t0 + 37_000),
        R(kind=kinds["MEMCPY"], correlation_id=9, start=t0 + 40_000, end=t0 + 40_000),  # no duration
        R(kind=kinds["OVERHEAD"], correlation_id=0, start=t0 + 1, end=t0 + 2),
        R(kind=kinds["RUNTIME"], correlation_id=7, start=t0 + 9_000, end=t0 + 9_500),  # the first call's id stands
    ])
    assert act.device == [(10.0, 11.408, "add", 7), (36.0, 37.0, "Memset", 8)]
    assert act.device[0][1] - act.device[0][0] == pytest.approx(1.408, abs=1e-9)
    assert act.launches == {7: 1.0, 8: 4.0}


def test_without_cupti_python_the_profiler_backend_is_torchs_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where cupti-python is not installed, kernel-only timing goes through torch's profiler, and the record says
    why and how to get the faster start (CUPTI through torch's profiler starts in 3.5-4.7 s per process on an H200,
    through cupti-python in about 0.02 s). Asking for torch's profiler skips cupti-python."""
    import sys

    from pytest_kopt.child import cupti as timer

    monkeypatch.setitem(sys.modules, "cupti", None)  # import cupti -> ImportError
    monkeypatch.setattr(timer, "_BACKEND", {})
    got = timer.profiler_backend()
    assert got["name"] == "torch.profiler" and got["activity"] is None
    assert "pip install cupti-python" in got["note"] and got["warm_s"] >= 0
    assert timer.profiler_warm() and timer.warm_profiler() == 0.0 and timer.profiler_backend() is got
    monkeypatch.setattr(timer, "_BACKEND", {})
    assert timer.profiler_backend("torch.profiler")["note"] == "not tried (torch.profiler asked for)"
    with pytest.raises(ValueError, match="cupti-python"):
        timer.profiler_backend("cupti-python")


def test_a_cupti_session_that_cannot_start_leaves_no_kind_enabled() -> None:
    """When CUPTI refuses one activity kind (a CUPTI newer than the driver, or another client), the kinds already
    enabled are disabled again before the error goes up, so torch's profiler, the fallback, finds CUPTI as it was."""
    from types import SimpleNamespace

    from pytest_kopt.child.cupti import CuptiActivity

    enabled: list[str] = []

    def enable(kind: str) -> None:
        if kind == "RUNTIME":
            raise RuntimeError("CUPTI_ERROR_NOT_INITIALIZED")
        enabled.append(kind)

    act = CuptiActivity.__new__(CuptiActivity)
    act.cupti = SimpleNamespace(get_timestamp=lambda: 1_796_289_127_342_000_000, activity_enable=enable,
                                activity_disable=enabled.remove)
    act.kinds = ["CONCURRENT_KERNEL", "MEMCPY", "MEMSET", "RUNTIME", "DRIVER"]
    with pytest.raises(RuntimeError, match="NOT_INITIALIZED"):
        act.start()
    assert enabled == []


def test_cupti_kernel_names_read_as_torchs_profiler_shows_them() -> None:
    """CUPTI's records carry mangled names; kopt shows them demangled whichever client recorded (the suspect
    message names the kernels), and leaves a C or Triton name as it is."""
    from pytest_kopt.child.cupti import demangle

    assert demangle("_Z11sgemm_naivePKfS0_Pfiii") == "sgemm_naive(float const*, float const*, float*, int, int, int)"
    assert demangle("triton_poi_fused_add_0") == "triton_poi_fused_add_0"
    assert demangle("_Znot_a_name") == "_Znot_a_name"


class _FakeActivity:
    """A stand-in for :class:`~pytest_kopt.child.cupti.CuptiActivity` whose clock advances 1 µs a read and whose
    'GPU' records a kernel for each launch the fake timer makes."""

    def __init__(self, record: bool = True) -> None:
        self.clock, self.device, self.launches, self.record, self.log = 0.0, [], {}, record, []
        self.api, self.api_note = "all", None

    def now_us(self) -> float:
        self.clock += 1.0
        return self.clock

    def start(self) -> None:
        self.device, self.launches = [], {}
        self.log.append("start")

    def stop(self) -> None:
        self.log.append("stop")

    def launch(self, name: str) -> None:
        t = self.now_us()
        corr = len(self.launches) + 1
        self.launches[corr] = t
        if self.record:
            self.device.append((100.0 + t, 100.5 + t, name, corr))


def _fake_timer(act: _FakeActivity) -> object:
    from types import SimpleNamespace

    return SimpleNamespace(
        torch=SimpleNamespace(cuda=SimpleNamespace(synchronize=lambda: None)), sets=["s0", "s1"], hold_us=10.0,
        t={}, flush=lambda: act.launch("flush"), hold=lambda us: act.launch("spin"),
        refresh=lambda s, k: act.launch("refresh"), launch=lambda s: act.launch(f"kernel_{s}"))


def test_cupti_python_batches_bracket_each_flush_in_its_window_and_split_by_launch(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Through cupti-python, each call's window (CUPTI's clock read on the host around the refresh, flush and spin)
    holds those launches and not the call's, so calls_by_launch gives each call its own kernel only; the session
    is started and stopped once per batch."""
    from pytest_kopt.child import cupti as tm

    act = _FakeActivity()
    monkeypatch.setattr(tm, "_BACKEND", {"name": "cupti-python", "activity": act, "note": None, "warm_s": 0.0})
    got = tm.kernel_times(_fake_timer(act), calls=4, hold_us=5.0)
    assert got["backend"] == "cupti-python" and got["split"] == "launch" and got["empty_calls"] == 0
    assert got["launch_sets"] == [{"kernels": ["kernel_s0"], "calls": 2}, {"kernels": ["kernel_s1"], "calls": 2}]
    assert got["spans_us"] == [0.5] * 4 and set(got["flush_names"]) == {"flush", "spin"}
    assert act.log == ["start", "stop", "start", "stop"]  # the flush probe, then the batch


def test_a_profiled_call_ends_before_the_next_window_is_queued(monkeypatch: pytest.MonkeyPatch) -> None:
    """The host launches nothing while a profiled call runs: each call's launch is followed by a device
    synchronisation before the next call's refresh, flush and spin are queued (launches queued behind a call
    lengthened a two-kernel torch.sum by up to 1 µs on the H200, docs/timing.md)."""
    from pytest_kopt.child import cupti as tm

    act = _FakeActivity()
    monkeypatch.setattr(tm, "_BACKEND", {"name": "cupti-python", "activity": act, "note": None, "warm_s": 0.0})
    timer = _fake_timer(act)
    order: list[str] = []
    timer.torch.cuda.synchronize = lambda: order.append("sync")  # type: ignore[attr-defined]
    launch, stop = act.launch, act.stop
    monkeypatch.setattr(act, "launch", lambda name: (order.append(name), launch(name)))
    monkeypatch.setattr(act, "stop", lambda: (order.append("stop"), stop()))
    got = tm.kernel_times(timer, calls=3, hold_us=5.0)  # a flush alone first (its names), then the 3 calls
    assert got["calls"] == 3
    kernels = [i for i, x in enumerate(order) if x.startswith("kernel_")]
    assert len(kernels) == 3 and all(order[i + 1] == "sync" for i in kernels)
    assert order[kernels[0] + 2:kernels[1]] == ["flush", "spin"]  # the next window, queued after the sync
    # CUPTI delivers finished work only: each batch, the flush-alone one too, ends with the device synchronised
    stops = [i for i, x in enumerate(order) if x == "stop"]
    assert len(stops) == 2 and all(order[i - 1] == "sync" for i in stops), order


def _cupti_with_api_switches(fail: bool | str = False) -> tuple[object, dict[tuple[str, int], int]]:
    """A stand-in for cupti-python's module: two runtime and three driver calls in its enums, and switches that
    remember what was set per (domain, callback id); ``fail``: True, a CUPTI without the switches; a domain, a
    CUPTI that does not know that domain's first call."""
    import enum
    from types import SimpleNamespace

    switched: dict[tuple[str, int], int] = {}

    def switch(domain: str):  # noqa: ANN202
        def set_(cbid: int, on: int) -> None:
            if fail is True or (fail == domain and cbid == 1):
                raise RuntimeError("CUPTI_ERROR_NOT_SUPPORTED")
            switched[(domain, cbid)] = on
        return set_

    runtime = enum.IntEnum("runtime_api_trace_cbid", {"INVALID": 0, "cudaGetDevice_v3020": 1,
                                                     "cudaLaunchKernel_v7000": 2, "SIZE": 3})
    driver = enum.IntEnum("driver_api_trace_cbid", {"cuCtxGetCurrent": 1, "cuMemsetD8Async": 2,
                                                   "cuMemcpyHtoDAsync_v2": 3, "FORCE_INT": 4})
    enabled: list[str] = []
    mod = SimpleNamespace(runtime_api_trace_cbid=runtime, driver_api_trace_cbid=driver,
                          activity_enable_runtime_api=switch("runtime"), activity_enable_driver_api=switch("driver"),
                          get_timestamp=lambda: 1_796_289_127_342_000_000, activity_enable=enabled.append,
                          activity_disable=enabled.remove)
    return mod, switched


def test_a_cupti_session_records_only_the_calls_that_launch_device_work() -> None:
    """A profiled call's records link each kernel to its launch through the runtime or driver call that queued it;
    the records of every other call (69 per call of a torch.mm with its flush window on an H100, each handed to
    Python) are switched off at each session's start. A CUPTI without the per-call switches records every call and
    says so."""
    from pytest_kopt.child.cupti import CuptiActivity

    mod, switched = _cupti_with_api_switches()
    act = CuptiActivity.__new__(CuptiActivity)
    act.cupti, act.kinds, act.api, act.api_note, act._quiet = mod, ["RUNTIME", "DRIVER"], "launches", None, None
    act.start()
    assert switched == {("runtime", 1): 0, ("driver", 1): 0}  # cudaGetDevice, cuCtxGetCurrent; never INVALID/SIZE
    act.record_all("a device record no recorded launch matched")
    assert switched == {("runtime", 1): 1, ("driver", 1): 1} and act.api == "all"
    act.start()  # every call recorded from now on
    assert switched == {("runtime", 1): 1, ("driver", 1): 1} and act.api_note.startswith("a device record")

    old, _ = _cupti_with_api_switches(fail=True)
    act = CuptiActivity.__new__(CuptiActivity)
    act.cupti, act.kinds, act.api, act.api_note, act._quiet = old, ["RUNTIME", "DRIVER"], "launches", None, None
    act.start()
    assert act.api == "all" and "NOT_SUPPORTED" in act.api_note

    newer, switched = _cupti_with_api_switches(fail="driver")  # enums newer than the library: that call stays on
    act = CuptiActivity.__new__(CuptiActivity)
    act.cupti, act.kinds, act.api, act.api_note, act._quiet = newer, ["RUNTIME", "DRIVER"], "launches", None, None
    act.start()
    assert act.api == "launches" and switched == {("runtime", 1): 0} and act.quiet_api() == [
        (newer.activity_enable_runtime_api, 1)]
    with pytest.raises(ValueError, match="'launches' or 'all'"):
        CuptiActivity("some")


def test_a_kernel_launched_through_a_call_not_recorded_has_its_batch_profiled_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A device record whose launch was not recorded (a call outside the launch calls, which only a candidate's own
    path can make) would leave the batch split by kernel names, which a kernel named like the flush's can fool: the
    process records every call from then on and profiles the batch again, split by launch, and the record says
    why."""
    from pytest_kopt.child import cupti as tm

    class Switched(_FakeActivity):
        def __init__(self) -> None:
            super().__init__()
            self.api = "launches"

        def record_all(self, why: str) -> None:
            self.api, self.api_note = "all", why

        def launch(self, name: str) -> None:
            t = self.now_us()
            corr = len(self.device) + 1
            if not (name.startswith("kernel_") and self.api == "launches"):
                self.launches[corr] = t  # the runtime or driver call's record; none where that call is not recorded
            self.device.append((100.0 + t, 100.5 + t, name, corr))

    act = Switched()
    monkeypatch.setattr(tm, "_BACKEND", {"name": "cupti-python", "activity": act, "note": None, "warm_s": 0.0})
    got = tm.kernel_times(_fake_timer(act), calls=4, hold_us=5.0)
    assert act.log == ["start", "stop", "start", "stop", "start", "stop"]  # the flush probe, the batch, again
    assert got["split"] == "launch" and got["calls"] == 4 and got["spans_us"] == [0.5] * 4
    assert got["api"] == "all" and got["api_note"].startswith("4 of ")
    assert got["next_call"] == 8  # profiled again on calls 4-7: input values these calls had not seen


def test_a_cupti_python_that_records_nothing_hands_the_process_to_torchs_profiler(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """CUPTI can start (no error) and record nothing: the warm-up runs no kernel, so the first batch's flush probe
    is where it shows. That process then uses torch's profiler, and the record says why."""
    from pytest_kopt.child import cupti as tm

    act = _FakeActivity(record=False)
    monkeypatch.setattr(tm, "_BACKEND", {"name": "cupti-python", "activity": act, "note": None, "warm_s": 0.0})
    seen = []

    def torch_capture(backend, timer, calls, start, hold, refresh_every):  # noqa: ANN001, ANN202
        seen.append((backend["name"], calls))
        return [], {}, []

    monkeypatch.setattr(tm, "_capture_torch", torch_capture)
    got = tm.kernel_times(_fake_timer(act), calls=3, hold_us=5.0)
    assert seen == [("torch.profiler", 0), ("torch.profiler", 3)]
    assert got["backend"] == "torch.profiler" and "delivered no record of a flush" in got["backend_note"]
    assert tm.profiler_backend()["name"] == "torch.profiler"
    with pytest.raises(ValueError, match="already uses cupti-python"):
        monkeypatch.setitem(tm._BACKEND, "name", "cupti-python")
        tm.profiler_backend("torch.profiler")
