"""Importing the user's Python files (the reference, a Triton or Python kernel) inside a harness process."""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from . import HarnessError

#: Modules imported in this process, by (name, path, SHA-256 of the source): a warm process imports a kernel or
#: reference file once (importing some files twice fails, e.g. a torch.library definition), and again only when its
#: content changed.
_MODULES: dict[tuple[str, str, str], Any] = {}


def load_module(path: str, name: str, sha: str | None = None) -> Any:
    """Import a Python file by path under ``name`` (the reference or a Triton kernel file), once per content of
    the file in this process, compiled from the bytes read (a ``.pyc`` is never read for it, and no other read of
    the file can differ from what is run). With ``sha`` (the SHA-256 the pytest process pinned at the session's
    start) a file whose content is not that is refused: HarnessError('changed'). Raises HarnessError('contract')
    when it cannot be read or imported."""
    try:
        source = Path(path).read_bytes()
    except OSError as exc:
        raise HarnessError("contract", f"{path}: cannot be read: {exc}") from exc
    digest = hashlib.sha256(source).hexdigest()
    if sha is not None and digest != sha:
        raise HarnessError("changed", f"{path} changed during the session: its SHA-256 is {digest[:16]}..., not "
                           f"{sha[:16]}... as at the session's start",
                           fix="a file the session judges by must not change while it runs: find what wrote it (a "
                               "kernel's code runs as you), restore it and run the session again")
    key = (name, str(path), digest)
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
        exec(compile(source, path, "exec", dont_inherit=True), module.__dict__)
    except Exception as exc:  # the user's module failed at import
        raise HarnessError("contract", f"{path}: import failed: {type(exc).__name__}: {exc}") from exc
    # the bytes it was run from, for whoever re-reads its module-level statements (a KernelBench problem's sizes
    # derived from other sizes, :func:`pytest_kopt.child.kernelbench.set_sizes`)
    module.__kopt_source__ = source
    _MODULES[key] = module
    return module
