"""Work started at configure, before the GPU probe, where what it needs is known without it.

nvcc: where the arch is known (``--kopt-arch``, or every visible GPU's compute capability read through NVML), a
session starts its ``.cu`` builds there instead of at its first item, so they run beside the probe (0.47 s on the
H200), collection and the first items; under xdist the controller starts them, beside its workers' start and
collection (8 workers with every build cached: a 7.0 s session on the H200, against 4.1 s for the 8 builds at -n 0).
Only where the selection surely keeps the kernel's compile item: a build the session then skipped would still be
waited for at its end (nvcc must not outlive the session), and a CUTLASS build takes a minute.

The harness processes: in a session without xdist workers on a machine where NVML shows one GPU, the first
kernel's processes start there too, so their torch imports (3.6 s on the H200 with warm files, 6.6 s on a fresh
machine; 2026-12-03) overlap the probe and collection (1.6 s) rather than start after them. (Under xdist each
worker starts its first kernel's at its own configure: :func:`pytest_kopt.plugin.xdist.prestart_planned`.)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from ..gates import hardware
from .nodes import GPU_MARKER, node_path
from .stash import SessionState


#: pytest options under which no item runs (the help and listings, the setup plans)
_NO_ITEMS = ("help", "version", "markers", "showfixtures", "show_fixtures_per_test", "setupplan", "setuponly",
             "collectonly", "cacheshow")


def runs_no_items(config: pytest.Config) -> bool:
    """True under an option with which no item runs (``--help``, ``--collect-only``, ``--setup-plan``...)."""
    return any(getattr(config.option, name, False) for name in _NO_ITEMS)


def selection_keeps(config: pytest.Config, state: SessionState, kernel: Path, gate: str = "compile") -> bool:
    """True when ``kernel``'s item of ``gate`` (one without parameters: ``compile``, ``plan``) surely runs: no
    option under which no item runs (``--help``, ``--collect-only``, ``--setup-plan``...), no ``--lf``, ``--sw``,
    ``--deselect`` or node id (``k.cu::compile``), every path argument existing, the kernel inside the root folder,
    and ``-k``/``-m`` (if given) true for the item by pytest's own expression parser, over the names and markers
    pytest matches it by (its name, the folders and file name below the root, its markers: ``kopt``, and ``kopt_gpu``
    where the gate runs on the GPU for this kernel's kind, as :meth:`~pytest_kopt.gates.table.Gate.on_gpu`). False when
    unsure: an expression pytest cannot parse here, or one with call parameters. pytest has no public API that
    evaluates ``-k``/``-m`` before collection; its own parser is used, and its absence reads as unsure."""
    opt = config.option
    if (runs_no_items(config) or getattr(opt, "lf", False)
            or getattr(opt, "stepwise", False) or getattr(opt, "deselect", None)
            or any("::" in str(a) or not Path(config.invocation_params.dir, str(a)).exists() for a in config.args)):
        return False
    try:
        from _pytest.mark.expression import Expression

        names = {gate, "kopt", *kernel.resolve().relative_to(config.rootpath.resolve()).parts}
    except (ImportError, ValueError):  # pytest's parser moved, or a kernel outside the root (named by its path)
        return False
    row = state.gates.by_name.get(gate)
    kind = state.kinds.of(kernel)
    markers = {"kopt"} | ({GPU_MARKER} if row is not None and kind is not None and row.on_gpu(kind) else set())
    names |= markers  # -k matches an item's marker names too

    def keyword(sub: str, /, **kwargs: Any) -> bool:
        if kwargs:
            raise ValueError("call parameters")
        return any(sub.lower() in n.lower() for n in names)

    def marker(name: str, /, **kwargs: Any) -> bool:
        if kwargs:
            raise ValueError("call parameters")
        return name in markers

    try:
        for expr, matcher in ((getattr(opt, "keyword", "") or "", keyword), (getattr(opt, "markexpr", "") or "",
                                                                             marker)):
            if expr.strip() and not Expression.compile(expr.strip()).evaluate(matcher):
                return False
    except Exception:  # a syntax pytest reports itself later, or an API this pytest lacks: no early start
        return False
    return True


def xdist_specs(config: pytest.Config) -> list[tuple[int, Any]] | None:
    """The session's xdist workers as (how many, ``execnet.XSpec``) per ``--tx`` entry (``-n N`` is N ``popen``;
    ``--tx 3*popen``), or None where the session runs without xdist."""
    if getattr(config.option, "dist", "no") == "no" and not getattr(config.option, "numprocesses", None):
        return None
    import execnet  # pytest-xdist's own dependency: present wherever workers are

    specs = []
    for spec in getattr(config.option, "tx", None) or []:
        times, _, rest = str(spec).rpartition("*")
        specs.append((int(times) if times.isdigit() else 1, execnet.XSpec(rest)))
    return specs


def local_items(config: pytest.Config) -> bool:
    """True when this machine runs the session's items: no xdist, or every xdist worker a local process (``-n N``
    makes ``popen`` workers; ``--tx ssh=...`` or ``socket=...`` runs them elsewhere, with their own build cache)."""
    specs = xdist_specs(config)
    return specs is None or all(spec.popen for _, spec in specs)


def start_builds_early(config: pytest.Config, state: SessionState) -> dict[str, Any] | None:
    """Detect the tools (:func:`~pytest_kopt.gates.hardware.detect_tools`) and start the builds of the session's
    ``.cu`` kernels whose compile item surely runs (:func:`selection_keeps`), through
    :class:`~pytest_kopt.gates.build.BuildAhead` with contexts whose environment holds the tools, the package
    versions and the arch: the build, its remembered failure and its contract check are then the ones the compile
    item would have made. Only where the items run on this machine (no xdist, or xdist's workers are local
    processes: ``-n``, ``--tx popen``), the GPUs are not chosen by ``--kopt-gpus`` (whose errors come later, in
    configure), the session does not open a loop's run (``--kopt-init``) and the arch is known before the probe
    (``--kopt-arch``, else :func:`~pytest_kopt.gates.hardware.nvml_arch`). Under xdist this is the controller: its
    builds run while the workers start and collect, and a worker's compile item finds the build in the
    content-addressed cache (waiting on its lock while it runs). Returns the tools, for
    :func:`~pytest_kopt.gates.hardware.detect` to reuse, or None when it detected nothing."""
    s = state.settings
    if not local_items(config) or s.gpus or s.loop_mode == "init":
        return None  # --kopt-init: the run folder a build's remembered failure goes to is made after the probe
    kernels = [k for k in s.kernels if (kind := state.kinds.of(k)) is not None and kind.builds_ahead
               and selection_keeps(config, state, k)]
    if not kernels:
        return None
    tools = hardware.detect_tools()
    arch = (s.arch or hardware.nvml_arch()) if tools["nvcc"]["path"] else None
    if arch:
        env = {"tools": tools, "packages": hardware.package_versions(), "sm_arch": arch}
        state.ahead.start_builds([state.context(config, k, os.path.relpath(k, config.rootpath), env=env)
                                  for k in kernels])
    return tools


def prestart_harness_early(config: pytest.Config, state: SessionState) -> bool:
    """Start the harness processes of the session's first kernel (:func:`~pytest_kopt.gates.plan.prestart_harness`)
    at configure, before the GPU probe, with a provisional environment (a GPU, its arch from NVML or ``--kopt-arch``,
    the package versions). Only
    where that start is the one collection would make: no xdist workers (each starts its own), no ``--kopt-gpus``
    and NVML showing exactly one GPU (:func:`~pytest_kopt.gates.hardware.nvml_view`, one NVML session for the
    count and the arch), so the probe cannot pin
    another GPU into ``CUDA_VISIBLE_DEVICES`` after the processes inherited it, and the selection surely keeping the
    kernel's plan item (:func:`selection_keeps`; the timing processes only where it surely keeps timing too). The
    processes are keyed by kernel, reference and request environment, none of which the probe changes, so the
    collection's and the plan gate's starts find them running; a probe that then finds no usable GPU leaves them
    unused, and the session's end stops them. Returns whether it started them."""
    s = state.settings
    if xdist_specs(config) is not None or s.gpus or not s.kernels or s.ref is None:
        return False
    kernel = s.kernels[0]
    if not selection_keeps(config, state, kernel, "plan"):
        return False
    count, nvml_arch = hardware.nvml_view()
    if count != 1:
        return False
    # what the processes' keys read of the environment: a Triton kernel's build folder (its TRITON_CACHE_DIR) is
    # named by the arch and triton's version, which the probe's environment must then give the same
    arch = s.arch or nvml_arch
    if arch is None:
        return False
    env = {"gpu_available": True, "sm_arch": arch, "packages": hardware.package_versions()}
    kept = frozenset(g for g in state.gates.harness if selection_keeps(config, state, kernel, g))
    state.ahead.prestart_harness(state.context(config, kernel, node_path(config, kernel), env=env, collected=kept))
    return True
