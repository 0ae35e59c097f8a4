"""The run's pinned inputs: private copies of the reference (and the modules beside it that it imports) and of the
baseline, made at ``--kopt-init``, with the SHA-256 of each copy, of each champion copy ``iterv{i}/kernel.<ext>``
and of the registry files the run's rules come from, recorded in ``state.json`` (``pinned_sha256``,
``registries_sha256``). ``--kopt-run`` judges against the copies only and refuses (exit 4, naming the file) a
copy whose bytes changed, a file added to ``reference/``, or a registry file that changed.

What this protects against: a reference or baseline swapped or edited between steps, by accident (an editor, a
``git checkout``) or by a candidate's process writing where it should not, so that a wrong branch passes and an
honest one fails; ``state.json``'s ``ref_file`` pointed at another (lax) reference; a module planted beside the
reference copy. What it cannot protect against: someone who edits a copy *and* its hash in ``state.json`` on
purpose (the hashes are a record, not a signature), and a ``.pyc`` planted in ``reference/__pycache__/`` for a
neighbour module the reference imports (the reference file itself is always compiled from its source:
:func:`pytest_kopt.child.loader.load_module`).
"""

from __future__ import annotations

import ast
import hashlib
import os
import shutil
import stat
from pathlib import Path
from typing import Mapping

from .. import registry
from .layout import RunLayout

#: The registry files whose rules a run applies (methods.json's validation, the SASS signatures, ncu's metrics, and
#: the schema every loop file is validated against when read: a schema loosened between steps would admit files the
#: run was seeded to refuse).
REGISTRIES = (registry.METHODS, registry.SASS, registry.METRICS, registry.LOOP_SCHEMA)
#: A GPU MODE reference reads its shapes from ``task.yml`` beside it (:func:`pytest_kopt.gates.shapes.task_shapes`).
DATA_FILES = ("task.yml",)
#: The most files copied for the modules a reference imports (a folder of thousands is not a reference's helper).
MAX_FILES = 200


def file_sha256(path: Path) -> str | None:
    """SHA-256 (hex) of a file's bytes, None when it is gone or unreadable."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def imported_neighbours(source: Path) -> list[Path]:
    """The files beside ``source`` that it imports, directly or through each other: ``name.py`` for ``import name``
    / ``from name import ...``, and every ``.py`` of a package folder ``name/`` (with its ``__init__.py``);
    relative imports are taken from the same folder. A file that does not parse imports nothing here (the
    preflight gate reports it). At most :data:`MAX_FILES` files."""
    folder = source.parent
    seen: dict[Path, None] = {}
    todo = [source]
    while todo and len(seen) < MAX_FILES:
        current = todo.pop()
        try:
            tree = ast.parse(current.read_bytes(), filename=str(current))
        except (OSError, SyntaxError, ValueError):
            continue
        names: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.module:
                    names.add(node.module.split(".")[0])
                if node.level:  # from . import helper
                    names.update(a.name for a in node.names)
        for name in sorted(names):
            module, package = folder / f"{name}.py", folder / name
            if module.is_file() and module != source and module not in seen:
                seen[module] = None
                todo.append(module)
            elif (package / "__init__.py").is_file():
                for f in sorted(package.rglob("*.py")):
                    if "__pycache__" not in f.parts and f not in seen and len(seen) < MAX_FILES:
                        seen[f] = None
                        todo.append(f)
    return list(seen)


def _copy_readonly(src: Path, dest: Path) -> str:
    """Copy ``src`` to ``dest`` (folders made), make the copy read-only, return its SHA-256."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.unlink(missing_ok=True)  # a read-only copy of an earlier attempt (a close re-run after a crash)
    shutil.copyfile(src, dest)
    os.chmod(dest, stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
    return hashlib.sha256(dest.read_bytes()).hexdigest()


def pin_reference(layout: RunLayout, ref: Path) -> tuple[Path, dict[str, str]]:
    """Copy the reference, the files beside it that it imports (:func:`imported_neighbours`) and its data files
    (:data:`DATA_FILES`) into ``reference/``, read-only. Returns (the copy of ``ref``, ``{path in the run:
    SHA-256}``). Raises OSError when a file cannot be read or written."""
    pins: dict[str, str] = {}
    dest = layout.reference(ref.name)
    pins[layout.relative(dest)] = _copy_readonly(ref, dest)
    extra = imported_neighbours(ref) + [ref.parent / n for n in DATA_FILES if (ref.parent / n).is_file()]
    for f in extra:
        target = layout.reference_dir / f.relative_to(ref.parent)
        pins[layout.relative(target)] = _copy_readonly(f, target)
    return dest, pins


def pin_file(layout: RunLayout, src: Path, dest: Path) -> dict[str, str]:
    """Copy ``src`` to ``dest`` inside the run, read-only; returns ``{path in the run: SHA-256}``."""
    return {layout.relative(dest): _copy_readonly(src, dest)}


def registry_hashes() -> dict[str, str]:
    """SHA-256 of each registry file of :data:`REGISTRIES`, by file name."""
    out = {}
    for name in REGISTRIES:
        p = registry.path(name)
        out[p.name] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def schema_problem(state_doc: object) -> str | None:
    """Whether the loop's schema changed since the run was seeded, read from ``state_doc`` (state.json's JSON,
    before it is validated: the schema that would validate it is the file in question, and a loosened one would let
    a malformed state.json through to code that trusts its types). The problem's line, as :func:`check` words it;
    None when it is unchanged, or when state.json records no hash for it (a run seeded before it was pinned)."""
    recorded = state_doc.get("registries_sha256") if isinstance(state_doc, Mapping) else None
    name = registry.path(registry.LOOP_SCHEMA).name
    want = recorded.get(name) if isinstance(recorded, Mapping) else None
    if not isinstance(want, str):
        return None
    now = file_sha256(registry.path(registry.LOOP_SCHEMA))
    return None if now == want else _registry_changed(name, want, now)


def _registry_changed(name: str, want: str, now: str | None) -> str:
    """The problem line of registry file ``name`` whose SHA-256 is ``now``, recorded as ``want`` at --kopt-init."""
    return (f"{registry.REGISTRY_DIR / name}: the registry changed since the run was seeded "
            f"(SHA-256 {want[:16]}..., now {str(now)[:16]}...)")


def check(layout: RunLayout, pinned: Mapping[str, str], registries: Mapping[str, str]) -> list[str]:
    """Each pinned file that is gone or changed (its recorded and current SHA-256), each file in ``reference/``
    that was not pinned (``__pycache__`` aside), and each registry file that changed since the run was seeded;
    [] when all are as recorded."""
    problems = []
    for rel, want in sorted(pinned.items()):
        path = layout.root / rel
        if path.is_symlink() or (path.exists() and not path.is_file()):
            problems.append(f"{path}: pinned at --kopt-init as a plain file, now a link or a folder")
            continue
        got = file_sha256(path)
        if got is None:
            problems.append(f"{path}: pinned at --kopt-init, now gone")
        elif got != want:
            problems.append(f"{path}: changed since it was pinned (SHA-256 {want[:16]}..., now {got[:16]}...)")
    ref_dir = layout.reference_dir
    if ref_dir.is_dir():
        for f in sorted(ref_dir.rglob("*")):
            rel = layout.relative(f)
            if "__pycache__" in f.relative_to(ref_dir).parts or (f.is_dir() and not f.is_symlink()) or rel in pinned:
                continue
            problems.append(f"{f}: added to the run's private reference folder after --kopt-init")
    now = registry_hashes()
    for name, want in sorted(registries.items()):
        if now.get(name) != want:
            problems.append(_registry_changed(name, want, now.get(name)))
    return problems
