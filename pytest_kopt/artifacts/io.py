"""Atomic writers and tolerant readers of the files pytest-kopt writes.

Every JSON file goes through :func:`write_json` (a temp file in the same folder, then ``os.replace``), so a reader
never sees half a file. Readers are tolerant (pytest's ``stepwise`` plugin's rule): a missing or corrupt file reads
as None, never a traceback, and the caller decides what that means.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any


def _temp_beside(path: Path) -> tuple[int, str]:
    """A new temporary file in ``path``'s folder (descriptor, name), named after ``path`` cut to 64 bytes: a name
    near the file system's 255-byte limit leaves no room for the temporary file's own additions."""
    return tempfile.mkstemp(dir=path.parent, prefix=f".{cut(path.name)}.", suffix=".tmp")


def cut(name: str, limit: int = 64) -> str:
    """``name`` cut to at most ``limit`` bytes as the file system takes it (:func:`os.fsencode`), never inside a
    character; bytes that are no UTF-8 (a name's undecodable bytes) are left out: it names a temporary file."""
    return os.fsencode(name)[:limit].decode("utf-8", "ignore")


#: What a file name made from a label may not hold as it is: the path separators, ``%`` (the escape itself), and
#: control characters (NUL among them).
_UNSAFE = re.compile(r"[/\\%\x00-\x1f\x7f\ud800-\udfff]")
#: A name made from a label is at most this many bytes: the file system's limit is 255, and ``.json`` or a temporary
#: file's additions go beside it.
NAME_LIMIT = 160


def file_name(label: str) -> str:
    """``label`` (a case or shape label, ``M=64,case=dense,seed=7``: its string dims are the problem's to choose) as
    one file name that stays in its folder: each path separator, ``%``, control character and lone surrogate as
    ``%XX``, a name of only dots (``.``, ``..``) with its first one escaped, an empty one as ``%``, and one over
    :data:`NAME_LIMIT` bytes cut, with the first 12 hex digits of its SHA-256 after a ``~``, so two long labels
    never share a name. A label without any of these is returned as it is."""
    name = _UNSAFE.sub(lambda m: f"%{ord(m.group()):02X}", label)
    if set(name) <= {"."}:  # "", ".", "..": a name of its own, never the folder or its parent
        name = "%2E" + name[1:] if name else "%"
    raw = os.fsencode(name)
    if len(raw) <= NAME_LIMIT:
        return name
    digest = hashlib.sha256(raw).hexdigest()[:12]
    return raw[:NAME_LIMIT - 13].decode("utf-8", "ignore") + "~" + digest


def write_json(path: Path, data: Any) -> Path:
    """Write ``data`` as indented JSON to ``path`` atomically (temp file in the same folder, then ``os.replace``);
    creates the folder. Values JSON cannot encode are written as their ``str()``. Returns ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _temp_beside(path)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, default=str)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_text(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (summary.md, analysis templates); creates the folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _temp_beside(path)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def read_json(path: Path) -> Any | None:
    """The JSON document at ``path``, or None when it is missing, unreadable or not valid JSON."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def read_dict(path: Path) -> dict[str, Any] | None:
    """:func:`read_json`, but None unless the document is a JSON object."""
    doc = read_json(path)
    return doc if isinstance(doc, dict) else None
