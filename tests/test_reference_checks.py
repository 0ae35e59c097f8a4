"""Before a kernel is blamed, the reference is checked (issue #41): a reference that gives other outputs on the same
inputs (dropout in train mode) is a contract error naming it and the fix, never the kernel's NONDETERMINISTIC; a
reference that hangs is blamed on the reference under ``--kopt-timeout``, never the kernel's TIMEOUT. Problems and
candidates are written here, in kopt's format and KernelBench's, and run on the CPU."""

from __future__ import annotations

import json
import time

import pytest

RANDOM_REF = """\
import torch
def shapes(n):
    return {"x": ((n,), "float32"), "y": ((n,), "float32")}
def reference(x, y, **_):
    y.copy_(torch.nn.functional.dropout(x, p=0.5, training=True))
"""
HANGING_REF = """\
import time
def shapes(n):
    return {"x": ((n,), "float32"), "y": ((n,), "float32")}
def reference(x, y, **_):
    while True:  # waits for an event that never comes
        time.sleep(0.05)
"""
HALVE_REF = """\
def shapes(n):
    return {"x": ((n,), "float32"), "y": ((n,), "float32")}
def reference(x, y, **_):
    y.copy_(0.5 * x)
"""
HALVE = """\
import torch
def setup(n, seed, device="cpu"):
    return {"inputs": {"x": torch.empty(n, device=device), "y": torch.empty(n, device=device)}, "outputs": ["y"]}
def run_kernel(x, y):
    torch.mul(x, 0.5, out=y)
"""
#: A KernelBench-style problem of a linear layer followed by dropout; ``P`` is the dropout probability.
KB_PROBLEM = """\
import torch
import torch.nn as nn

rows, features = 8, 32


class Model(nn.Module):
    def __init__(self, p):
        super().__init__()
        self.proj = nn.Linear(features, features)
        self.drop = nn.Dropout(p)

    def forward(self, x):
        return self.drop(self.proj(x))


def get_inputs():
    return [torch.randn(rows, features)]


def get_init_inputs():
    return [P]
"""
KB_CANDIDATE = """\
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, p):
        super().__init__()
        self.proj = nn.Linear(32, 32)
        self.drop = nn.Dropout(p)

    def forward(self, x):
        return self.drop(self.proj(x))
"""


def session(pytester: pytest.Pytester, *args: str) -> tuple[pytest.RunResult, dict[str, dict], dict]:
    result = pytester.runpytest_subprocess(*args, "--kopt-seeds", "5", "-k", "correctness", "--kopt-json", "r.json",
                                           "-p", "no:cacheprovider", timeout=300)
    doc = json.loads((pytester.path / "r.json").read_text())
    return result, {i["nodeid"].split("::", 1)[1]: i for i in doc["items"]}, doc


def test_a_reference_with_dropout_in_train_mode_is_the_references_error(pytester: pytest.Pytester) -> None:
    """kopt's format: reference() applies dropout in train mode; the candidate does exactly what it does. The
    reference, called twice on the same inputs, is a CONTRACT_ERROR naming it and eval mode (exit 4), where the
    kernel got NONDETERMINISTIC "fix the kernel" before."""
    pytester.makepyfile(ref=RANDOM_REF, k=RANDOM_REF.replace("def reference(x, y, **_):", "def run_kernel(x, y):")
                        + HALVE.split("def run_kernel")[0].replace("import torch\n", ""))
    result, items, doc = session(pytester, "--kopt-baseline", "k.py", "--kopt-ref", "ref.py", "--kopt-dims", "n=64")
    item = items["correctness[seed=5]"]
    assert (item["outcome"], item["status"]) == ("failed", "CONTRACT_ERROR"), item
    assert "/ref.py: reference() gave other outputs when called again on the same inputs (output y [64]: " \
        in item["message"], item["message"]
    assert "the reference itself is not deterministic" in item["message"]
    assert "eval mode" in item["fix"] and "torch.manual_seed" in item["fix"]
    assert doc["exit_code"] == result.ret == 4


@pytest.mark.parametrize(("p", "status"), [("0.3", "CONTRACT_ERROR"), ("0.0", "PASSED")])
def test_a_kernelbench_model_with_dropout_is_checked_before_its_candidate(pytester: pytest.Pytester, p: str,
                                                                          status: str) -> None:
    """KernelBench's format: Model is a linear layer and dropout (left in train mode, as nn.Module starts); a
    ModelNew identical to it. With p=0.3 the problem's own Model.forward is named; with p=0.0 (dropout is then the
    identity) the same pair passes: the check does not fire on a deterministic reference."""
    pytester.makepyfile(problem=KB_PROBLEM.replace("P]", f"{p}]"), candidate=KB_CANDIDATE)
    result, items, doc = session(pytester, "--kopt-baseline", "candidate.py", "--kopt-ref", "problem.py")
    (item,) = [i for n, i in items.items() if n.startswith("correctness")]
    assert item["status"] == status, item
    if status == "CONTRACT_ERROR":
        assert "problem.py: Model.forward gave other outputs when called again on the same inputs" in item["message"]
        assert "model.eval()" in item["fix"] and result.ret == 4
    else:
        assert result.ret == 0


def test_a_hanging_reference_is_blamed_on_the_reference_within_the_timeout(pytester: pytest.Pytester) -> None:
    """reference() never returns; the candidate is right. The judge runs under --kopt-timeout (not a floor of
    120 s), and the item says the reference did not answer: REFERENCE_TIMEOUT on ref.py, exit 4, where it was the
    kernel's TIMEOUT (exit 2) after 120 s."""
    pytester.makepyfile(ref=HANGING_REF, k=HALVE)
    t0 = time.monotonic()
    result, items, doc = session(pytester, "--kopt-baseline", "k.py", "--kopt-ref", "ref.py", "--kopt-dims", "n=64",
                                 "--kopt-timeout", "6")
    took = time.monotonic() - t0
    item = items["correctness[seed=5]"]
    assert (item["outcome"], item["status"]) == ("failed", "REFERENCE_TIMEOUT"), item
    assert item["message"].startswith("the reference did not give its outputs within --kopt-timeout 6 s in the "
                                      "judge's process (seed=5;"), item["message"]
    assert item["path"].endswith("ref.py") and "infinite loop" in item["fix"]
    assert doc["exit_code"] == result.ret == 4
    assert took < 100, took


def test_an_honest_kernel_against_a_deterministic_reference_still_passes(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(ref=HALVE_REF, k=HALVE)
    result, items, _ = session(pytester, "--kopt-baseline", "k.py", "--kopt-ref", "ref.py", "--kopt-dims", "n=64")
    assert items["correctness[seed=5]"]["status"] == "PASSED" and result.ret == 0
