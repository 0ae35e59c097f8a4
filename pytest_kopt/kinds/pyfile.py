"""What every kernel written as a Python file shares (Triton and pure Python, and the KernelBench and GPU MODE
candidates they may be): the contract read from the source, the problem formats it may follow, the preflight's
summary, and the module launcher of the harness."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import ContractError
from ..gates import pycontract
from .base import Kind

if TYPE_CHECKING:
    from ..gates.context import Context

#: How the reports name each problem format (a KernelBench or GPU MODE candidate is run as it is written).
FORMAT_NAMES = {"kopt": "kopt (setup/run_kernel, reference)", "kernelbench": "KernelBench (Model/ModelNew)",
                "gpumode": "GPU MODE (generate_input/ref_kernel/custom_kernel)"}


def entry_point_advice(ctx: Context, problem: str) -> None:
    """A candidate without the entry point of its problem's format (``custom_kernel(data)`` for GPU MODE, ``class
    ModelNew`` for KernelBench), told in that format's terms: what it defines instead, and which of its functions or
    classes to rename (kopt's ``setup``/``run_kernel`` do not run against a field problem, which makes the inputs
    itself). Raises ContractError (exit 4)."""
    k = pycontract.read_python(ctx.kernel)
    found = [f"{n}({', '.join(k.functions[n][0])})" for n in k.functions if not n.startswith("_")][:6]
    found += [f"class {n}" for n in k.classes][:6]
    defines = f"defines {', '.join(found)}" if found else "defines no function or class"
    if problem == "gpumode":
        one = [n for n, (params, _, _) in k.functions.items() if params == ["data"]]
        fix = (f"rename {one[0]}(data) to custom_kernel(data)" if one else
               "rename run_kernel to custom_kernel(data): it is given generate_input()'s data whole and returns "
               "the output" if "run_kernel" in k.functions else "define def custom_kernel(data): returns the output")
        raise ContractError(f"{ctx.display} {defines}, but no custom_kernel(data): a GPU MODE problem "
                            f"({ctx.ref.name}) calls custom_kernel with the data generate_input() made and checks what "
                            "it returns", gate="preflight", path=ctx.display, fix=fix)
    fix = ("rename class Model to ModelNew (KernelBench's name for the candidate; same __init__ and forward "
           "arguments)" if "Model" in k.classes else
           f"name your nn.Module class ModelNew (found {', '.join(k.classes[:3])})" if k.classes else
           "define class ModelNew(nn.Module) with Model's __init__ and forward arguments")
    raise ContractError(f"{ctx.display} {defines}, but no class ModelNew: a KernelBench problem ({ctx.ref.name}) "
                        "builds ModelNew(*get_init_inputs()) as it builds Model and calls it on get_inputs()",
                        gate="preflight", path=ctx.display, fix=fix)


class PyFileKind(Kind):
    """A kernel written as a Python file: ``setup``/``run_kernel`` (kopt's contract), or a KernelBench ``ModelNew``
    or GPU MODE ``custom_kernel`` beside a problem of the same format. ``requires_jit``: a ``@triton.jit`` kernel
    must be in it; ``what``: how the summary names the kernel."""

    suffixes = (".py",)
    launcher = "module"
    requires_jit = False
    what = "Python file"

    def preflight(self, ctx: Context) -> list[Any]:
        """The candidate's contract against the reference's format: its functions (``setup(**dims, seed)``,
        ``run_kernel``), or ``ModelNew``/``custom_kernel`` beside a problem of the same format; and, for kopt's
        contract with a literal ``setup()``, the reference's parameters named by the buffers or dims. Returns []."""
        c = pycontract.read_python(ctx.ref)
        if c.problem_format != "kopt" and pycontract.read_python(ctx.kernel).candidate_format == "kopt":
            entry_point_advice(ctx, c.problem_format)
        k = pycontract.check_triton(ctx.kernel, ctx.settings.dims, require_jit=self.requires_jit)
        fmt = FORMAT_NAMES[k.candidate_format]
        if k.candidate_format != "kopt" and k.candidate_format != c.problem_format:
            raise ContractError(f"{ctx.display} is a {fmt} candidate, but {ctx.ref.name} is a "
                                f"{FORMAT_NAMES[c.problem_format]} reference", gate="preflight", path=str(ctx.ref),
                                fix="give the problem of the candidate's format as --kopt-ref (KernelBench: class "
                                    "Model, get_inputs(); GPU MODE: generate_input(), ref_kernel())")
        if k.setup_literal is not None and c.problem_format == "kopt":
            given = set(k.setup_literal[0]) | set(ctx.settings.dims)
            unknown = [n for n in c.required.get("reference", []) if n not in given]
            if unknown:
                _, _, line = c.functions["reference"]
                raise ContractError(f"reference() takes {', '.join(unknown)}, which setup()'s inputs and --kopt-dims "
                                    f"do not provide (setup's buffers: {', '.join(k.setup_literal[0])})",
                                    gate="preflight", path=str(ctx.ref), line=line,
                                    fix="name reference()'s parameters after setup()'s inputs, or give them defaults")
        return []

    def runtime_dims(self, ctx: Context) -> frozenset[str] | None:
        """``setup()``'s parameters (it builds the buffers from them at run time), None when it takes
        ``**kwargs``; empty when the file does not parse or has no ``setup`` (a field format's candidate)."""
        try:
            found = pycontract.read_python(ctx.kernel).functions.get("setup")
        except ContractError:
            return frozenset()
        if found is None:
            return frozenset()
        params, kwargs, _line = found
        return None if kwargs else frozenset(params)

    def source_contract(self, ctx: Context) -> Any:
        """The file's :class:`~pytest_kopt.gates.pycontract.PyContract`."""
        return pycontract.read_python(ctx.kernel)

    def describe(self, ctx: Context, params: list[Any], note: str) -> tuple[dict[str, Any], str]:
        """``kind`` and ``format`` figures; the format run as it is, or the ``@triton.autotune`` and
        ``@triton.heuristics`` functions and how each is run."""
        k = pycontract.read_python(ctx.kernel)
        figures: dict[str, Any] = {"kind": self.name, "format": k.candidate_format}
        if k.candidate_format != "kopt":
            found = {"kernelbench": "ModelNew found; the problem's Model, get_inputs, get_init_inputs",
                     "gpumode": "custom_kernel found; the problem's generate_input, ref_kernel"}[k.candidate_format]
            return figures, (f"{FORMAT_NAMES[k.candidate_format]} format, run as is: {found} "
                             f"({self.what}){note}")
        for fn, decorators in sorted(k.tuned.items()):
            figures[f"tuned_{fn}"] = "+".join(decorators)
            if "autotune" in decorators:
                note += (f"; @triton.autotune {fn}: " + (
                    "tuned once by Triton in the compile gate, that config pinned for every later gate"
                    if ctx.gpu else "every config compiled ahead of time, correctness on each in turn (no GPU to "
                                    "tune on)"))
            else:
                note += f"; @triton.heuristics {fn}: its values computed at each launch, as Triton does"
        return figures, f"{self.name}: setup/run_kernel found ({self.what}); ref.reference found{note}"
