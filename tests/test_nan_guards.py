"""Every guard compares NaN equal to NaN in the same place (issue #41): an honest ``torch.relu`` whose inputs hold NaN
(drawn by the reference's ``make_inputs``) passes, where the reference's own input check read each NaN as a write
(CONTRACT_ERROR "reference() wrote 'x'"). The verdict's guards (NONDETERMINISTIC, STALE_OUTPUT, INPUT_INDEPENDENT)
and the judge's fast path are checked on arrays with NaN; a kernel wrong only where the input is NaN still fails."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from pytest_kopt.child.judge import judge_fast
from pytest_kopt.child.verdict import judge

NAN_REF = """\
import torch
def shapes(n):
    return {"x": ((n,), "float32"), "y": ((n,), "float32")}
def make_inputs(seed, n):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g)
    x[::7] = float("nan")  # a missing reading every seventh sample
    return {"x": x}
def reference(x, y, **_):
    y.copy_(torch.relu(x))
"""
RELU = """\
import torch
def setup(n, seed, device="cpu"):
    return {"inputs": {"x": torch.empty(n, device=device), "y": torch.empty(n, device=device)}, "outputs": ["y"]}
def run_kernel(x, y):
    y.copy_(BODY)
"""


def session(pytester: pytest.Pytester, body: str) -> tuple[dict, int]:
    pytester.makepyfile(ref=NAN_REF, k=RELU.replace("BODY", body))
    result = pytester.runpytest_subprocess("--kopt-baseline", "k.py", "--kopt-ref", "ref.py", "--kopt-dims", "n=64",
                                           "--kopt-seeds", "3", "-k", "correctness", "--kopt-json", "r.json",
                                           "-p", "no:cacheprovider", timeout=300)
    doc = json.loads((pytester.path / "r.json").read_text())
    (item,) = [i for i in doc["items"] if "correctness" in i["nodeid"]]
    return item, result.ret


def test_an_honest_relu_on_inputs_with_nan_passes(pytester: pytest.Pytester) -> None:
    item, ret = session(pytester, "torch.relu(x)")
    assert (item["outcome"], item["status"]) == ("passed", "PASSED"), item
    assert item["figures"]["nan_ref"] == item["figures"]["nan_out"] == 10  # 64 elements, every seventh NaN
    assert ret == 0


def test_a_relu_that_zeroes_the_nan_still_fails(pytester: pytest.Pytester) -> None:
    """``x.clamp(min=0)`` keeps NaN; ``torch.nan_to_num(torch.relu(x))`` writes 0 where the reference is NaN."""
    item, ret = session(pytester, "torch.nan_to_num(torch.relu(x))")
    assert (item["outcome"], item["status"]) == ("failed", "INCORRECT_NUMERICAL"), item
    assert ret == 2


def _arrays(x: np.ndarray, xb: np.ndarray, **cand: np.ndarray) -> dict[str, np.ndarray]:
    relu = lambda a: np.where(np.isnan(a), np.nan, np.maximum(a, 0)).astype(np.float32)  # noqa: E731
    out = {"ref__y": relu(x), "refB__y": relu(xb), "cand1__y": relu(x), "cand2__y": relu(x), "candB__y": relu(xb),
           "candC__y": relu(xb)}
    out.update({f"{k}__y": v for k, v in cand.items()})
    return out


X = np.array([1.0, np.nan, -2.0, 3.0, np.nan, -0.5], dtype=np.float32)
XB = np.array([-1.0, np.nan, 2.0, np.nan, 4.0, 0.5], dtype=np.float32)
TOLS = {"y": (1e-3, 1e-3)}


def test_the_verdicts_guards_read_nan_in_the_same_place_as_equal() -> None:
    """Both calls on set A NaN in the same places (not NONDETERMINISTIC), set B's outputs NaN where its inputs are
    (not STALE_OUTPUT or INPUT_INDEPENDENT), the second poison never matched by a NaN the kernel wrote: PASSED on the
    numpy judge and on the fast path."""
    arrays = _arrays(X, XB)
    v = judge(["y"], arrays, TOLS, check_tolerance=False, second_poison={"y": -1.7e38})
    assert (v.status, v.figures["nan_out"], v.figures["nan_ref"]) == ("PASSED", 2, 2)
    fast = judge_fast(torch, ["y"], {k: torch.from_numpy(a) for k, a in arrays.items()}, TOLS, {"y": -1.7e38})
    assert fast is not None and (fast["nan_out"], fast["nan_ref"]) == (2, 2)


@pytest.mark.parametrize(("tag", "status"), [
    ("cand2", "NONDETERMINISTIC"),  # the second call lost a NaN
    ("candB", "STALE_OUTPUT"),  # set B in the same buffers gave set A's answer, in new buffers the right one
])
def test_a_nan_that_moves_still_fails_its_guard(tag: str, status: str) -> None:
    wrong = _arrays(X, XB)["cand1__y"].copy()  # set A's right answer: set B's wrong one
    if tag == "cand2":
        wrong[1] = 0.0
    arrays = _arrays(X, XB, **{tag: wrong})
    v = judge(["y"], arrays, TOLS, check_tolerance=False)
    assert v.status == status, v
    assert judge_fast(torch, ["y"], {k: torch.from_numpy(a) for k, a in arrays.items()}, TOLS) is None


def test_set_b_identical_to_set_a_with_nan_is_input_independent() -> None:
    """New values give the same output as set A, NaN included, while the reference's changed: INPUT_INDEPENDENT
    (NaN-aware equality makes the identical output identical)."""
    arrays = _arrays(X, XB)
    arrays["candB__y"] = arrays["cand1__y"].copy()
    arrays["candC__y"] = arrays["cand1__y"].copy()
    assert judge(["y"], arrays, TOLS, check_tolerance=False).status == "INPUT_INDEPENDENT"
