"""GPU MODE problems by their own rules (gpu-mode/reference-kernels: each problem's ``task.yml``, its ``eval.py``
and ``utils.py``), as a kopt reference.

- ``task.yml``'s ``files:`` are what the runner copies beside ``eval.py``: every listed ``.py`` is importable by
  its name (``from utils import make_match_reference``, where ``utils.py`` lives in the problem's parent folder),
  through :class:`TaskFiles`; the submission (``@SUBMISSION@``) is the candidate.
- ``data`` is taken apart into named buffers (:func:`split`) and rebuilt for each call (:func:`join`).
- Tolerances: the problem's own (``atol``/``rtol`` in ``reference.py``, else those of a ``check_implementation``
  made by ``make_match_reference(ref_kernel, rtol=..., atol=...)``, else the defaults of the ``match_reference``
  it wraps), applied by kopt's judge with all its guards.
- A ``check_implementation`` of the problem's own (a property check: QᵀQ ≈ I for QR, A·V ≈ V·Λ for eigh; a
  tolerance scaled with the size) decides the values of every call instead of the element-wise comparison with
  ``ref_kernel``, whose answer is not the only right one there (:func:`problem_verdict`).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import math
import os
import sys
from pathlib import Path
from typing import Any, Callable

from . import HarnessError
from .gpuonly import gpu_only
from .inputs import made_shapes


def task_files(ref_path: str | Path) -> dict[str, Path]:
    """Module name -> file, for each ``.py`` that the ``task.yml`` beside ``ref_path`` lists under ``files:``
    (``{"name": "utils.py", "source": "../utils.py"}``, the source taken from ``task.yml``'s folder), but the
    submission (``@SUBMISSION@``) and the reference itself; {} without a ``task.yml``, pyyaml or ``files:``."""
    yml = Path(ref_path).parent / "task.yml"
    if not yml.is_file():
        return {}
    try:
        import yaml
    except ImportError:
        return {}
    try:
        doc = yaml.safe_load(yml.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):  # task.yml's own errors are the settings' to report
        return {}
    entries = doc.get("files") if isinstance(doc, dict) else None
    out: dict[str, Path] = {}
    for entry in entries if isinstance(entries, list) else []:
        name, source = (entry.get("name"), entry.get("source")) if isinstance(entry, dict) else (None, None)
        if not (isinstance(name, str) and name.endswith(".py") and isinstance(source, str)) or source.startswith("@"):
            continue
        file = (yml.parent / source).resolve()
        if file.is_file() and file != Path(ref_path).resolve() and name[:-3].isidentifier():
            out[name[:-3]] = file
    return out


class TaskFiles(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the modules a ``task.yml`` lists by their names, before the path's own (the runner's copy beside
    ``eval.py`` is what the problem imports), never in place of the standard library's; each is compiled from its
    source, a ``.pyc`` beside it never read."""

    def __init__(self, files: dict[str, Path]) -> None:
        self.files = {k: v for k, v in files.items() if k not in sys.stdlib_module_names}

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        file = self.files.get(fullname) if path is None else None
        return importlib.util.spec_from_file_location(fullname, file, loader=self) if file else None

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: Any) -> None:
        file = self.files[module.__name__]
        exec(compile(file.read_bytes(), str(file), "exec", dont_inherit=True), module.__dict__)


def install_task_files(ref_path: str | Path) -> None:
    """Make the files ``task.yml`` lists importable in this process (:class:`TaskFiles`, ahead of the path
    finder); once per process, later problems' files added to the same finder."""
    files = task_files(ref_path)
    if not files:
        return
    for finder in sys.meta_path:
        if isinstance(finder, TaskFiles):
            finder.files.update(TaskFiles(files).files)
            return
    at = next((i for i, f in enumerate(sys.meta_path) if f is importlib.machinery.PathFinder), len(sys.meta_path))
    sys.meta_path.insert(at, TaskFiles(files))


def split(data: Any, torch: Any, prefix: str = "") -> dict[str, Any]:
    """GPU MODE ``data`` as named buffers and values: ``data`` (a tensor), ``t0``... (tuple/list items), ``d_<key>``
    (dict entries), nested with dots (``t1.d_w``: the ``w`` of the dict that is the tuple's second item)."""
    if isinstance(data, torch.Tensor) or isinstance(data, (int, float, str, bool)) or data is None:
        return {prefix[:-1] if prefix else "data": data}
    if isinstance(data, (tuple, list)):
        out: dict[str, Any] = {}
        for i, v in enumerate(data):
            out.update(split(v, torch, f"{prefix}t{i}."))
        return out
    if isinstance(data, dict):
        out = {}
        for k, v in data.items():
            out.update(split(v, torch, f"{prefix}d_{k}."))
        return out
    raise HarnessError("contract", f"generate_input() returned a {type(data).__name__}; kopt takes tensors, numbers "
                       "and tuples, lists or dicts of them")


def _part(key: str) -> bool:
    return key[:1] == "t" and key[1:].isdigit() or key.startswith("d_")


def join(kw: dict[str, Any]) -> Any:
    """The inverse of :func:`split` over a call's keyword arguments (dims and other names are ignored)."""
    if "data" in kw:
        return kw["data"]
    tree: dict[str, Any] = {}
    for key, value in kw.items():
        parts = key.split(".")
        if not all(_part(p) for p in parts):
            continue
        node = tree
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value

    def build(node: dict[str, Any]) -> Any:
        items = {k: build(v) if isinstance(v, dict) and v and all(_part(c) for c in v) else v
                 for k, v in node.items()}
        if items and all(k[:1] == "t" and k[1:].isdigit() for k in items):
            return tuple(v for _, v in sorted((int(k[1:]), v) for k, v in items.items()))
        return {k[2:]: v for k, v in items.items()}

    return build(tree)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0


def match_tolerances(module: Any, check: Any) -> dict[str, float] | None:
    """``{"atol", "rtol"}`` of a ``check_implementation`` that compares element-wise with the problem's own
    ``ref_kernel`` (a closure over it, as ``make_match_reference(ref_kernel, rtol=..., atol=...)`` makes): the
    tolerances it closes over (its ``kwargs``, or ``rtol``/``atol`` themselves), else the defaults of the function it
    calls (``match_reference(..., rtol=1e-05, atol=1e-08)`` in GPU MODE's utils.py). None for any other checker."""
    if not callable(check) or not getattr(check, "__closure__", None):
        return None
    try:
        seen = inspect.getclosurevars(check)
    except (TypeError, ValueError):
        return None
    ref = getattr(module, "ref_kernel", None)
    if ref is None or not any(v is ref for v in seen.nonlocals.values()):
        return None
    kwargs = seen.nonlocals.get("kwargs")
    given = {k: v for k, v in (kwargs.items() if isinstance(kwargs, dict) else ()) if k in ("atol", "rtol")}
    given.update({k: seen.nonlocals[k] for k in ("atol", "rtol") if k in seen.nonlocals and k not in given})
    for fn in seen.globals.values():
        try:
            params = inspect.signature(fn).parameters if callable(fn) else {}
        except (TypeError, ValueError):
            continue
        for k in ("atol", "rtol"):
            if k in params and k not in given and _number(params[k].default):
                given[k] = params[k].default
    if set(given) != {"atol", "rtol"} or not all(_number(v) for v in given.values()):
        return None
    return {k: float(v) for k, v in given.items()}


class GpuModeReference:
    """A GPU MODE problem module as a kopt reference (the module docstring says how). ``atol``/``rtol``: the
    problem's own (None: kopt's defaults), ``tolerance_source`` where they come from; ``checker``: its
    ``check_implementation`` when that is a check of its own (not an element-wise comparison with ``ref_kernel``),
    else None; ``draws_regimes``: kopt's value regimes apply (no checker of its own, whose checks may rely on the
    structure of the problem's inputs: a symmetric matrix for eigh)."""

    format = "gpumode"

    def __init__(self, module: Any, path: str) -> None:
        self.module, self.path = module, path
        check = getattr(module, "check_implementation", None)
        matched = match_tolerances(module, check)
        own = {k: getattr(module, k) for k in ("atol", "rtol") if getattr(module, k, None) is not None}
        self.atol = own.get("atol", (matched or {}).get("atol"))
        self.rtol = own.get("rtol", (matched or {}).get("rtol"))
        self.tolerance_source = ("reference.py's atol/rtol" if own else
                                 "reference.py's check_implementation (match_reference)" if matched else None)
        self.checker: Callable[..., Any] | None = check if callable(check) and matched is None else None
        self.draws_regimes = self.checker is None

    def make_inputs(self, seed: int, **dims: Any) -> dict[str, Any]:
        """``generate_input(**dims, seed=seed)`` taken apart (:func:`split`)."""
        import torch

        try:
            data = self.module.generate_input(**dims, seed=int(seed))
        except HarnessError:
            raise
        except Exception as exc:
            raise gpu_only(exc, f"{self.path}: generate_input({', '.join(f'{k}={v!r}' for k, v in dims.items())}, "
                                f"seed={seed})", f"{os.path.basename(self.path)}: generate_input()") from exc
        return split(data, torch)

    def shapes(self, **dims: Any) -> dict[str, tuple[list[int], str]]:
        """The buffers the problem's generator makes at ``dims``, as (shape, dtype): what a candidate's reported
        buffers are held to (:func:`~pytest_kopt.child.inputs.made_shapes`)."""
        return made_shapes(self.make_inputs(seed=0, **dims))

    def reference(self, **kw: Any) -> Any:
        return self.module.ref_kernel(join(kw))


def output_of(torch: Any, names: list[str], arrays: dict[str, Any], device: str,
              dtypes: dict[str, Any] | None = None) -> Any:
    """A call's output as ``custom_kernel`` returned it, from its arrays by the reference's output names: one
    tensor (``out``), a tuple (``out0``, ``out1``...) or a dict; host arrays as tensors on ``device`` in the dtype the
    candidate's process reported (an ``.npz`` widens bf16)."""
    def tensor(name: str) -> Any:
        a = arrays[name]
        t = a if isinstance(a, torch.Tensor) else torch.from_numpy(a)
        want = (dtypes or {}).get(name)
        t = t.to(device=device, dtype=getattr(torch, want)) if isinstance(want, str) and hasattr(torch, want) \
            else t.to(device)
        return t

    if names == ["out"]:
        return tensor("out")
    if all(n == f"out{i}" for i, n in enumerate(names)):
        return tuple(tensor(n) for n in names)
    return {n: tensor(n) for n in names}


def run_check(check: Callable[..., Any], data: Any, output: Any) -> tuple[bool, str]:
    """``check_implementation(data, output)`` as (passed, message): GPU MODE's checkers return ``(bool, str)``;
    older ones a message, empty when right; a bare bool is taken as it is; an exception is a failure."""
    try:
        got = check(data, output)
    except Exception as exc:  # the check itself failed on this output: a shape or dtype it did not expect
        return False, f"raised {type(exc).__name__}: {str(exc)[:300]}"
    if isinstance(got, tuple) and got:
        return bool(got[0]), str(got[1]) if len(got) > 1 else ""
    if isinstance(got, str):
        return not got, got
    return bool(got), ""


def problem_verdict(torch: Any, checker: Callable[..., Any], names: list[str], cand: dict[str, Any],
                    data_of: Callable[[str], Any], device: str, dtypes: dict[str, Any] | None,
                    calls: tuple[tuple[str, str], ...] = (("cand1", "A"), ("cand2", "A"), ("candB", "B"),
                                                           ("candC", "B"))) -> dict[str, Any]:
    """The verdict of a problem checked by its own ``check_implementation``: every call's output (``calls``: array
    tag and input set) must keep the first call's shapes and pass the check on the judge's own pristine inputs of
    its set (``data_of(set)``, drawn afresh for each call: a check may write into ``data``'s output buffer). Returns
    the verdict as :func:`pytest_kopt.child.correctness.verdict_of` does, its figures ``checked_by`` and ``calls``."""
    figures: dict[str, Any] = {"checked_by": "check_implementation", "calls": 0}
    first = {n: tuple(getattr(cand.get(f"cand1__{n}"), "shape", ())) for n in names}
    for tag, which in calls:
        arrays = {n: cand[f"{tag}__{n}"] for n in names if f"{tag}__{n}" in cand}
        if len(arrays) < len(names):
            continue
        odd = [f"{n} {list(getattr(a, 'shape', ()))}" for n, a in arrays.items() if tuple(a.shape) != first[n]]
        if odd:
            return {"status": "INCORRECT_SHAPE", "message": f"a later call returned other shapes ({', '.join(odd)}) "
                    "than the first", "details": [], "figures": figures, "warnings": [], "path": "problem"}
        ok, message = run_check(checker, data_of(which), output_of(torch, names, arrays, device, dtypes))
        figures["calls"] += 1
        if not ok:
            what = {"cand1": "the first call", "cand2": "a second call on the same inputs",
                    "candB": "a call on new values in the same buffers",
                    "candC": "a call on new values in new buffers"}.get(tag, tag)
            return {"status": "INCORRECT_NUMERICAL", "message": f"the problem's check_implementation rejected the "
                    f"output of {what} (input set {which})", "details": [f"check_implementation: {message[:1500]}"],
                    "figures": figures, "warnings": [], "path": "problem"}
    return {"status": "PASSED", "message": "", "details": [], "figures": figures, "warnings": [], "path": "problem"}
