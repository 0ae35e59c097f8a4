"""One loop step per run directory at a time (pytest_kopt.loop.lock): a second --kopt-run (or a --kopt-run beside a
--kopt-init) on the same run fails at once, exit 4, naming the holder's pid and the lock file."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from pytest_kopt.errors import ConfigError
from pytest_kopt.loop import state as loop

from test_loop_files import cpu_run

#: a plugin that holds its session at its start until the test creates ``go`` (so two steps overlap for sure)
HOLD = """
import os, time
def pytest_sessionstart(session):
    open("started", "w").write(str(os.getpid()))
    deadline = time.time() + 120
    while not os.path.exists("go") and time.time() < deadline:
        time.sleep(0.05)
"""


def test_a_second_step_on_a_run_fails_at_once_naming_the_holder(pytester: pytest.Pytester) -> None:
    """Before, two --kopt-run steps on one run ran side by side and each wrote the state at its end."""
    run, _ = cpu_run(pytester.path)
    pytester.makepyfile(kopt_hold=HOLD)
    first = pytester.popen([sys.executable, "-m", "pytest", "-p", "kopt_hold", "--kopt-run", str(run),
                            "-p", "no:cacheprovider"], stdout=open(os.devnull, "w"), stderr=open(os.devnull, "w"))
    try:
        deadline = time.time() + 120
        while not (pytester.path / "started").exists() and time.time() < deadline:
            assert first.poll() is None, "the first step ended before its session started"
            time.sleep(0.05)
        started = time.time()
        second = pytester.runpytest_subprocess("--kopt-run", str(run), "-p", "no:cacheprovider", "--kopt-json",
                                               "second.json")
        assert second.ret == 4 and time.time() - started < 60  # no wait for the first step
        from pytest_kopt.loop import lock

        doc = json.loads((pytester.path / "second.json").read_text())
        assert doc["error"]["problems"] == [f"--kopt-run of pid {first.pid} since "
                                            f"{lock.holder(run)['started']} holds the lock {run / '.kopt-step.lock'}"]
        assert f"kill {first.pid}" in doc["error"]["fix"]
    finally:
        (pytester.path / "go").write_text("")
        first.wait(timeout=300)
    # the first step ran to its end (no GPU here: SKILL.md step 0 stops the run, exit 3)
    assert first.returncode == 3
    assert lock.holder(run) == {}  # released, and the holder forgotten
    lock.hold(run, "run").release()  # the next step takes it at once


def test_a_run_step_beside_an_init_step_of_the_same_run_is_refused(pytester: pytest.Pytester) -> None:
    from pytest_kopt.loop import lock

    run, _ = cpu_run(pytester.path)
    held = lock.hold(run, "init")  # this process stands for a --kopt-init still working on the run
    try:
        result = pytester.runpytest_subprocess("--kopt-run", str(run), "-p", "no:cacheprovider")
        assert result.ret == 4
        result.stderr.fnmatch_lines([f"*--kopt-init of pid {os.getpid()} since * holds the lock "
                                     f"{run / '.kopt-step.lock'}*"])
    finally:
        held.release()


def test_the_lock_is_taken_once_and_an_abandoned_init_folder_is_removed(tmp_path: Path) -> None:
    from pytest_kopt.loop import lock

    base = tmp_path / "k.cu"
    base.write_text("")
    run = loop.new_run_dir(base)
    assert run.is_dir() and loop.new_run_dir(base) != run  # claimed: a second set-up gets another folder
    held = lock.hold(run, "init")
    assert lock.holder(run)["pid"] == os.getpid() and lock.holder(run)["mode"] == "init"
    with pytest.raises(ConfigError, match="is being worked on by another loop step"):
        lock.hold(run, "run")
    held.release()  # no state.json was written: the set-up stopped before it, so the folder goes
    assert not run.exists()
