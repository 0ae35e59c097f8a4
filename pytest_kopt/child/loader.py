"""Importing the user's Python files (the reference, a Triton or Python kernel) inside a harness process."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

from . import HarnessError

#: Modules imported in this process, by (name, path, mtime_ns, size): a warm process imports a kernel or reference
#: file once (importing some files twice fails, e.g. a torch.library definition), and again only when it changed.
_MODULES: dict[tuple[str, str, int, int], Any] = {}


def load_module(path: str, name: str) -> Any:
    """Import a Python file by path under ``name`` (the reference or a Triton kernel file), once per version of
    the file in this process, compiled from its source (a ``.pyc`` is never read for it). Raises
    HarnessError('contract') when it cannot be imported."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise HarnessError("contract", f"{path}: cannot be read: {exc}") from exc
    key = (name, str(path), st.st_mtime_ns, st.st_size)
    if key in _MODULES:
        sys.modules[name] = _MODULES[key]
        return _MODULES[key]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise HarnessError("contract", f"{path}: cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    folder = str(Path(path).resolve().parent)
    if folder not in sys.path:  # its neighbours stay importable, after the standard library: never shadowing it
        sys.path.append(folder)
    try:
        # compiled from its source, never from a __pycache__ .pyc, which a candidate's process (same user) could
        # plant beside ref.py with the source's mtime and size in its header
        exec(compile(Path(path).read_bytes(), path, "exec", dont_inherit=True), module.__dict__)
    except Exception as exc:  # the user's module failed at import
        raise HarnessError("contract", f"{path}: import failed: {type(exc).__name__}: {exc}") from exc
    _MODULES[key] = module
    return module
