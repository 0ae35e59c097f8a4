"""A kopt session leaves the user's folder as it was (hypothesis's storage under the artifacts folder, pytest-benchmark's
plugin off), and saved baselines without pytest-benchmark stop the session with a usage error that says why."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

REDTEAM = Path(__file__).resolve().parent / "redteam"


def test_a_session_leaves_nothing_in_the_users_folder_but_its_artifacts(pytester: pytest.Pytester) -> None:
    """After a session whose correctness ran (hypothesis drew the plans) the folder holds the kernel, the reference,
    the report and ``.kopt/`` (hypothesis's storage inside it): no ``.hypothesis/``, no ``.benchmarks/``; and the
    header carries no pytest-benchmark defaults, which have nothing to do with how kopt times."""
    pytest.importorskip("pytest_benchmark")
    for name in ("honest_python.py", "ref_softmax.py"):
        shutil.copy(REDTEAM / name, pytester.path / name)
    result = pytester.runpytest_subprocess("--kopt-baseline", "honest_python.py", "--kopt-ref", "ref_softmax.py",
                                           "--kopt-dims", "M=4,N=16", "--kopt-seeds", "3", "--kopt-json", "r.json",
                                           "-p", "no:cacheprovider", timeout=600)
    assert result.ret == 0, result.stdout.str()[-3000:]
    assert json.loads((pytester.path / "r.json").read_text())["kernels"][0]["status"] == "PASSED"
    # pytester makes this folder the HOME too (.cache, .config); .pytest_cache is pytest's own (kopt's build cache)
    mine = {"runpytest-0", "runpytest-current", "stdout", "stderr", ".cache", ".config", ".pytest_cache"}
    left = sorted(p.name for p in pytester.path.iterdir() if p.name not in mine)
    assert left == [".kopt", "honest_python.py", "r.json", "ref_softmax.py"], left
    assert not any(line.startswith("benchmark:") for line in result.outlines), result.outlines[:8]


def test_benchmark_options_keep_pytest_benchmarks_plugin(pytester: pytest.Pytester) -> None:
    """A session that gives a ``--benchmark-*`` option keeps pytest-benchmark's plugin (and its fixture)."""
    pytest.importorskip("pytest_benchmark")
    pytester.makepyfile(test_b="def test_b(benchmark):\n    benchmark(lambda: 1)\n")
    result = pytester.runpytest_subprocess("--benchmark-disable", "--benchmark-storage", "bench", "-p",
                                           "no:cacheprovider", timeout=600)
    assert result.ret == 0, result.stdout.str()


def test_saved_baselines_without_pytest_benchmark_are_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--kopt-save``/``--kopt-compare`` need pytest-benchmark's storage: without it the plugin refuses at configure
    with the reason and the fix (it used to fail only at the session's end, or not at all)."""
    from pytest_kopt.errors import ConfigError
    from pytest_kopt.plugin import compare

    monkeypatch.setattr(compare, "benchmark_installed", lambda: False)
    with pytest.raises(ConfigError) as info:
        compare.SavedBaselinesPlugin(state=None)  # type: ignore[arg-type]
    assert "pytest-benchmark is not installed" in info.value.message
    assert info.value.fix is not None and "pip install pytest-benchmark" in info.value.fix


def test_hypothesis_home_is_given_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The storage folder is set for the session and given back after it; a folder the user chose is left alone."""
    from pytest_kopt.plugin import tidy

    monkeypatch.delenv(tidy.HYPOTHESIS_HOME_ENV, raising=False)
    saved = tidy.hypothesis_home(tmp_path / ".kopt")
    import os

    assert os.environ[tidy.HYPOTHESIS_HOME_ENV] == str((tmp_path / ".kopt" / ".hypothesis").resolve())
    tidy.restore(saved)
    assert tidy.HYPOTHESIS_HOME_ENV not in os.environ
    monkeypatch.setenv(tidy.HYPOTHESIS_HOME_ENV, "/mine")
    tidy.restore(tidy.hypothesis_home(tmp_path))
    assert os.environ[tidy.HYPOTHESIS_HOME_ENV] == "/mine"


def test_the_suite_itself_leaves_the_working_folder_clean(pytestconfig: pytest.Config) -> None:
    """This test suite's own process: hypothesis's storage (the property tests' database and constants cache) is
    outside the repository (tests/conftest.py), and pytest-benchmark's plugin is off (pyproject's addopts), so a
    test run leaves no ``.hypothesis/`` or ``.benchmarks/`` at the root and prints no PytestBenchmarkWarning."""
    import os

    root = Path(__file__).resolve().parent.parent
    home = Path(os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY", root / ".hypothesis")).resolve()
    assert not home.is_relative_to(root), home
    assert pytestconfig.pluginmanager.get_plugin("benchmark") is None
