"""What one pytest process of a session holds, under one ``pytest.StashKey`` (pytest's ``junitxml`` pattern)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ..gates.builtin import default_table
from ..gates.context import BlockLog, Context
from ..gates.pins import Pins
from ..gates.table import GateTable
from ..gates.trust import Trust
from ..kinds.base import KindSet
from ..kinds.builtin import default_kinds
from ..loop.layout import artifact_folder
from ..proc.pool import HarnessPool
from ..scheduler import Scheduler
from ..settings import Settings


def with_run_kernel(settings: Settings, kernel: Path) -> Settings:
    """``settings`` with ``kernel``'s artifact folder added where it is a branch or ablation kernel of the run a
    close (``--kopt-run``) judges but not one of this session's kernels: the champion in the close's ablation step,
    the best kernel so far when it is re-timed. Its artifacts (bench.json, sass/, the ncu profile) are where the
    session that judged it wrote them, beside it (:meth:`pytest_kopt.loop.layout.RunLayout.artifact_folder`), not
    in ``--kopt-outdir``. ``kernel`` is a resolved path; for any other kernel, or outside a close, ``settings`` is
    returned unchanged."""
    if settings.loop_mode != "run" or str(kernel) in settings.artifact_dirs:
        return settings
    folder = artifact_folder(settings.run_dir, kernel)
    if folder is None:
        return settings
    return dataclasses.replace(settings, artifact_dirs={**settings.artifact_dirs, str(kernel): str(folder)})


def cache_dir(config: pytest.Config) -> Path:
    """kopt's folder in pytest's cache (``.pytest_cache/d/kopt`` under ``-p no:cacheprovider``)."""
    cache = getattr(config, "cache", None)  # absent under -p no:cacheprovider
    return Path(cache.mkdir("kopt") if cache is not None else config.rootpath / ".pytest_cache" / "d" / "kopt")


@dataclass
class SessionState:
    """The settings (parsed once), the session's kernel kinds and gate table (kopt's own and what plugins added
    through :mod:`pytest_kopt.plugin.hookspec`), the detected environment (``env.json``; the controller's, handed
    to workers), the session's MAC key, this process's harness pool, block log and scheduler of work started ahead,
    and the ``CUDA_VISIBLE_DEVICES`` to give back at unconfigure when this process pinned itself to a GPU
    (``restore_visible``: True and the old value)."""

    settings: Settings
    kinds: KindSet = field(default_factory=default_kinds)
    gates: GateTable = field(default_factory=default_table)
    env: dict[str, Any] = field(default_factory=dict)
    trust: Trust = field(default_factory=Trust)
    pool: HarnessPool = field(default_factory=HarnessPool)
    blocks: BlockLog = field(default_factory=BlockLog)
    scheduler: Scheduler | None = None
    restore_visible: tuple[bool, str | None] = (False, None)
    #: ``HYPOTHESIS_STORAGE_DIRECTORY`` to give back at unconfigure (:func:`pytest_kopt.plugin.tidy.restore`)
    restore_hypothesis: tuple[bool, str | None] = (False, None)
    kernels: frozenset[Path] = frozenset()
    #: the files the session judges by, as they were at its start (the controller's, handed to workers)
    pins: Pins = field(default_factory=Pins)
    #: the kernels whose first item ran in this process (:meth:`KoptItem._kickoff` ran for them)
    kicked: set[Path] = field(default_factory=set)
    #: on an xdist worker, the kernels the controller planned for it, in the plan's order (``kopt_planned``)
    planned: tuple[Path, ...] = ()
    #: the kernels whose next planned kernel's processes were started ahead (at their first correctness item)
    led: set[Path] = field(default_factory=set)
    #: the kernels whose processes were started ahead of their first item here
    started_ahead: set[Path] = field(default_factory=set)
    #: per kernel (resolved path), the gates whose items this process collected (filled at the first item)
    collected: dict[Path, frozenset[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.pool.fork_server = self.settings.fork_server
        if self.scheduler is None:
            self.scheduler = Scheduler(self.pool)

    @property
    def ahead(self) -> Scheduler:
        """This process's scheduler of work started ahead."""
        assert self.scheduler is not None
        return self.scheduler

    def artifact_dir(self, kernel: Path) -> Path:
        """``kernel``'s artifact folder as this session's contexts see it (:meth:`Settings.artifact_dir` with
        :func:`with_run_kernel`): read a kernel's records through this, not through the settings alone."""
        path = Path(kernel).resolve()
        return with_run_kernel(self.settings, path).artifact_dir(path)

    def context(self, config: pytest.Config, kernel: Path, display: str,
                env: dict[str, Any] | None = None, collected: frozenset[str] | None = None) -> Context:
        """The gate context of one kernel file; ``env`` replaces the detected environment (the builds started
        before the GPU probe: :mod:`pytest_kopt.plugin.early`), ``collected`` the gates this process collected of
        it (the gates a worker knows its selection keeps, before it collects: :mod:`pytest_kopt.plugin.xdist`).
        Raises ConfigError when no kind claims the file."""
        assert self.settings.ref is not None
        path = Path(kernel).resolve()
        return Context(settings=with_run_kernel(self.settings, path), env=self.env if env is None else env, kernel=path,
                       ref=self.settings.ref, display=display, cache_dir=cache_dir(config), pool=self.pool,
                       blocks=self.blocks, trust=self.trust, kind=self.kind_of(path), gates=self.gates,
                       ahead=self.ahead, pins=self.pins,
                       collected=self.collected.get(path, frozenset()) if collected is None else collected)

    def take_pins(self) -> None:
        """Pin the session's files (:func:`pytest_kopt.gates.pins.session_pins`): the reference, each kernel with
        its kind's sources, the registries."""
        from .. import registry
        from ..gates.pins import session_pins

        kernels = {k: self.kinds.of(k) for k in self.settings.kernels}
        self.pins = session_pins(self.settings.ref, {k: v for k, v in kernels.items() if v is not None},
                                 registry.files())

    def kind_of(self, kernel: Path) -> Any:
        """The kind that claims ``kernel``. Raises ConfigError when none does."""
        from ..errors import ConfigError

        kind = self.kinds.of(Path(kernel))
        if kind is None:
            raise ConfigError(f"{kernel}: no kernel kind claims it (kinds: "
                              f"{', '.join(k.name for k in self.kinds.kinds)})",
                              fix="give a .cu, a Triton or Python .py, or a file of a plugin's kind")
        return kind


STATE = pytest.StashKey[SessionState]()
