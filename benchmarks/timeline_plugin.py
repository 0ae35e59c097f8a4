"""A pytest plugin for benchmarks: one JSON line per test phase (node id, phase, worker, start and stop in Unix
seconds, outcome) appended to the file named by ``KOPT_TIMELINE``; with xdist, the controller writes the lines of
every worker. Load it with ``-p timeline_plugin`` and this folder on ``PYTHONPATH`` (benchmarks/throughput.py does)."""

from __future__ import annotations

import json
import os
import time


_CONTROLLER = [False]


def pytest_configure(config) -> None:
    _CONTROLLER[0] = not hasattr(config, "workerinput")


def pytest_sessionstart(session) -> None:
    path = os.environ.get("KOPT_TIMELINE")
    if path and _CONTROLLER[0]:
        with open(path, "a") as f:
            f.write(json.dumps({"event": "sessionstart", "t": time.time()}) + "\n")


def pytest_runtest_logreport(report) -> None:
    path = os.environ.get("KOPT_TIMELINE")
    if not path or not _CONTROLLER[0]:
        return
    start, stop = getattr(report, "start", None), getattr(report, "stop", None)
    if start is None:  # pytest before 8 has no start/stop on reports
        return
    with open(path, "a") as f:
        f.write(json.dumps({"nodeid": report.nodeid, "when": report.when, "worker": getattr(report, "node", None)
                            and getattr(report.node, "gateway", None) and report.node.gateway.id,
                            "location": report.location[2] if report.location else None, "start": start, "stop": stop, "outcome": report.outcome}) + "\n")


def pytest_sessionfinish(session) -> None:
    path = os.environ.get("KOPT_TIMELINE")
    if path and _CONTROLLER[0]:
        with open(path, "a") as f:
            f.write(json.dumps({"event": "sessionfinish", "t": time.time()}) + "\n")
