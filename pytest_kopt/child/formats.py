"""Problems in the field's formats, run without glue: each is adapted, in the harness process, to kopt's contract
(a reference with ``reference(**buffers)`` and ``make_inputs(seed, **dims)``; a candidate with ``setup()`` and
``run_kernel(**buffers)``), so every guard applies unchanged: harness-owned buffers, poisoned outputs, fresh inputs
for set B, the reference in another process.

- **KernelBench** (:mod:`pytest_kopt.child.kernelbench`): the problem defines ``class Model(nn.Module)``,
  ``get_inputs()`` and (optionally) ``get_init_inputs()``; the candidate defines ``class ModelNew``. Both models are
  built as KernelBench builds them (the same seed, the same init inputs); ``ModelNew`` is also given ``Model``'s
  state where a name and shape match. The inputs are ``get_inputs()`` under ``torch.manual_seed(seed)``, named
  ``in0``, ``in1``...; ``forward`` returns the outputs.
- **GPU MODE** (:mod:`pytest_kopt.child.gpumode`): the problem (``reference.py``) defines
  ``generate_input(**test_args, seed)`` and ``ref_kernel(data)`` (and ``task.yml`` lists the test and benchmark
  shapes and the files the problem imports); the candidate defines ``custom_kernel(data)``. ``data`` is taken apart
  into named buffers (``data`` for one tensor, ``t0``, ``t1``... for a tuple or list, ``d_<key>`` for a dict),
  rebuilt for each call, and the outputs are returned.

Value regimes: the problem's own generator is the ``problem`` regime; for kopt's (``normal``, ``uniform``,
``small_int``) the float tensors it makes are redrawn at the same shapes and dtypes
(:meth:`pytest_kopt.child.inputs.Inputs.fill`), where the adapter's ``draws_regimes`` allows it.
"""

from __future__ import annotations

from typing import Any

from . import HarnessError
from .gpumode import GpuModeReference, install_task_files, join
from .kernelbench import KernelBenchReference, positional
from .loader import load_module


def problem_format(module: Any) -> str:
    """``kernelbench``, ``gpumode`` or ``kopt`` for a loaded reference module."""
    if callable(getattr(module, "reference", None)):
        return "kopt"
    if isinstance(getattr(module, "Model", None), type) and callable(getattr(module, "get_inputs", None)):
        return "kernelbench"
    if callable(getattr(module, "ref_kernel", None)) and callable(getattr(module, "generate_input", None)):
        return "gpumode"
    return "kopt"


def regime_used(ref: Any, spec: list[dict[str, Any]], plan: dict[str, Any]) -> str:
    """The value regime a case's inputs were really drawn in: a field problem's own generator (``problem``) where
    the plan says so or its adapter keeps its values (``draws_regimes`` False); for kopt's format, ``make_inputs``
    when the reference's ``make_inputs`` made every floating-point input; else the plan's regime."""
    regime = str(plan.get("regime"))
    if getattr(ref, "format", "kopt") != "kopt":
        return regime if regime != "problem" and getattr(ref, "draws_regimes", False) else "problem"
    floats = [s for s in spec if s["role"] in ("input", "inout") and s["dtype"].startswith(("float", "bfloat"))]
    if floats and all(s.get("source") == "make_inputs" for s in floats):
        return "make_inputs"
    return regime


class SetupFromInputs:
    """A candidate in a field format: ``setup()`` from the reference's ``make_inputs`` (the buffers and values the
    problem generates), ``run_kernel`` calling the candidate's ``ModelNew`` or ``custom_kernel``. ``note``: what
    the candidate's reports should say beside a failure (the state a ``ModelNew`` was not given)."""

    def __init__(self, module: Any, ref: Any, fmt: str, path: str) -> None:
        self.module, self.ref, self.fmt, self.path = module, ref, fmt, path
        self._new: Any = None
        self.note = ""

    def setup(self, seed: int, device: str = "cuda", **dims: Any) -> dict[str, Any]:
        import torch

        made = self.ref.make_inputs(seed=seed, **dims)
        inputs = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in made.items()}
        if self.fmt == "kernelbench" and str(device) != "meta":  # the plan needs the buffers only, not the model
            self._new, self.note = self.ref.model_new(self.module.ModelNew, self.path, device)
        return {"inputs": inputs}

    def run_kernel(self, **kw: Any) -> Any:
        if self.fmt == "kernelbench":
            import torch

            with torch.no_grad():  # as KernelBench runs ModelNew
                return self._new(*positional(kw))
        return self.module.custom_kernel(join(kw))


def adapt_reference(module: Any, path: str, seed: int = 0, precision: str | None = None) -> Any:
    """The reference module itself (kopt's format), or its adapter (KernelBench, GPU MODE); ``seed`` (the request's
    validation seed) draws a KernelBench model's weights, the same in every process of the request; ``precision``:
    KernelBench's (``fp32``, ``fp16``, ``bf16``; None: fp32)."""
    fmt = problem_format(module)
    if fmt == "kernelbench":
        return KernelBenchReference(module, path, seed, precision)
    if fmt == "gpumode":
        return GpuModeReference(module, path)
    return module


def load_reference(path: str, seed: Any = 0, sha: str | None = None, precision: str | None = None) -> Any:
    """Import ``ref.py`` (:func:`~pytest_kopt.child.loader.load_module`; ``sha``: the content the session pinned,
    anything else refused), the files a GPU MODE ``task.yml`` beside it lists made importable first, and adapt a
    field format (``seed``, ``precision``: see :func:`adapt_reference`)."""
    install_task_files(path)
    return adapt_reference(load_module(path, "kopt_reference", sha), path, int(seed or 0), precision)


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
