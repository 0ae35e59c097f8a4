"""What the agent wrote into the open iteration, read and validated before anything is judged: the branch kernels
(``branches/b1..bK/kernel.<ext>``), the ablations (``ablations/<method id>/kernel.<ext>`` and ``base``) and
``methods.json``.

Every path is resolved: a folder or file that leads outside the run (a symlink, even one to a place inside it,
whose artifacts the gates would write where it leads), a folder under ``branches/`` that is not one of the
iteration's ``b1..bK`` (``b1_old``, ``b7`` of a 4-branch run), a folder under ``ablations/`` that names no method
of the registry or of methods.json, a folder with both ``kernel.cu`` and ``kernel.py``, or a ``base`` that is not
UTF-8 or names no written branch is refused with the loop's ConfigError (exit 4), every problem listed.
A symbolic link anywhere below a branch or ablation folder (its ``correctness/``, ``sass/``) is refused too. Hidden
entries (a name starting with ``.``) and plain files beside the folders (a shared header) are left alone: they are
never judged.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from .. import registry
from ..errors import ConfigError
from . import schema
from .layout import KERNEL_NAMES, IterationLayout, RunLayout, branch_index, branch_name
from .methods import normalize_methods

METHODS_FIX = 'write the selected methods as {"methods": [{"id": "memory.shared_memory_tiling", "rationale": "..."}]}'
_FOLDER_FIX = ("keep only b1..bK folders (K = state.json's branches) under branches/ and ablations/<method id>/ "
               "folders under ablations/, as plain folders of the run (no symbolic links); move anything else out "
               "of the run directory")


@dataclass(frozen=True, slots=True)
class Written:
    """The open iteration as written: ``branches`` (the kernels of ``b1..bK`` in index order; an empty folder has
    none), ``ablations`` (method id -> kernel), ``bases`` (method id -> the branch its ``base`` names; ``b1``
    without the file) and ``not_written`` (the branch folders ``b1..bK`` left without a kernel, in order).

    An empty branch folder is listed, not refused: SKILL.md's K is how many folders the iteration opens, and a
    close of fewer written branches is a real choice (an idea dropped, a budget under-filled); writing a filler
    kernel to satisfy a count would be worse. The close reports those branches as ``not_written``."""

    branches: tuple[Path, ...]
    ablations: dict[str, Path]
    bases: dict[str, str]
    not_written: tuple[str, ...]


def links_below(folder: Path) -> list[Path]:
    """Every symbolic link anywhere below a branch or ablation folder (not followed), in walk order: the gates write
    the kernel's artifacts there (``correctness/``, ``sass/``, ``bench.json``) and the close reads them back, so a
    link would send those writes, or the reads, where it leads."""
    out = []
    for root, dirs, files in os.walk(folder, followlinks=False):
        dirs[:] = [d for d in dirs if not d.startswith(".")]  # hidden entries are never judged nor written by kopt
        out += [Path(root, n) for n in sorted(dirs + files) if not n.startswith(".") and Path(root, n).is_symlink()]
    return out


def kernel_in(folder: Path, layout: RunLayout, problems: list[str]) -> Path | None:
    """The ``kernel.cu`` or ``kernel.py`` of a branch or ablation folder, or None when it holds none. Adds a
    problem (and returns None) for a folder with both, a kernel that is not a plain file of the run, or a symbolic
    link anywhere below the folder (:func:`links_below`)."""
    found = [folder / n for n in KERNEL_NAMES if (folder / n).exists() or (folder / n).is_symlink()]
    links = [p for p in links_below(folder) if p not in found]  # a linked kernel is named below
    if links:
        problems.extend(f"{p} is a symbolic link (to {os.readlink(p)}); a branch or ablation folder holds plain "
                        "files and folders only" for p in links)
        return None
    if len(found) > 1:
        problems.append(f"{folder} holds both kernel.cu and kernel.py: keep the one this branch or ablation is")
        return None
    if not found:
        return None
    kernel = found[0]
    why = layout.contained(kernel)
    if why is None and not kernel.is_file():
        why = f"{kernel} is not a regular file"
    if why is not None:
        problems.append(why)
        return None
    return kernel


def read_base(folder: Path, layout: RunLayout, problems: list[str]) -> str | None:
    """The branch an ablation folder derives from: its ``base`` file's text reduced to a branch name (whitespace,
    a byte-order mark and a path to the branch dropped: ``branches/b2/`` is ``b2``), ``b1`` when there is no file.
    Adds a problem (and returns None) for a base that is not a plain UTF-8 file of the run or not a branch name
    (``$defs/base`` of the loop schema)."""
    path = folder / "base"
    if not path.exists() and not path.is_symlink():
        return "b1"
    why = layout.contained(path)
    if why is not None or not path.is_file():
        problems.append(why or f"{path} is not a regular file")
        return None
    try:
        text = schema.read_text(path, fix="").strip()
    except ConfigError as exc:  # not UTF-8, unreadable
        problems.extend(schema.problem_lines(exc))
        return None
    name = text.rstrip("/").rsplit("/", 1)[-1] if text else "b1"
    found = schema.problems(name, "base", str(path))
    problems.extend(f"{p} (write the name of the branch this ablation removes the method from, e.g. b1)"
                    for p in found)
    return None if found else name


def read_methods(it: IterationLayout) -> dict[str, Any]:
    """``methods.json`` of the iteration in its full form (:func:`~pytest_kopt.loop.methods.normalize_methods`),
    checked against ``$defs/methods`` (each entry's ``id`` a string, ``rationale`` and ``override_reason``
    strings, ``acknowledge_failure`` and ``preconditioned`` booleans). Raises the loop's ConfigError (exit 4) for
    a missing, non-UTF-8, non-JSON or ill-typed file; the registry's rules are checked by
    :func:`~pytest_kopt.loop.methods.validate_methods`."""
    path = it.methods
    if (why := RunLayout(it.root).contained(path)) is not None and (path.exists() or path.is_symlink()):
        raise schema.loop_error(f"{path} is not a file of the run", [why], path=path, fix=METHODS_FIX, gate="methods")
    doc = schema.read_json(path, fix=METHODS_FIX, gate="methods")
    try:
        doc = normalize_methods(doc)
    except ValueError as exc:
        raise schema.loop_error(f"{path}: {exc}", [str(exc)], path=path, fix=METHODS_FIX, gate="methods") from None
    found = schema.problems(doc, "methods", path.name)
    if found:
        raise schema.loop_error(f"{path} is not a valid methods.json", found, path=path, fix=METHODS_FIX,
                                gate="methods")
    return doc


def scan(layout: RunLayout, i: int, branches: int, claimed: Iterable[str] = ()) -> Written:
    """The open iteration ``i`` of a run of ``branches`` branches, as the agent wrote it. ``claimed``: the method
    ids of methods.json (an ablation folder may name one of those besides the registry's). Raises the loop's
    ConfigError (exit 4) listing every problem (see the module docstring)."""
    it = layout.iteration(i)
    problems: list[str] = []
    for folder in (it.dir, it.branches_dir, it.ablations_dir):
        why = layout.contained(folder) if folder.exists() or folder.is_symlink() else None
        if why is not None:
            problems.append(why)
    if problems:
        raise schema.loop_error(f"{it.dir} is not the run's own folder", problems, path=it.dir, fix=_FOLDER_FIX)
    names = [branch_name(k) for k in range(1, branches + 1)]
    found_branches: dict[int, Path] = {}
    not_written = []
    for entry in _entries(it.branches_dir):
        k = branch_index(entry.name)
        if entry.is_file() and not entry.is_symlink():
            continue  # a file beside the branches (a shared header) is no branch, and is left alone
        if entry.is_symlink() or not entry.is_dir():
            problems.append(layout.contained(entry) or f"{entry} is not a folder")
        elif k is None or entry.name not in names:
            problems.append(f"{entry} is not a branch folder of {it.name} (its branches are {names[0]}..{names[-1]}, "
                            "state.json's branches)")
        else:
            kernel = kernel_in(entry, layout, problems)
            if kernel is not None:
                found_branches[k] = kernel
    for k, name in enumerate(names, start=1):
        if k not in found_branches:
            not_written.append(name)
    known = {m["id"] for m in registry.load(registry.METHODS)["methods"]} | set(claimed)
    ablations: dict[str, Path] = {}
    bases: dict[str, str] = {}
    for entry in _entries(it.ablations_dir):
        if entry.is_file() and not entry.is_symlink():
            continue
        if entry.is_symlink() or not entry.is_dir():
            problems.append(layout.contained(entry) or f"{entry} is not a folder")
            continue
        if entry.name not in known:
            problems.append(f"{entry} names no method of {registry.path(registry.METHODS).name} or methods.json "
                            "(an ablation folder is ablations/<method id>/)")
            continue
        kernel = kernel_in(entry, layout, problems)
        if kernel is None:
            continue  # a folder the close made for an ablation it asks for, not written yet
        base = read_base(entry, layout, problems)
        if base is None:
            continue
        if base not in [k.parent.name for k in found_branches.values()]:
            written = ", ".join(sorted((k.parent.name for k in found_branches.values()), key=branch_index)) or "none"
            problems.append(f"{entry / 'base'} names {base!r}, which is no written branch of {it.name} "
                            f"({written}): write the name of the branch this ablation removes the method from")
            continue
        ablations[entry.name] = kernel
        bases[entry.name] = base
    if problems:
        raise schema.loop_error(f"{it.dir} holds files the close cannot judge", problems, path=it.dir,
                                fix=_FOLDER_FIX)
    return Written(branches=tuple(found_branches[k] for k in sorted(found_branches)), ablations=ablations,
                   bases=bases, not_written=tuple(not_written))


def _entries(folder: Path) -> list[Path]:
    """The non-hidden entries of a folder, by name ([] when it does not exist)."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if not p.name.startswith("."))
