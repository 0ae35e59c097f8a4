"""KernelBench problems by KernelBench's own procedure (``eval_kernel_against_ref`` and ``run_and_check_correctness``
in its ``src/kernelbench/eval.py``), as a kopt reference: ``torch.manual_seed(seed)`` before ``get_init_inputs()``,
before ``Model(...)`` and before ``ModelNew(...)``, both built under ``torch.no_grad()`` with the same init inputs;
``torch.manual_seed(seed)`` before ``get_inputs()``; floating inputs and both models cast to the precision; the
outputs compared at KernelBench's tolerance for that precision.

Where kopt differs, and why: ``ModelNew`` is also given ``Model``'s state where a name and shape match (the same
values when both draw their weights in the same order, as KernelBench assumes; a ``ModelNew`` that draws them in
another order would otherwise fail on a seed); integer tensors keep their dtype under a precision cast (KernelBench
casts every tensor, which turns class labels into floats); sizes are module globals that dims of the same name set,
and globals computed from them are computed again.
"""

from __future__ import annotations

import ast
import os
from typing import Any

from . import HarnessError
from .gpuonly import gpu_only
from .inputs import made_shapes

#: KernelBench's tolerance per precision, used as both atol and rtol (``get_tolerance_for_precision`` in its eval,
#: which takes them from torchbench: 1e-4 for fp32; 1e-3 for fp16/bf16 there, loosened to 1e-2 in KernelBench).
#: KernelBench v0 and v0.1 used 1e-2 for every precision.
TOLERANCE = {"fp32": 1e-4, "fp16": 1e-2, "bf16": 1e-2}
#: torch's dtype of each of KernelBench's precision names.
DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def _is_size(value: Any) -> bool:
    """A value a dim can set: a number, a bool, a string, or a tuple/list of numbers."""
    if isinstance(value, (bool, int, float, str)):
        return True
    return isinstance(value, (tuple, list)) and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                    for v in value)


def _bound(node: ast.stmt) -> set[str]:
    """Names a module-level assignment binds."""
    targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
    return {n.id for t in targets if t is not None for n in ast.walk(t) if isinstance(n, ast.Name)}


def _assignments(source: bytes | str) -> list[ast.stmt]:
    tree = ast.parse(source)
    return [n for n in tree.body if isinstance(n, (ast.Assign, ast.AugAssign))
            or (isinstance(n, ast.AnnAssign) and n.value is not None)]


def derived(source: bytes | str, given: set[str]) -> list[ast.stmt]:
    """The module-level assignments of ``source`` whose value reads a name in ``given`` or one computed from it
    (``hidden = in_features * 4`` when ``in_features`` is given), in source order; those that only bind names in
    ``given`` are left out (the dim is their value)."""
    dirty, out = set(given), []
    for node in _assignments(source):
        bound = _bound(node)
        value = node.value if not isinstance(node, ast.AugAssign) else node
        reads = {n.id for n in ast.walk(value) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        if isinstance(node, ast.AugAssign):
            reads |= bound
        if reads & dirty and not bound <= given:
            out.append(node)
            dirty |= bound - given
    return out


def set_sizes(module: Any, dims: dict[str, Any], path: str) -> dict[str, Any]:
    """Set a KernelBench problem's sizes, which are module globals that ``get_inputs``/``get_init_inputs`` read:
    every global a module-level assignment bound is first restored to its value at import (a warm process serves
    requests at other dims), then each dim named like a global replaces it (a tuple size, ``input_shape = (3, 224,
    224)``, from a list: ``input_shape=3x64x64``), then the globals computed from those (``hidden = in_features * 4``)
    are computed again. Returns the dims it set. Raises HarnessError('contract') when a dim's kind is not the
    global's (a number for a tuple) or recomputing a derived global raises."""
    space = module.__dict__
    source = space.get("__kopt_source__")
    pristine = space.get("__kopt_pristine__")
    if pristine is None:  # the first request in this process, before any dim was set: the values at import
        names = set().union(*(_bound(n) for n in _assignments(source))) if source else set()
        pristine = space["__kopt_pristine__"] = {k: space[k] for k in names if k in space}
    space.update(pristine)
    given: dict[str, Any] = {}
    for name, value in dims.items():
        if name not in pristine or callable(pristine[name]) or not _is_size(pristine[name]):
            continue
        old = pristine[name]
        if isinstance(old, (tuple, list)) != isinstance(value, (tuple, list)):
            shown = "x".join(map(str, old)) if isinstance(old, (tuple, list)) else str(old)
            raise HarnessError("contract", f"{path}: {name} is {old!r} in the problem, but the dims give {value!r}",
                               fix=f"give {name} in the problem's form, e.g. --kopt-dims {name}={shown}")
        given[name] = type(old)(value) if isinstance(old, (tuple, list)) else value
    space.update(given)
    for node in derived(source, set(given)) if source and given else []:
        try:
            exec(compile(ast.Module(body=[node], type_ignores=[]), path, "exec"), space)
        except Exception as exc:
            raise HarnessError("contract", f"{path}:{node.lineno}: {', '.join(sorted(_bound(node)))}, computed from "
                               f"{', '.join(sorted(given))}, raised {type(exc).__name__}: {exc}") from exc
        space.update(given)
    return given


class KernelBenchReference:
    """A KernelBench problem module as a kopt reference (the module docstring says how). ``weight_seed``: the
    request's seed (the validation seed of set A), which both models' weights are drawn from in every process;
    ``precision``: ``fp32`` (default), ``fp16`` or ``bf16``, KernelBench's ``precision`` argument."""

    format = "kernelbench"
    #: kopt's value regimes apply at the shapes and dtypes ``get_inputs`` makes (:meth:`Inputs.fill`)
    draws_regimes = True

    def __init__(self, module: Any, path: str, weight_seed: int, precision: str | None = None) -> None:
        self.module, self.path = module, path
        self.weight_seed = int(weight_seed)
        self.precision = precision or "fp32"
        if self.precision not in TOLERANCE:
            raise HarnessError("contract", f"precision {self.precision!r} is not one of KernelBench's",
                               fix=f"give --kopt-precision {', '.join(TOLERANCE)}")
        self.atol = self.rtol = TOLERANCE[self.precision]
        self.tolerance_source = f"KernelBench's {self.precision} tolerance"
        self._model: Any = None

    def _cast(self, value: Any) -> Any:
        import torch

        if isinstance(value, torch.Tensor) and value.dtype.is_floating_point:
            return value.to(getattr(torch, DTYPES[self.precision]))
        return value

    def sizes(self, dims: dict[str, Any]) -> None:
        """Dims named like the problem's module globals set them (:func:`set_sizes`)."""
        set_sizes(self.module, dims, self.path)

    def init_inputs(self) -> list[Any]:
        """``get_init_inputs()`` under ``torch.manual_seed(weight_seed)``, floating tensors cast to the precision."""
        import torch

        torch.manual_seed(self.weight_seed)
        try:
            init = list(getattr(self.module, "get_init_inputs", lambda: [])())
        except Exception as exc:
            raise gpu_only(exc, f"{self.path}: get_init_inputs()", f"{os.path.basename(self.path)}: get_init_inputs()") \
                from exc
        return [self._cast(v) for v in init]

    def build(self, cls: Any, what: str) -> Any:
        """``cls(*init_inputs())`` under ``torch.manual_seed(weight_seed)`` and ``torch.no_grad()``, on the CPU;
        ``what`` names it in errors (``problem.py: Model``)."""
        import torch

        init = self.init_inputs()
        torch.manual_seed(self.weight_seed)
        try:
            with torch.no_grad():
                return cls(*init)
        except Exception as exc:
            raise gpu_only(exc, f"{what}(*get_init_inputs())") from exc

    def model(self, device: Any) -> Any:
        """``Model``, built once per request (:meth:`build`), in the precision, on ``device``."""
        import torch

        if self._model is None:
            self._model = self.build(self.module.Model, f"{self.path}: Model")
        return self._model.to(device=device, dtype=getattr(torch, DTYPES[self.precision]))

    def model_new(self, cls: Any, path: str, device: Any) -> tuple[Any, str]:
        """``ModelNew`` built as ``Model`` is (:meth:`build`), given ``Model``'s state where a name and shape match,
        in the precision, on ``device``; and a note naming the state it was not given (built from the seed, as
        KernelBench builds all of it), '' when it was given all."""
        import torch

        state = self.model("cpu").state_dict()
        new = self.build(cls, f"{path}: ModelNew")
        mine = new.state_dict()
        same = {k: v for k, v in state.items() if k in mine and mine[k].shape == v.shape}
        new.load_state_dict(same, strict=False)
        own = [f"{k} {list(v.shape)}" + (f" (Model's is {list(state[k].shape)})" if k in state else "")
               for k, v in mine.items() if k not in same]
        note = ""
        if own or len(same) < len(state):
            note = (f"ModelNew was built from the same seed as Model, as KernelBench builds it; "
                    f"{len(same)} of its {len(mine)} parameters and buffers were copied from Model by name"
                    + (f"; its own: {', '.join(own[:6])}{' ...' if len(own) > 6 else ''}" if own else "")
                    + (f"; Model's not in it: {', '.join(k for k in state if k not in same)[:300]}"
                       if len(same) < len(state) else ""))
        return new.to(device=device, dtype=getattr(torch, DTYPES[self.precision])), note

    def make_inputs(self, seed: int, **dims: Any) -> dict[str, Any]:
        """``get_inputs()`` under ``torch.manual_seed(seed)``, floating tensors cast to the precision, named
        ``in0``, ``in1``..."""
        import torch

        self.sizes(dims)
        torch.manual_seed(int(seed))
        try:
            values = list(self.module.get_inputs())
        except Exception as exc:
            raise gpu_only(exc, f"{self.path}: get_inputs()", f"{os.path.basename(self.path)}: get_inputs()") from exc
        return {f"in{i}": self._cast(v) for i, v in enumerate(values)}

    def shapes(self, **dims: Any) -> dict[str, tuple[list[int], str]]:
        """The buffers the problem's generator makes at ``dims``, as (shape, dtype): what a candidate's reported
        buffers are held to (:func:`~pytest_kopt.child.inputs.made_shapes`)."""
        return made_shapes(self.make_inputs(seed=0, **dims))

    def reference(self, **kw: Any) -> Any:
        """``Model(*inputs)`` under ``torch.no_grad()`` (KernelBench's correctness runs without autograd)."""
        import torch

        self.sizes({k: v for k, v in kw.items() if not is_positional(k)})
        args = positional(kw)
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), "cpu")
        with torch.no_grad():
            return self.model(device)(*args)


def is_positional(name: str) -> bool:
    """True for ``in0``, ``in1``...: a KernelBench input by position."""
    return name[:2] == "in" and name[2:].isdigit()


def positional(kw: dict[str, Any]) -> list[Any]:
    """The ``inN`` values of a call's keyword arguments, in order."""
    return [v for _, v in sorted((int(k[2:]), v) for k, v in kw.items() if is_positional(k))]
