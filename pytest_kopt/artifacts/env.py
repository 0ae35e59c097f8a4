"""``env.json``: the environment the hardware gate detected (SKILL.md step 0: GPUs through a CUDA context, tools,
library versions), in the output folder and in a loop's run directory. :class:`Env` reads it;
:meth:`Env.document` is the one place the document is built (from what :mod:`pytest_kopt.gates.hardware` probed),
:meth:`Env.write` writes it. The same document is the session's environment dict in memory (``Context.env``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .io import read_dict, write_json

ENV = "env.json"
SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True)
class Env:
    """An ``env.json``: ``gpu_available``, ``gpu`` (the first GPU, or a pinned worker's own: ``name``, ``cc``,
    ``uuid``, ``index``, ``sm_count``...; None without one), ``gpus``, ``sm_arch``, ``tools`` (name -> ``path``,
    ``version``), ``packages`` (distribution -> version), ``generation_allowed`` and its ``reason``,
    ``can_read_counters`` (None until the ncu gate tried); ``doc`` is the whole document."""

    schema_version: int | None
    gpu_available: bool
    gpu: dict[str, Any] | None
    gpus: list[dict[str, Any]]
    sm_arch: str | None
    tools: dict[str, dict[str, str | None]]
    packages: dict[str, str | None]
    generation_allowed: bool
    reason: str | None
    can_read_counters: bool | None
    doc: dict[str, Any] = field(repr=False)

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> Env:
        """The record of a document already read (or just built)."""
        doc = dict(doc)
        return cls(schema_version=doc.get("schema_version"), gpu_available=bool(doc.get("gpu_available")),
                   gpu=doc.get("gpu"), gpus=list(doc.get("gpus") or []), sm_arch=doc.get("sm_arch"),
                   tools=dict(doc.get("tools") or {}), packages=dict(doc.get("packages") or {}),
                   generation_allowed=bool(doc.get("generation_allowed")), reason=doc.get("reason"),
                   can_read_counters=doc.get("can_read_counters"), doc=doc)

    @classmethod
    def load(cls, folder: Path) -> Env | None:
        """``<folder>/env.json``, or None when missing, unreadable or not a JSON object."""
        doc = read_dict(Path(folder) / ENV)
        return None if doc is None else cls.from_doc(doc)

    @staticmethod
    def write(folder: Path, env: Mapping[str, Any]) -> Path:
        """Write the environment document ``env`` to ``<folder>/env.json`` atomically; returns its path."""
        return write_json(Path(folder) / ENV, dict(env))

    @staticmethod
    def document(*, gpus: Sequence[dict[str, Any]], sm_arch: str | None, driver_version: str | None,
                 gpu_error: str | None, tools: Mapping[str, dict[str, str | None]],
                 hardware_attempts: list[Any], python: str, packages: Mapping[str, str | None],
                 cuda_visible_devices: str | None) -> dict[str, Any]:
        """SKILL.md's ``env.json`` document (schema :data:`SCHEMA_VERSION`) from what was probed: the GPUs a
        CUDA context could be made on (the first is ``gpu``) and its arch, the driver's version, the probe's error,
        each tool's path and version, each probe attempt, the Python version, the packages' versions and
        ``CUDA_VISIBLE_DEVICES``. ``generation_allowed`` is true only with a GPU and every tool present (SKILL.md
        step 0), ``reason`` says why not; ``can_read_counters`` is None until the ncu gate has tried."""
        gpus = list(gpus)
        missing = [n for n, t in tools.items() if not t["path"]]
        reasons = []
        if not gpus:
            reasons.append(gpu_error or "no GPU")
        if missing:
            reasons.append("missing tools: " + ", ".join(missing))
        return {
            "schema_version": SCHEMA_VERSION,
            "backend": "cuda",
            "gpu_available": bool(gpus),
            "gpu": gpus[0] if gpus else None,
            "gpus": gpus,
            "sm_arch": sm_arch,
            "driver_version": driver_version,
            "gpu_error": gpu_error,
            "tools": tools,
            "can_read_counters": None,
            "generation_allowed": bool(gpus) and not missing,
            "reason": "; ".join(reasons) or None,
            "hardware_attempts": hardware_attempts,
            "python": python,
            "packages": packages,
            "cuda_visible_devices": cuda_visible_devices,
        }
