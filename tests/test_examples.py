"""Every bundled example passes its CPU gates (contract, compile, SASS; Triton correctness through the
interpreter), at small dims; on a GPU every gate runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pytest_kopt.gates import hardware

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
CASES = {
    "gemm": ("gemm.cu", "M=64,N=64,K=64"),
    "gemm_tiled": ("gemm_tiled.cu", "M=128,N=128,K=16"),
    "batchnorm": ("batchnorm.cu", "N=256,C=16,eps=1e-5"),
    "softmax_triton": ("softmax.py", "M=8,N=100"),
    "matmul_triton": ("matmul.py", "M=32,N=32,K=32"),
    "gemm_cutlass": ("gemm_cutlass.cu", "M=128,N=96,K=40"),
    "softmax_cuda": ("softmax.cu", "M=16,N=1000"),
    "matmul_autotune": ("matmul.py", "M=40,N=72,K=48"),
}


@pytest.mark.skipif(hardware.find_tool("nvcc") is None, reason="nvcc not found")
@pytest.mark.parametrize("name", CASES)
def test_example_cpu_gates(pytester: pytest.Pytester, name: str) -> None:
    """The example's gates at small dims: contract, compile and SASS pass everywhere; correctness passes on a GPU
    (and for Triton, through the interpreter, without one)."""
    kernel, dims = CASES[name]
    if name == "gemm_cutlass":
        pytest.importorskip("cutlass_library", reason="CUTLASS headers come from the nvidia-cutlass wheel")
    shutil.copytree(EXAMPLES / name, pytester.path / name)
    result = pytester.runpytest_subprocess(
        "--kopt-baseline", f"{name}/{kernel}", "--kopt-ref", f"{name}/ref.py", "--kopt-dims", dims,
        "--kopt-seeds", "3,5", "--kopt-json", "r.json", "-p", "no:cacheprovider", timeout=600)
    assert result.ret == 0, result.stdout.str()[-3000:]
    items = json.loads((pytester.path / "r.json").read_text())["items"]
    status = {i["nodeid"].split("::")[1]: i["status"] for i in items}
    for gate in ("hardware", "preflight", "compile", "sass"):
        assert status[gate] == "PASSED", status
    correctness = [s for g, s in status.items() if g.startswith("correctness")]
    gpu = bool(hardware.probe_gpus()["gpus"])
    if kernel.endswith(".py") or gpu:
        assert correctness and set(correctness) == {"PASSED"}, status
    if not gpu:  # every GPU gate says why it skipped: no GPU (roofline used to say "no ncu_top.json")
        messages = {i["nodeid"].split("::")[1]: i["message"] for i in items if i["status"] == "SKIPPED"}
        assert {"timing", "ncu", "roofline"} <= set(messages), messages
        assert all(m.startswith("blocked by hardware: no GPU") for m in messages.values()), messages


@pytest.mark.skipif(hardware.find_tool("nvcc") is None, reason="nvcc not found")
def test_triton_interpret_in_the_users_shell_is_not_inherited(pytester: pytest.Pytester,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``TRITON_INTERPRET=1`` left in the shell must not reach the compile and SASS gates (which need Triton's real
    compiler; with it every gate failed as CONTRACT_ERROR "run_kernel() launched no @triton.jit kernel")."""
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    shutil.copytree(EXAMPLES / "softmax_triton", pytester.path / "s")
    result = pytester.runpytest_subprocess(
        "--kopt-baseline", "s/softmax.py", "--kopt-ref", "s/ref.py", "--kopt-dims", "M=8,N=100", "--kopt-seeds", "3",
        "--kopt-edge-shapes", "off", "--kopt-json", "r.json", "-p", "no:cacheprovider", "-k", "compile or correctness or sass", timeout=600)
    assert result.ret == 0, result.stdout.str()[-3000:]
    status = {i["nodeid"].split("::")[1]: i["status"] for i in json.loads((pytester.path / "r.json").read_text())["items"]}
    assert status == {"compile": "PASSED", "correctness[seed=3]": "PASSED", "sass": "PASSED"}, status


def test_smaller_dims_halve_the_sizes_until_their_product_is_small() -> None:
    """A CPU TIMEOUT's suggestion: every size halved alike (the KernelBench linear layer's globals to the dims that
    pass in seconds), other dims kept, nothing for dims already small."""
    from pytest_kopt.gates.request import smaller_dims

    assert smaller_dims({"batch_size": 2048, "in_features": 1024, "out_features": 2048}) == {
        "batch_size": 64, "in_features": 32, "out_features": 64}
    assert smaller_dims({"N": 16384, "C": 1024, "eps": 1e-5}) == {"N": 1024, "C": 64, "eps": 1e-5}
    assert smaller_dims({"M": 64, "N": 1000}) is None


@pytest.mark.skipif(__import__("importlib.util").util.find_spec("triton") is None, reason="triton not installed")
def test_a_cpu_timeout_names_the_dims_that_help(pytester: pytest.Pytester) -> None:
    """The KernelBench example at its own sizes (2048x1024x2048) in Triton's interpreter runs past the timeout: the
    fix names the interpreter and the dims to pass instead, taken from the problem's size globals."""
    if hardware.probe_gpus()["gpus"]:
        pytest.skip("a GPU runs it in milliseconds")
    shutil.copytree(EXAMPLES / "kernelbench_linear", pytester.path / "kb")
    result = pytester.runpytest_subprocess(
        "--kopt-baseline", "kb/model_new.py", "--kopt-ref", "kb/problem.py", "--kopt-seeds", "3", "--kopt-timeout",
        "2", "-k", "correctness", "--kopt-json", "r.json", "-p", "no:cacheprovider", timeout=600)
    assert result.ret == 2, result.stdout.str()[-3000:]
    (item,) = json.loads((pytester.path / "r.json").read_text())["items"]
    assert item["status"] == "TIMEOUT", item
    assert "interpreter" in item["fix"], item
    assert item["fix"].endswith("for example --kopt-dims batch_size=64,in_features=32,out_features=64"), item
