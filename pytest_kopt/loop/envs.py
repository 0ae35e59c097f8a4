"""The machine each loop step runs on: its ``env.json`` (SKILL.md step 0's document, as the session's hardware probe
found it) recorded in the run at every step, kept per iteration, and read where it decides something
(``generation_allowed``, the arch the methods are checked against, ``can_read_counters``).

A run's steps may run on different machines (a close on another GPU than the set-up's): ``env.json`` and
``state.env`` are always the latest step's, ``iterv<i>/env.json`` (``env_ablations.json``) the close's own.
"""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any, Mapping

from ..artifacts import write_json
from .layout import RunLayout
from .runstate import State


def same_machine(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """True when two environments name the same GPU (its UUID; without a GPU on either side, never the same)."""
    a, b = (old.get("gpu") or {}).get("uuid"), (new.get("gpu") or {}).get("uuid")
    return a is not None and a == b


def refresh(run_dir: Path, env: Mapping[str, Any], iteration: int | None = None,
            step: str = "branch_explore") -> State:
    """Record ``env``, the environment of the step that runs now, as the run's: ``env.json``, ``state.env``,
    ``generation_allowed`` and ``hardware_attempts`` (SKILL.md step 0, per step), and with ``iteration`` the
    iteration's own copy (``iterv<i>/env.json`` for a close's branch step, ``env_ablations.json`` for its ablation
    step). ``can_read_counters`` is kept from the run's env only on the same GPU (another machine has not shown it
    yet: None until its profile). Returns the state as written."""
    layout = RunLayout.of(run_dir)
    state = State.load(run_dir)
    doc = dict(env)
    if doc.get("can_read_counters") is None and same_machine(state.env, doc):
        doc["can_read_counters"] = state.env.get("can_read_counters")
    write_json(layout.env, doc)
    if iteration is not None:
        it = layout.iteration(iteration)
        write_json(it.env_ablations if step == "ablations" else it.env, doc)
    return State.update(run_dir, env=doc, generation_allowed=bool(doc.get("generation_allowed")),
                        hardware_attempts=list(doc.get("hardware_attempts") or state.hardware_attempts))


def counters_readable(run_dir: Path, readable: bool) -> None:
    """Record SKILL.md's ``can_read_counters`` of this step's machine in ``env.json`` and the state's ``env``: true
    once its profile read counters, false when ncu reported ERR_NVGPUCTRPERM."""
    env = {**State.load(run_dir).env, "can_read_counters": readable}
    write_json(RunLayout.of(run_dir).env, env)
    State.update(run_dir, env=env)


def step_record(env: Mapping[str, Any], step: str) -> dict[str, Any]:
    """What a close's history keeps of the machine one of its steps ran on: ``step``, the host, the GPU's name,
    UUID and arch, the driver, ``generation_allowed``."""
    gpu = env.get("gpu") or {}
    return {"step": step, "host": platform.node(), "gpu": gpu.get("name"), "gpu_uuid": gpu.get("uuid"),
            "sm_arch": env.get("sm_arch"), "driver_version": env.get("driver_version"),
            "generation_allowed": bool(env.get("generation_allowed"))}


def step_arch(env: Mapping[str, Any], arch: str | None) -> str | None:
    """The arch this step builds for: ``--kopt-arch`` when given, else the step's GPU's (None: not known)."""
    return arch or env.get("sm_arch")
