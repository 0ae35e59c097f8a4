"""The reference process's check of a Triton/Python candidate's buffers against ``ref.shapes()``."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pytest_kopt.child import HarnessError
from pytest_kopt.child.inputs import check_spec

SPEC = [{"name": "x", "shape": [8, 64], "stride": [64, 1], "dtype": "float32", "role": "input"},
        {"name": "y", "shape": [8, 64], "stride": [64, 1], "dtype": "float32", "role": "output"}]
DIMS = {"M": 8, "N": 64}


def _ref(table):
    return SimpleNamespace(shapes=lambda M, N: table(M, N))


def test_matching_shapes_pass_bare_or_with_dtype() -> None:
    check_spec(_ref(lambda M, N: {"x": (M, N), "y": (M, N)}), SPEC, DIMS, "ref.py")
    check_spec(_ref(lambda M, N: {"x": ((M, N), "float32"), "y": ((M, N), "torch.float32")}), SPEC, DIMS, "ref.py")


def test_a_shrunk_buffer_fails_naming_both_shapes() -> None:
    with pytest.raises(HarnessError, match=r"'x' is float32\[8, 64\] but ref.py's shapes\(\) says float32\[8, 1\]"):
        check_spec(_ref(lambda M, N: {"x": (M, 1)}), SPEC, DIMS, "ref.py")


def test_a_wrong_dtype_fails() -> None:
    with pytest.raises(HarnessError, match=r"says float16\[8, 64\]"):
        check_spec(_ref(lambda M, N: {"x": ((M, N), "float16")}), SPEC, DIMS, "ref.py")


def test_a_malformed_table_is_the_references_error() -> None:
    with pytest.raises(HarnessError, match=r"ref.py: shapes\(\)\['x'\] = 'big' is not a shape"):
        check_spec(_ref(lambda M, N: {"x": "big"}), SPEC, DIMS, "ref.py")


def test_no_shapes_means_nothing_to_check() -> None:
    check_spec(SimpleNamespace(), SPEC, DIMS, "ref.py")


def test_a_layout_the_problem_does_not_give_fails() -> None:
    """A column-major buffer where the problem is row-major; a layout the reference prescribes is accepted."""
    col = [{**SPEC[0], "stride": [1, 8]}, SPEC[1]]
    with pytest.raises(HarnessError, match=r"'x' has strides \[1, 8\], not \[64, 1\], row-major"):
        check_spec(SimpleNamespace(), col, DIMS, "ref.py")
    check_spec(_ref(lambda M, N: {"x": ((M, N), "float32", (1, M))}), col, DIMS, "ref.py")
