"""The harness's own functions, and the entry points of torch, time and statistics it measures and judges with,
recorded when a harness process starts (before any kernel or reference file is imported into it) and checked after
every request: a kernel that replaced one (``torch.cuda.Event.elapsed_time`` wrapped to report a fraction of the
time, kopt's timer or its median rebound, a guard's ``torch.equal`` patched) is TAMPERED.

This check runs in the process the candidate controls, so a candidate that knows it can defeat it; it is one layer.
The layers outside the candidate's reach are the judge's process (the verdict, the inputs' check), the pytest
process's clock (:mod:`pytest_kopt.gates.measure`) and ncu's own measurement of the kernel
(:mod:`pytest_kopt.gates.ncu`); ``docs/security.md`` lists which attack each one catches.
"""

from __future__ import annotations

import sys
import types
from typing import Any, NamedTuple

#: (module name, dotted attribute) of entry points outside the package that timing and the guards rely on.
WATCHED = (
    ("torch", "equal"), ("torch", "isnan"), ("torch", "sum"), ("torch", "Tensor.clone"), ("torch", "Tensor.copy_"),
    ("torch", "Tensor.data_ptr"), ("torch", "Tensor.__eq__"), ("torch", "Tensor.__ne__"),
    ("torch.cuda", "synchronize"), ("torch.cuda", "_sleep"), ("torch.cuda", "Event"),
    ("torch.cuda", "Event.record"), ("torch.cuda", "Event.elapsed_time"), ("torch.cuda", "Event.synchronize"),
    ("torch.cuda", "Event.query"), ("torch.cuda", "Stream.synchronize"), ("torch.cuda", "current_stream"),
    ("time", "perf_counter"), ("time", "monotonic"), ("time", "time"), ("statistics", "median"),
    ("json", "dumps"), ("hashlib", "sha256"),
)
#: The package whose own functions and classes are watched (every module of it loaded in the process).
PACKAGE = "pytest_kopt.child"


def _identity(value: Any) -> tuple[int, ...]:
    """What changes when a value is replaced or its function's code, defaults or closure are swapped in place."""
    fn = getattr(value, "__func__", value)
    code = getattr(fn, "__code__", None)
    return (id(value), id(code) if code is not None else 0, id(getattr(fn, "__defaults__", None)),
            id(getattr(fn, "__kwdefaults__", None)), id(getattr(fn, "__closure__", None)))


def _resolve(module: str, dotted: str) -> Any:
    obj: Any = sys.modules.get(module)
    for part in dotted.split("."):
        if obj is None:
            return None
        obj = getattr(obj, part, None)
    return obj


def _own(module: types.ModuleType) -> dict[str, Any]:
    """The functions and classes a module of the package defines or imports by name, and each class's own
    methods, by ``module.attr`` (``module.Class.method``)."""
    out: dict[str, Any] = {}
    for name, value in list(vars(module).items()):
        if isinstance(value, (types.FunctionType, type)) and getattr(value, "__module__", "").startswith(PACKAGE):
            out[f"{module.__name__}.{name}"] = value
            if isinstance(value, type):
                for attr, member in list(vars(value).items()):
                    if isinstance(member, (types.FunctionType, staticmethod, classmethod, property)):
                        out[f"{module.__name__}.{name}.{attr}"] = member
    return out


class Sentinels:
    """The identities recorded at :meth:`take` time; :meth:`changed` lists what differs now. ``dumps`` and
    ``sha256`` are the originals the process writes and attests its results with. Every function the check uses is
    bound when it is taken, so a kernel that rebinds a name here, or a method of this class, does not reach it."""

    def __init__(self) -> None:
        import hashlib
        import json

        self.dumps = json.dumps
        self.sha256 = hashlib.sha256
        self._check: Any = None

    def take(self) -> "Sentinels":
        """Record the identities now (before any kernel or reference file is imported)."""
        self._check = _checker(_current, _resolve, _own, _identity, dict(sys.modules), sys.modules)
        return self

    def changed(self) -> list[str]:
        """The watched names whose value (or function code, defaults, closure) is not the one recorded, or that
        are gone; a name that appeared since (a module imported later) is not a change."""
        return self._check() if self._check is not None else []

    def guard(self) -> "Guard":
        """The check and the originals as plain values, for a caller to hold in its own locals (a kernel that
        replaces a method of this class afterwards does not reach them)."""
        return Guard(self._check or (lambda: []), self.dumps, self.sha256)


class Guard(NamedTuple):
    """What a request's end uses: ``changed()`` (the watched names that changed), ``dumps`` and ``sha256``."""

    changed: Any
    dumps: Any
    sha256: Any


def _current(resolve: Any, own: Any, identity: Any, modules: Any) -> dict[str, tuple[int, ...]]:
    now: dict[str, tuple[int, ...]] = {}
    for module, dotted in WATCHED:
        value = resolve(module, dotted)
        if value is not None:
            now[f"{module}.{dotted}"] = identity(value)
    for name, module in list(modules.items()):
        if name.startswith(PACKAGE) and isinstance(module, types.ModuleType):
            now.update({k: identity(v) for k, v in own(module).items()})
    return now


def _checker(current: Any, resolve: Any, own: Any, identity: Any, _snapshot: Any, modules: Any) -> Any:
    """A closure over the check's own functions and the identities recorded now."""
    recorded = current(resolve, own, identity, modules)

    def check() -> list[str]:
        now = current(resolve, own, identity, modules)
        return sorted(k for k, v in recorded.items() if now.get(k) != v)

    return check
