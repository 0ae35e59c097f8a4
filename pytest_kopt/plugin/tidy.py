"""The user's folder stays as it was: in a kopt session hypothesis keeps its storage under the artifacts folder
(``<outdir>/.hypothesis``, not ``./.hypothesis``) and pytest-benchmark's own pytest plugin is off (its header line
and its ``./.benchmarks`` folder have nothing to do with how kopt times; kopt's saved baselines use its storage as a
library)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

#: The options that make a session a kopt session before the options are parsed.
_ACTIVE = ("--kopt-baseline", "--kopt-run")
#: hypothesis's variable for its storage folder (its database and constants cache), read at its first use.
HYPOTHESIS_HOME_ENV = "HYPOTHESIS_STORAGE_DIRECTORY"


def kopt_session(early_config: pytest.Config, args: list[str]) -> bool:
    """True when ``args`` (not parsed yet) or the ini file name a kernel or a run: a session that runs kopt's
    gates, not only a user's own tests with the plugin installed."""
    if any(a.split("=", 1)[0] in _ACTIVE for a in args[: args.index("--") if "--" in args else len(args)]):
        return True
    try:
        return bool(early_config.getini("kopt_baseline") or early_config.getini("kopt_run"))
    except (ValueError, KeyError):  # an ini file pytest has not read yet: the command line decides
        return False


def benchmark_plugin_off(early_config: pytest.Config, args: list[str]) -> bool:
    """Turn pytest-benchmark's pytest plugin off in a kopt session where no ``--benchmark-*`` option asks for it
    (as ``-p no:benchmark`` would); True when it was on. Its ``benchmark`` fixture is then missing: a session that
    mixes benchmarks of its own with kopt's gates gives any ``--benchmark-*`` option to keep it."""
    pm = early_config.pluginmanager
    if pm.get_plugin("benchmark") is None or not kopt_session(early_config, args):
        return False
    if any(a.startswith("--benchmark") for a in args):
        return False
    pm.set_blocked("benchmark")
    return True


def hypothesis_home(outdir: Path) -> tuple[bool, str | None]:
    """Point hypothesis's storage at ``<outdir>/.hypothesis`` for this process and the harness processes it starts,
    unless the user chose a folder (``HYPOTHESIS_STORAGE_DIRECTORY``). Returns what :func:`restore` gives back:
    (whether it was set here, the value before)."""
    before = os.environ.get(HYPOTHESIS_HOME_ENV)
    if before:
        return False, before
    os.environ[HYPOTHESIS_HOME_ENV] = str(Path(outdir).resolve() / ".hypothesis")
    return True, before


def restore(saved: tuple[bool, Any]) -> None:
    """Give ``HYPOTHESIS_STORAGE_DIRECTORY`` back as :func:`hypothesis_home` found it (an in-process pytest run
    leaves its caller's environment as it was)."""
    if saved[0]:
        os.environ.pop(HYPOTHESIS_HOME_ENV, None)
