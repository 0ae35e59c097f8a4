"""The files a session judges by, pinned at its start: the SHA-256 of the reference and the ``.py`` files beside it,
of each kernel and what its kind builds it from (local headers, ``.py`` neighbours), and of the registries.

A candidate's code runs as the user, with the user's rights on every file: it can rewrite ``ref.py`` on its first
call, or another candidate's kernel, or the registry of SASS signatures. The pytest process takes the hashes once,
at configure (the xdist controller, before any worker or harness process starts; workers get its pins), and every
item checks the files it depends on before it runs (:meth:`Pins.verify`); the judge's process loads the reference
only if its content is the pinned one (:func:`pytest_kopt.child.loader.load_module`). A file that changed is a
configuration error (exit 4, FILE_CHANGED) naming it, never a verdict on a kernel.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError


def file_sha256(path: Path) -> str | None:
    """SHA-256 (hex) of a file's bytes, None when it cannot be read."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def neighbours(path: Path) -> list[Path]:
    """The ``.py`` files beside ``path`` (a reference or a Python kernel may import them), ``path`` excluded; and
    a GPU MODE ``task.yml`` beside it with the files it lists (``../utils.py``), which the problem imports."""
    from ..child.gpumode import task_files

    try:
        here = sorted(p for p in Path(path).parent.glob("*.py") if p.resolve() != Path(path).resolve())
    except OSError:
        return []
    task = Path(path).parent / "task.yml"
    listed = sorted(set(task_files(path).values()) - {p.resolve() for p in here})
    return here + ([task] if task.is_file() else []) + listed


@dataclass(frozen=True, slots=True)
class Pins:
    """``files``: resolved path -> SHA-256 at the session's start (None: it could not be read then). ``groups``:
    a pinned file (the reference, a kernel) -> every file pinned with it (itself, its neighbours, its headers)."""

    files: Mapping[str, str | None] = field(default_factory=dict)
    groups: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def take(cls, roots: Mapping[Path, Iterable[Path]]) -> "Pins":
        """Hash each root and the files pinned with it (``roots``: file -> its companions)."""
        files: dict[str, str | None] = {}
        groups: dict[str, tuple[str, ...]] = {}
        for root, companions in roots.items():
            members = [Path(root).resolve(), *(Path(c).resolve() for c in companions)]
            groups[str(members[0])] = tuple(dict.fromkeys(str(m) for m in members))
            for m in members:
                files.setdefault(str(m), file_sha256(m))
        return cls(files, groups)

    def sha(self, path: Path) -> str | None:
        """The pinned SHA-256 of ``path``, None when it is not pinned."""
        return self.files.get(str(Path(path).resolve()))

    def changed(self, roots: Iterable[Path]) -> list[tuple[str, str | None, str | None]]:
        """(file, pinned, now) of each file pinned with ``roots`` whose content is not the pinned one."""
        out = []
        seen: set[str] = set()
        for root in roots:
            for f in self.groups.get(str(Path(root).resolve()), ()):
                if f in seen:
                    continue
                seen.add(f)
                now = file_sha256(Path(f))
                if now != self.files.get(f):
                    out.append((f, self.files.get(f), now))
        return out

    def verify(self, roots: Iterable[Path], gate: str = "") -> None:
        """Raise ConfigError (FILE_CHANGED, exit 4) naming each file pinned with ``roots`` that changed (or
        appeared, or went) since the session's start."""
        changed = self.changed(roots)
        if not changed:
            return
        shown = "; ".join(f"{f} ({'gone' if now is None else 'new' if was is None else 'SHA-256 ' + now[:12]}..."
                          f"{'' if was is None else ', was ' + was[:12] + '...'})" for f, was, now in changed)
        raise ConfigError(f"{len(changed)} file(s) the session judges by changed while it ran: {shown}", gate=gate,
                          path=changed[0][0], status="FILE_CHANGED",
                          fix="restore the file(s) and run the session again; a kernel's code runs as you and can "
                              "write any file you can: find what wrote it (run the kernels one per session)")

    def to_json(self) -> dict[str, object]:
        """Builtins for an xdist worker (:meth:`from_json`)."""
        return {"files": dict(self.files), "groups": {k: list(v) for k, v in self.groups.items()}}

    @classmethod
    def from_json(cls, doc: Mapping[str, object]) -> "Pins":
        """The pins :meth:`to_json` wrote (a worker adopts its controller's)."""
        files = doc.get("files") if isinstance(doc.get("files"), dict) else {}
        groups = doc.get("groups") if isinstance(doc.get("groups"), dict) else {}
        return cls(dict(files), {k: tuple(v) for k, v in groups.items()})  # type: ignore[union-attr, arg-type]


def session_pins(ref: Path | None, kernels: Mapping[Path, object], registry_files: Iterable[Path]) -> Pins:
    """The pins of a session: the reference with its ``.py`` neighbours, each kernel with what its kind builds it
    from (``kernels``: path -> its kind, whose ``sources(path)`` lists them), and the registries (one group, keyed
    by its first file)."""
    roots: dict[Path, list[Path]] = {}
    if ref is not None:
        roots[Path(ref)] = neighbours(Path(ref))
    for kernel, kind in kernels.items():
        roots[Path(kernel)] = list(getattr(kind, "sources")(Path(kernel)))
    regs = sorted(Path(p) for p in registry_files)
    if regs:
        roots[regs[0]] = regs[1:]
    return Pins.take(roots)
