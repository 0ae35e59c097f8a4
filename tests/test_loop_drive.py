"""The loop driven end to end through pytest as an agent drives it, from the --kopt-json report alone: set-up, a
close in two steps, a close in one, and a finish, on the CPU with the GPU gates standing in
(benchmarks/kopt_standin.py: declared times, metrics and SASS; correctness is real). Every report is checked
against registries/report_schema.json, including the one written while a step runs."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_kopt import registry

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
#: copies the report as the session's start left it (status running), once collected, before any item runs
PEEK = """
import json, os, shutil
def pytest_collection_finish(session):
    path = session.config.getoption("kopt_json")
    if path and os.path.exists(path):
        shutil.copy(path, "peek.json")
"""


def _plan() -> Any:
    spec = importlib.util.spec_from_file_location("softmax_standin", BENCH / "drive_plans" / "softmax_standin.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(pytester: pytest.Pytester, command: list[str], report: str, workers: int = 0) -> tuple[int, dict[str, Any]]:
    """Run a report's command as given, but for ``-n`` (the test's speed: none, or ``workers``), with the
    stand-ins and the peek plugin; returns its exit code and its report, read from ``report`` (``next.report``)."""
    cmd = list(command)
    if "-n" in cmd:
        at = cmd.index("-n")
        del cmd[at:at + 2]
    if workers:
        cmd += ["-n", str(workers)]
    result = pytester.run(*cmd, "-p", "kopt_standin", "-p", "kopt_peek", "-p", "no:cacheprovider", timeout=600)
    return result.ret, json.loads(Path(report).read_text())


def test_an_agent_drives_a_run_from_the_report_alone(pytester: pytest.Pytester,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = registry.load("report_schema.json")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(BENCH), str(pytester.path), *sys.path]))
    pytester.makepyfile(kopt_peek=PEEK)
    plan = _plan()
    plan.prepare(pytester.path)
    s = plan.SETUP
    rc, doc = _run(pytester, [sys.executable, "-m", "pytest", "--kopt-init", f"--kopt-baseline={s['baseline']}",
                              f"--kopt-ref={s['ref']}", "--kopt-dims=M=4,N=16", "--kopt-iterations=3",
                              "--kopt-branches=2", "--kopt-seeds=1", f"--kopt-json={pytester.path / 'init.json'}"],
                   str(pytester.path / "init.json"))
    peek = json.loads((pytester.path / "peek.json").read_text())
    assert (peek["status"], peek["exit_code"], peek["loop"]["stage"]) == ("running", None, "running")
    jsonschema.validate(peek, schema)
    stages, reports = [], [doc]
    while rc == 0 and doc["loop"]["next"]["action"] in ("write_and_close", "write_ablations"):
        loop = doc["loop"]
        nxt = loop["next"]
        want = plan.decide(loop, Path(loop["run_dir"]), pytester.path)
        if nxt["action"] == "write_ablations":
            for a in nxt["ablations"]:
                Path(a["kernel"]).write_text(want[a["method"]])
                Path(a["base"]).write_text(nxt["champion"])
        else:
            Path(nxt["methods_file"]).write_text(json.dumps({**want.get("methods", {}),
                                                            **({"finish": want["finish"]} if "finish" in want
                                                               else {})}))
            for b, source in want.get("branches", {}).items():
                Path(nxt["branch_kernels"][b]).write_text(source)
            for m, (base, source) in want.get("ablations", {}).items():
                Path(nxt["ablation_pattern"]["kernel"].replace("{method}", m)).parent.mkdir(exist_ok=True)
                Path(nxt["ablation_pattern"]["kernel"].replace("{method}", m)).write_text(source)
                Path(nxt["ablation_pattern"]["base"].replace("{method}", m)).write_text(base)
        finishing = "finish" in want and not want.get("methods")
        rc, doc = _run(pytester, nxt["command"], nxt["report"], workers=2 if finishing else 0)  # xdist's for the finish
        stages.append((rc, doc["loop"]["stage"], doc["loop"]["next"]["action"]))
        reports.append(doc)
    assert stages == [(0, "branch_explore", "write_ablations"), (0, "conclude", "write_and_close"),
                      (0, "conclude", "write_and_close"), (0, "finish", "done")]
    # every command runs on this machine (the stand-in gates need no GPU); the last step has none
    assert [d["loop"]["next"]["runs_here"] for d in reports] == [True, True, True, True, None]
    for d in reports:
        assert d["status"] == "complete" and d["loop"]["status"] == "complete" and d["loop"]["stage"]
        jsonschema.validate(d, schema)
    closed = [d["loop"] for d in reports if d["loop"]["stage"] == "conclude"]
    assert [c["residual"]["label"] for c in closed] == ["not explained by any method"] * 2
    assert closed[0]["compared_against"]["best_ms"] == 10.0 and closed[1]["compared_against"]["best_ms"] == 5.0
    assert closed[0]["residual"]["residual_ms"] == pytest.approx(2.45)
    last = reports[-1]["loop"]
    assert last["finish"].startswith("every method this agent can write") and last["phase"] == "completed"
    assert reports[-1]["items"] == [] and reports[-1]["exit_code"] == 0
    run = Path(last["run_dir"])
    state = json.loads((run / "state.json").read_text())
    assert (state["verified_iterations"], state["completion"]) == (2, "finished")
    assert [r["profile"] for r in state["roofline_history"]] == ["best_input", "champion", "champion"]
    assert json.loads((run / "stop.json").read_text())["exit_code"] == 0
    assert json.loads((run / "iterv1" / "ncu_top.json").read_text())["ncu_num"] == 5
