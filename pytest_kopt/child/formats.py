"""Problems in the field's formats, run without glue: each is adapted, in the harness process, to kopt's contract
(a reference with ``reference(**buffers)`` and ``make_inputs(seed, **dims)``; a candidate with ``setup()`` and
``run_kernel(**buffers)``), so every guard applies unchanged: harness-owned buffers, poisoned outputs, fresh inputs
for set B, the reference in another process.

- **KernelBench**: the problem defines ``class Model(nn.Module)``, ``get_inputs()`` and (optionally)
  ``get_init_inputs()``; the candidate defines ``class ModelNew``. The inputs are ``get_inputs()`` under
  ``torch.manual_seed(seed)``, named ``in0``, ``in1``...; both models are built from ``get_init_inputs()`` under
  ``torch.manual_seed(seed)``, and ``ModelNew`` is given ``Model``'s parameters and buffers (a ``ModelNew`` whose
  parameters differ in name or shape is a contract error). ``forward`` returns the outputs.
- **GPU MODE**: the problem (``reference.py``) defines ``generate_input(**test_args, seed)`` and ``ref_kernel(data)``
  (and ``task.yml`` lists the test and benchmark shapes); the candidate defines ``custom_kernel(data)``. ``data``
  is taken apart into named buffers (``data`` for one tensor, ``t0``, ``t1``... for a tuple or list, ``d_<key>``
  for a dict), rebuilt for each call, and the outputs are returned.
"""

from __future__ import annotations

from typing import Any

from . import HarnessError
from .loader import load_module

#: Substrings of the errors torch raises when code asks for CUDA where there is none.
NO_CUDA = ("Found no NVIDIA driver", "Torch not compiled with CUDA", "No CUDA GPUs are available",
           "CUDA driver initialization failed", "no kernel image", "cudaGetDeviceCount")


def problem_format(module: Any) -> str:
    """``kernelbench``, ``gpumode`` or ``kopt`` for a loaded reference module."""
    if callable(getattr(module, "reference", None)):
        return "kopt"
    if isinstance(getattr(module, "Model", None), type) and callable(getattr(module, "get_inputs", None)):
        return "kernelbench"
    if callable(getattr(module, "ref_kernel", None)) and callable(getattr(module, "generate_input", None)):
        return "gpumode"
    return "kopt"


def _gpu_only(exc: BaseException, what: str) -> HarnessError:
    """A format's code that needs CUDA on a machine without it: one clear 'needs_gpu' error, else a contract
    error naming ``what``."""
    import torch

    text = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    if not torch.cuda.is_available() and (any(s in text for s in NO_CUDA) or "cuda" in text.lower()):
        return HarnessError("needs_gpu", f"{what} asks for CUDA (device=\"cuda\" in the problem's code), and this "
                            f"machine has no GPU: {text[:200]}")
    return HarnessError("contract", f"{what} raised {text[:500]}")


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


def join(kw: dict[str, Any]) -> Any:
    """The inverse of :func:`split` over a call's keyword arguments (dims and other names are ignored)."""
    if "data" in kw:
        return kw["data"]
    tree: dict[str, Any] = {}
    for key, value in kw.items():
        parts = key.split(".")
        if not all(p[:1] == "t" and p[1:].isdigit() or p.startswith("d_") for p in parts):
            continue
        node = tree
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value

    def build(node: dict[str, Any]) -> Any:
        items = {k: build(v) if isinstance(v, dict) and v and all(
            c[:1] == "t" and c[1:].isdigit() or c.startswith("d_") for c in v) else v for k, v in node.items()}
        if items and all(k[:1] == "t" and k[1:].isdigit() for k in items):
            return tuple(v for _, v in sorted((int(k[1:]), v) for k, v in items.items()))
        return {k[2:]: v for k, v in items.items()}

    return build(tree)


def _positional(kw: dict[str, Any]) -> list[Any]:
    return [v for _, v in sorted((int(k[2:]), v) for k, v in kw.items() if k[:2] == "in" and k[2:].isdigit())]


class KernelBenchReference:
    """A KernelBench problem module as a kopt reference."""

    def __init__(self, module: Any, path: str, weight_seed: int) -> None:
        self.module, self.path = module, path
        self._model: dict[int, Any] = {}
        #: the request's seed (the validation seed of set A), which the weights are drawn from in every process
        self.weight_seed = int(weight_seed)

    def sizes(self, dims: dict[str, Any]) -> None:
        """Dims named like the problem's module globals (``batch_size=64``) replace them: KernelBench writes its sizes
        as globals, which ``get_inputs``/``get_init_inputs`` read."""
        for k, v in dims.items():
            if hasattr(self.module, k) and not callable(getattr(self.module, k)):
                setattr(self.module, k, v)

    def model(self, seed: int, device: Any) -> Any:
        """``Model(*get_init_inputs())`` built under ``torch.manual_seed(seed)`` (once per seed in this process)."""
        import torch

        if seed not in self._model:
            init = list(getattr(self.module, "get_init_inputs", lambda: [])())
            torch.manual_seed(seed)
            try:
                self._model[seed] = self.module.Model(*init)
            except Exception as exc:
                raise HarnessError("contract", f"{self.path}: Model(*get_init_inputs()) raised "
                                   f"{type(exc).__name__}: {exc}") from exc
        return self._model[seed].to(device)

    def make_inputs(self, seed: int, **dims: Any) -> dict[str, Any]:
        """``get_inputs()`` under ``torch.manual_seed(seed)``, named ``in0``, ``in1``..."""
        import torch

        self.sizes(dims)
        torch.manual_seed(int(seed))
        try:
            values = list(self.module.get_inputs())
        except Exception as exc:
            raise _gpu_only(exc, f"{self.path}: get_inputs()") from exc
        return {f"in{i}": v for i, v in enumerate(values)}

    def reference(self, **kw: Any) -> Any:
        self.sizes({k: v for k, v in kw.items() if not (k[:2] == "in" and k[2:].isdigit())})
        import torch

        args = _positional(kw)
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), "cpu")
        return self.model(self.weight_seed, device)(*args)


class GpuModeReference:
    """A GPU MODE problem module as a kopt reference."""

    def __init__(self, module: Any, path: str) -> None:
        self.module, self.path = module, path

    def make_inputs(self, seed: int, **dims: Any) -> dict[str, Any]:
        """``generate_input(**dims, seed=seed)`` taken apart (:func:`split`)."""
        import torch

        try:
            data = self.module.generate_input(**dims, seed=int(seed))
        except HarnessError:
            raise
        except Exception as exc:
            raise _gpu_only(exc, f"{self.path}: generate_input({', '.join(f'{k}={v!r}' for k, v in dims.items())}, "
                                 f"seed={seed})") from exc
        return split(data, torch)

    def reference(self, **kw: Any) -> Any:
        return self.module.ref_kernel(join(kw))


class SetupFromInputs:
    """A candidate in a field format: ``setup()`` from the reference's ``make_inputs`` (the buffers and values the
    problem generates), ``run_kernel`` calling the candidate's ``ModelNew`` or ``custom_kernel``."""

    def __init__(self, module: Any, ref: Any, fmt: str, path: str) -> None:
        self.module, self.ref, self.fmt, self.path = module, ref, fmt, path
        self._new: Any = None

    def setup(self, seed: int, device: str = "cuda", **dims: Any) -> dict[str, Any]:
        import torch

        made = self.ref.make_inputs(seed=seed, **dims)
        inputs = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in made.items()}
        if self.fmt == "kernelbench" and str(device) != "meta":  # the plan needs the buffers only, not the model
            self._new = self._model_new(int(seed), device)
        return {"inputs": inputs}

    def _model_new(self, seed: int, device: str) -> Any:
        import torch

        init = list(getattr(self.ref.module, "get_init_inputs", lambda: [])())
        state = self.ref.model(self.ref.weight_seed, "cpu").state_dict()
        torch.manual_seed(self.ref.weight_seed)
        try:
            new = self.module.ModelNew(*init)
        except Exception as exc:
            raise _gpu_only(exc, f"{self.path}: ModelNew(*get_init_inputs())") from exc
        mine = new.state_dict()
        missing = [k for k in state if k not in mine]
        extra = [k for k in mine if k not in state]
        shapes = [f"{k} {list(mine[k].shape)} vs {list(v.shape)}" for k, v in state.items()
                  if k in mine and mine[k].shape != v.shape]
        if missing or extra or shapes:
            raise HarnessError("contract", f"{self.path}: ModelNew's parameters differ from Model's"
                               + (f"; missing: {', '.join(missing)}" if missing else "")
                               + (f"; not in Model: {', '.join(extra)}" if extra else "")
                               + (f"; shapes: {', '.join(shapes)}" if shapes else ""),
                               fix="give ModelNew the parameters and buffers of Model, by the same names and shapes: "
                                   "both are loaded with the same weights")
        new.load_state_dict(state)
        return new.to(device)

    def run_kernel(self, **kw: Any) -> Any:
        if self.fmt == "kernelbench":
            return self._new(*_positional(kw))
        return self.module.custom_kernel(join(kw))


def adapt_reference(module: Any, path: str, seed: int = 0) -> Any:
    """The reference module itself (kopt's format), or its adapter (KernelBench, GPU MODE); ``seed`` (the request's
    validation seed) draws a KernelBench model's weights, the same in every process of the request."""
    fmt = problem_format(module)
    if fmt == "kernelbench":
        return KernelBenchReference(module, path, seed)
    if fmt == "gpumode":
        return GpuModeReference(module, path)
    return module


def load_reference(path: str, seed: Any = 0, sha: str | None = None) -> Any:
    """Import ``ref.py`` (:func:`~pytest_kopt.child.loader.load_module`; ``sha``: the content the session pinned,
    anything else refused) and adapt a field format (``seed``: see :func:`adapt_reference`)."""
    return adapt_reference(load_module(path, "kopt_reference", sha), path, int(seed or 0))


def load_candidate(path: str, ref: Any) -> Any:
    """Import the candidate; one with ``ModelNew`` (KernelBench) or ``custom_kernel`` (GPU MODE) and no
    ``setup``/``run_kernel`` is adapted against the (adapted) reference ``ref``. Raises HarnessError('contract')
    when a field-format candidate meets a reference of another format."""
    module = load_module(path, "kopt_candidate")
    if callable(getattr(module, "run_kernel", None)):
        return module
    fmt = ("kernelbench" if isinstance(getattr(module, "ModelNew", None), type)
           else "gpumode" if callable(getattr(module, "custom_kernel", None)) else None)
    if fmt is None:
        return module
    want = KernelBenchReference if fmt == "kernelbench" else GpuModeReference
    if not isinstance(ref, want):
        raise HarnessError("contract", f"{path} is a {'KernelBench ModelNew' if fmt == 'kernelbench' else 'GPU MODE custom_kernel'} "
                           f"candidate, but the reference is not a problem of that format",
                           fix="give the problem file as --kopt-ref (KernelBench: Model, get_inputs; GPU MODE: "
                               "reference.py with generate_input and ref_kernel)")
    return SetupFromInputs(module, ref, fmt, path)
