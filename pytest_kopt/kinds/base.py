"""The protocol every kernel kind follows (:class:`Kind`), with the defaults of a kind that is compiled by nothing
and launched as a Python module, and the ordered set of a session's kinds (:class:`KindSet`).

A kind answers what differs between kernel files: which files it claims, what the preflight checks and reports,
how it is built and what the build's identity covers, which harness launcher calls it, the environment of its
harness processes, which gates it runs without a GPU or not at all, and where its SASS comes from. A new kind
subclasses :class:`Kind` (or a built-in one) and overrides what differs; the pytest-xdist scheduler protocol is the
model (a new scheduling mode overrides one method).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # type hints only: the gates hand these objects to a kind; a kind never imports the plugin
    from ..gates.build import BuildResult
    from ..gates.context import Context


class Kind:
    """One kind of kernel file. Class attributes are the kind's facts; methods take the gate context
    (:class:`~pytest_kopt.gates.context.Context`) of one kernel.

    ``name``: the label in requests, reports and ``plan.json`` (``cuda``, ``cutlass``, ``triton``, ``python``).
    ``suffixes``: the file suffixes it may claim (a file whose suffix no kind lists is no kernel).
    ``cpu_gates``: the GPU gates (``Gate.serial``) it runs on the CPU when there is no GPU (Triton's interpreter,
    plain torch): those items carry no ``gpu`` marker. ``not_applicable``: gate name -> the reason the gate does
    not apply to this kind (the item is a NOT_APPLICABLE skip). ``launcher``: how the harness process calls it:
    ``solve`` (a built shared library's ``extern "C" solve`` through ctypes) or ``module`` (a Python file's
    ``setup``/``run_kernel``, or a KernelBench/GPU MODE candidate). ``graph_capture``: whether its launches can be
    captured on torch's capture stream (a ``.cu``'s ``solve`` launches on the legacy default stream, so timing's
    graph mode queues it behind a hold instead). ``plans_candidate``: whether the plan gate asks the candidate's
    own ``setup()`` for its buffers (on torch's meta device); otherwise the reference's ``shapes()`` and the
    preflight's parameters give them. ``builds_ahead``: its build runs in the pytest process (nvcc) and may start
    in a thread ahead of its compile item, as soon as the arch is known (a Triton build runs in the kernel's own
    harness process, with its compile item)."""

    name = "kind"
    suffixes: tuple[str, ...] = ()
    cpu_gates: frozenset[str] = frozenset()
    not_applicable: Mapping[str, str] = MappingProxyType({})
    launcher = "module"
    graph_capture = True
    plans_candidate = True
    builds_ahead = False

    def detect(self, path: Path) -> bool:
        """True when this kind claims ``path`` (a file with one of :attr:`suffixes`). Kinds are asked in order and
        the first that claims a file gets it; the default claims every file of its suffixes."""
        return path.suffix in self.suffixes

    def sources(self, path: Path) -> list[Path]:
        """The files besides ``path`` that a kernel of this kind is built or imported from, pinned with it at the
        session's start (:mod:`pytest_kopt.gates.pins`): by default the ``.py`` files beside it."""
        from ..gates.pins import neighbours

        return neighbours(path)

    def check_tools(self, ctx: Context) -> None:
        """The hardware gate's question to the kind: raise :class:`~pytest_kopt.errors.HardwareError` naming the
        tool or package this kind cannot be built without, when the environment (``ctx.env``) lacks it."""

    def preflight(self, ctx: Context) -> list[Any]:
        """The kernel file's static contract (nothing run): raise ContractError naming the file, the line and the
        fix. Returns ``solve``'s parameters (:class:`~pytest_kopt.gates.contract.Param`) for a kind that has
        them, else []. The reference's own contract is checked before this, by the preflight gate."""
        return []

    def source_contract(self, ctx: Context) -> Any:
        """What the kernel file defines, as the preflight reads it (:class:`~pytest_kopt.gates.pycontract.PyContract`
        of a Python file, whose functions may name dims), None for a kind whose source is no Python."""
        return None

    def runtime_dims(self, ctx: Context) -> frozenset[str] | None:
        """The dims the kernel takes at run time (an edge shape, :mod:`pytest_kopt.gates.edges`, changes only
        those), None for every dim; by default none: a kind that does not say is checked at the given dims only."""
        return frozenset()

    def describe(self, ctx: Context, params: list[Any], note: str) -> tuple[dict[str, Any], str]:
        """The preflight item's figures and one-line summary (``note`` is the gate's own remark, appended)."""
        return {"kind": self.name}, f"{self.name}: contract found{note}"

    def build(self, ctx: Context, root: Path) -> BuildResult:
        """Build (or reuse from the content-addressed cache under ``root``) the kernel for ``ctx.arch``. Raises
        CompileError (with file:line), HardwareError (a tool missing) or the harness's error."""
        raise NotImplementedError(f"the {self.name} kind has no build")

    def build_inputs(self, ctx: Context) -> tuple[Any, ...]:
        """What a build's outcome depends on besides the kernel file itself, the ``.py`` files beside it, the arch
        and the tools' versions (:func:`pytest_kopt.gates.build.build_mark`): e.g. the local headers it includes."""
        return ()

    def compile_env(self, ctx: Context) -> dict[str, str]:
        """The environment of the kernel's build and plan requests (a Triton file's ``TRITON_CACHE_DIR``)."""
        return {}

    def candidate_env(self, ctx: Context, device: str) -> dict[str, str]:
        """The environment of the kernel's correctness, timing and profile requests on ``device`` (``cuda`` or
        ``cpu``): :meth:`compile_env` by default."""
        return self.compile_env(ctx)

    def request_fields(self, ctx: Context) -> dict[str, Any]:
        """What a harness request carries for this kind besides the common fields: ``kind`` (the name, for
        messages) and ``launcher``; a kind adds its own (Triton: ``autotune``)."""
        return {"kind": self.name, "launcher": self.launcher}

    def prestart_check(self, ctx: Context) -> bool:
        """True when the kernel's correctness process (``check``) should be started at its first item on a GPU
        (a Triton file's starts with its plan request instead)."""
        return False

    def sass_sources(self, ctx: Context) -> list[Path]:
        """The source files whose preprocessor arch guards an EMPTY_KERNEL failure lists."""
        return [ctx.kernel]

    def sass_artifacts(self, res: BuildResult) -> list[str]:
        """The build's files ``cuobjdump --dump-sass`` reads: the cubins, or the shared library."""
        return list(res.cubins) if res.cubins else [res.artifact]

    def own_functions(self, ctx: Context, names: list[str]) -> list[str] | None:
        """Of the SASS functions ``names`` of the build, those the kernel's own source defines (the sass gate's
        "does no work" rule applies to them only, not to a library's kernels compiled in from included headers);
        None: all of them."""
        return None

    def no_sass(self, ctx: Context, artifacts: list[str]) -> Exception:
        """The error (NotApplicable or HardwareError) for a build whose dump holds no kernel function."""
        from ..errors import HardwareError

        return HardwareError(f"cuobjdump printed no SASS function for {', '.join(artifacts)}", gate="sass",
                             fix="check that the build produced cubins for this arch")

    def cpu_runner(self, device: str) -> str | None:
        """How the kernel runs where ``device`` is ``cpu`` (``interpreter (TRITON_INTERPRET=1)``), for the
        correctness summary; None where it runs as itself."""
        return None

    def unsound_dtypes(self, device: str) -> frozenset[str]:
        """dtypes whose results on ``device`` say nothing about the kernel (Triton's interpreter miscomputes
        bfloat16): a case with one is blocked, never failed."""
        return frozenset()

    def timeout_hint(self, device: str) -> str | None:
        """What to try when a correctness request on ``device`` times out (the interpreter's slowness)."""
        return None

    def __repr__(self) -> str:
        return f"<kopt kind {self.name}>"


class KindSet:
    """The session's kinds in the order they are asked (a plugin's before kopt's own): :meth:`of` gives the kind of
    a kernel file. Raises ConfigError at construction when two kinds share a name."""

    def __init__(self, kinds: list[Kind]) -> None:
        from ..errors import ConfigError

        seen: dict[str, Kind] = {}
        for k in kinds:
            if k.name in seen and seen[k.name] is not k:
                raise ConfigError(f"two kernel kinds are named {k.name!r}: {seen[k.name]!r} and {k!r}",
                                  fix="give the plugin's kind another name")
            seen[k.name] = k
        self.kinds: tuple[Kind, ...] = tuple(dict.fromkeys(kinds))

    @property
    def suffixes(self) -> frozenset[str]:
        """Every suffix some kind may claim (``.cu``, ``.py``, ...)."""
        return frozenset(s for k in self.kinds for s in k.suffixes)

    def of(self, path: Path) -> Kind | None:
        """The first kind that claims ``path``, None when none does."""
        for k in self.kinds:
            if path.suffix in k.suffixes and k.detect(path):
                return k
        return None

    def by_name(self, name: str) -> Kind | None:
        """The kind named ``name``."""
        return next((k for k in self.kinds if k.name == name), None)
