"""What one pytest process of a session holds, under one ``pytest.StashKey`` (pytest's ``junitxml`` pattern)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ..gates.build import BuildAhead
from ..gates.context import BlockLog, Context
from ..proc.pool import HarnessPool
from ..gates.trust import Trust
from ..settings import Settings


@dataclass
class SessionState:
    """The settings (parsed once), the detected environment (``env.json``; the controller's, handed to workers),
    the session's MAC key, this process's harness pool, block log and builds started ahead, and the
    ``CUDA_VISIBLE_DEVICES`` to give back at unconfigure when this process pinned itself to a GPU
    (``restore_visible``: True and the old value)."""

    settings: Settings
    env: dict[str, Any] = field(default_factory=dict)
    trust: Trust = field(default_factory=Trust)
    pool: HarnessPool = field(default_factory=HarnessPool)
    blocks: BlockLog = field(default_factory=BlockLog)
    builds: BuildAhead = field(default_factory=BuildAhead)
    restore_visible: tuple[bool, str | None] = (False, None)
    kernels: frozenset[Path] = frozenset()
    #: the kernels whose first item ran in this process (:meth:`KoptItem._kickoff` ran for them)
    kicked: set[Path] = field(default_factory=set)
    #: per kernel (resolved path), the gates whose items this process collected (filled at the first item)
    collected: dict[Path, frozenset[str]] = field(default_factory=dict)

    def context(self, config: pytest.Config, kernel: Path, display: str,
                env: dict[str, Any] | None = None, collected: frozenset[str] | None = None) -> Context:
        """The gate context of one kernel file; ``env`` replaces the detected environment (the builds started
        before the GPU probe: :mod:`pytest_kopt.plugin.early`), ``collected`` the gates this process collected of
        it (the gates a worker knows its selection keeps, before it collects: :mod:`pytest_kopt.plugin.xdist`)."""
        assert self.settings.ref is not None
        cache = getattr(config, "cache", None)  # absent under -p no:cacheprovider
        cache_dir = cache.mkdir("kopt") if cache is not None else config.rootpath / ".pytest_cache" / "d" / "kopt"
        return Context(settings=self.settings, env=self.env if env is None else env, kernel=Path(kernel).resolve(),
                       ref=self.settings.ref, display=display, cache_dir=Path(cache_dir), pool=self.pool,
                       blocks=self.blocks, trust=self.trust,
                       collected=self.collected.get(Path(kernel).resolve(), frozenset()) if collected is None
                       else collected)


STATE = pytest.StashKey[SessionState]()
