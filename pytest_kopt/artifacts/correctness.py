"""``correctness/<case>.json``: what one correctness case decided, for one build, signed by the session.
:class:`CorrectnessRecord` reads it; :meth:`CorrectnessRecord.start` begins the document the correctness gate fills
in and :meth:`CorrectnessRecord.write` writes it with its MAC. Field names are the ones on disk; the document has no
schema version.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .io import file_name, read_dict, write_json

#: The folder of a kernel's artifact folder the records are in, one ``<case label>.json`` per case.
CORRECTNESS = "correctness"


@dataclass(frozen=True, slots=True)
class CorrectnessRecord:
    """``correctness/<case>.json``: what one correctness case decided, for this build (``fingerprint``) and signed
    by the session (``mac``, see :mod:`pytest_kopt.gates.trust`), so the timing and ncu gates of the same session can
    rely on it without re-running the case. ``call_ms``: one warm call's wall time (ms) as the candidate's process
    saw it, None when it did not say."""

    fingerprint: str | None
    passed: bool
    mac: str | None
    status: str | None
    message: str | None
    doc: dict[str, Any] = field(repr=False)
    call_ms: float | None = None

    @staticmethod
    def path(outdir: Path, label: str) -> Path:
        """Where the record of the case labelled ``label`` is, in the kernel's artifact folder ``outdir`` (the label as
        a file name: :func:`~pytest_kopt.artifacts.io.file_name`)."""
        return Path(outdir) / CORRECTNESS / f"{file_name(label)}.json"

    @classmethod
    def load(cls, path: Path) -> CorrectnessRecord | None:
        """The record at ``path`` (:meth:`path`), or None when missing or unreadable."""
        doc = read_dict(path)
        if doc is None:
            return None
        call_ms = doc.get("call_ms")
        return cls(fingerprint=doc.get("fingerprint"), passed=bool(doc.get("passed")), mac=doc.get("mac"),
                   status=doc.get("status"), message=doc.get("message"), doc=doc,
                   call_ms=float(call_ms) if isinstance(call_ms, (int, float)) else None)

    @staticmethod
    def start(case: Mapping[str, Any], device: str, fingerprint: str) -> dict[str, Any]:
        """The document of a case about to run, not passed yet: the gate adds what it finds (``plan``,
        ``call_ms``, the verdict's figures, ``status``, ``message``...) and sets ``passed``."""
        return {"case": case, "device": device, "fingerprint": fingerprint, "passed": False}

    @staticmethod
    def write(outdir: Path, label: str, doc: Mapping[str, Any], mac: str) -> Path:
        """Write the case's record ``doc`` with its ``mac`` (the session key's MAC of its fingerprint and verdict,
        :meth:`pytest_kopt.gates.trust.Trust.mac`) to :meth:`path` atomically; returns the path."""
        return write_json(CorrectnessRecord.path(outdir, label), {**doc, "mac": mac})


#: ``edges.json`` in the kernel's artifact folder (beside ``correctness/``, which holds one record per case): the
#: kernel's edge shapes (:meth:`pytest_kopt.gates.edges.EdgePlan.document`), the dtypes checked and the shapes
#: excluded and why; written by :func:`write_edges`, read back with ``read_dict``.
EDGES = "edges.json"


def write_edges(outdir: Path, doc: Mapping[str, Any]) -> Path:
    """Write the kernel's ``edges.json`` (``note``, ``sizes``, ``checked``: category, dims, label; ``excluded``:
    label, reason; ``dtypes``) into its artifact folder ``outdir`` atomically; returns the path."""
    return write_json(Path(outdir) / EDGES, dict(doc))
