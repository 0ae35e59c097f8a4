"""kopt's own kernel kinds, in the order they are asked (CUTLASS before plain CUDA, Triton before pure Python):
what ``pytest_kopt_kinds`` answers for kopt (:mod:`pytest_kopt.plugin.hookspec`)."""

from __future__ import annotations

from .base import Kind, KindSet
from .cuda import CudaKind, CutlassKind
from .python import PythonKind
from .triton import TritonKind


def builtin_kinds() -> list[Kind]:
    """A fresh instance of each of kopt's kinds, in detection order."""
    return [CutlassKind(), CudaKind(), TritonKind(), PythonKind()]


def default_kinds() -> KindSet:
    """The kinds of a session that no plugin adds to (for code that runs without one: tests, benchmarks)."""
    return KindSet(builtin_kinds())
