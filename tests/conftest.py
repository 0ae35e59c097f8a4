"""Test-suite fixtures: GPU tests skip with the probe's reason when no CUDA GPU is visible."""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from pytest_kopt.gates import hardware

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"

# hypothesis's storage (its example database, its constants cache) for the suite's own property tests: under the
# temporary folder, not ./.hypothesis, so a test run leaves the working folder as it was. Read at hypothesis's first
# use, which is after this; xdist's workers inherit it. A folder the user chose is kept.
os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY",
                      os.path.join(tempfile.gettempdir(), f"pytest-kopt-tests-{os.getuid()}", "hypothesis"))


@functools.lru_cache(maxsize=1)
def gpu_missing_reason() -> str | None:
    """None when a CUDA context can be created, else the one-line reason."""
    probe = hardware.probe_gpus()
    return None if probe["gpus"] else f"no GPU: {probe['error']}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``gpu``-marked tests (with the probe's reason) on machines without a GPU."""
    gpu_items = [i for i in items if isinstance(i, pytest.Function) and i.get_closest_marker("gpu")]
    if not gpu_items:
        return
    reason = gpu_missing_reason()
    if reason:
        for item in gpu_items:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def example(pytester: pytest.Pytester):
    """Copy ``examples/<name>/`` into the pytester folder and return that folder's path."""
    def copy(name: str) -> Path:
        dest = pytester.path / name
        shutil.copytree(EXAMPLES / name, dest)
        return dest
    return copy


#: The test modules whose sessions run with edge shapes as a user's do (``--kopt-edge-shapes auto``, the default).
EDGE_SHAPE_MODULES = frozenset({"test_edges", "test_examples"})


@pytest.fixture(autouse=True)
def _edge_shapes_off_elsewhere(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sessions the other tests start (pytester's, a subprocess's) run without edge shapes, through
    ``PYTEST_ADDOPTS``: each adds five correctness items to a session whose test is about something else (its item
    counts, its CPU time in Triton's interpreter). ``tests/test_edges.py`` tests them, and ``tests/test_examples.py``
    runs every example with them, as a user's session does."""
    if request.module.__name__.rsplit(".", 1)[-1] in EDGE_SHAPE_MODULES:
        return
    if "pytester" in request.fixturenames:
        request.getfixturevalue("pytester")  # it clears PYTEST_ADDOPTS as it starts: set it after
    monkeypatch.setenv("PYTEST_ADDOPTS", f"{os.environ.get('PYTEST_ADDOPTS', '')} --kopt-edge-shapes off".strip())
