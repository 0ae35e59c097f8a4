"""pytest-kopt's own hooks (pytest-xdist's ``newhooks.py`` pattern), added to pytest's in ``pytest_addhooks``.

A plugin or a ``conftest.py`` answers them to add gates and kernel kinds; kopt registers its own the same way
(:func:`pytest_kopt.plugin.pytest_kopt_gates`, :func:`pytest_kopt.plugin.pytest_kopt_kinds`, ``trylast``, so a
plugin's kind is asked before kopt's). Both are called once per session, in ``pytest_configure``, before any option
is parsed into settings (a kind's suffixes decide which files ``--kopt-baseline`` may name).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from ..gates.table import Gate
    from ..kinds.base import Kind


@pytest.hookspec()
def pytest_kopt_gates(config: pytest.Config) -> list[Gate]:
    """Return gates (:class:`pytest_kopt.gates.table.Gate`) to add to the session's table. Each is placed after
    its ``after`` gate, else right after the last of its ``needs``, else at the end; its name must be new. Its
    ``run(ctx, case)`` gets the kernel's :class:`~pytest_kopt.gates.context.Context` and returns an
    :class:`~pytest_kopt.gates.context.Outcome` (scalar figures for the reports, a summary line, artifact paths),
    or raises a :class:`~pytest_kopt.errors.KoptError` (a failure with its status, exit code and fix),
    :class:`~pytest_kopt.errors.Blocked` or :class:`~pytest_kopt.errors.NotApplicable` (a skip that says why)."""


@pytest.hookspec()
def pytest_kopt_kinds(config: pytest.Config) -> list[Kind]:
    """Return kernel kinds (:class:`pytest_kopt.kinds.base.Kind`) to add to the session's. Kinds are asked in the
    order of the answers (``tryfirst`` answers first, kopt's own last) and the first whose ``detect`` claims a file
    gets it; a kind's name must be new."""
