"""nvcc started before the GPU probe: where the arch is known at configure (``--kopt-arch``, or every visible GPU's
compute capability read through NVML), a session without xdist starts its ``.cu`` builds there instead of at its
first item, so they run beside the probe (0.47 s on the H200), collection and the first items.

Only where the selection surely keeps the kernel's compile item: a build the session then skipped would still be
waited for at its end (nvcc must not outlive the session), and a CUTLASS build takes a minute.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ..gates import hardware
from .stash import SessionState


def selection_keeps_compile(config: pytest.Config, kernel: Path) -> bool:
    """True when ``kernel``'s compile item is surely selected: no ``--collect-only``, ``--lf``, ``--sw``,
    ``--deselect`` or node id (``k.cu::compile``) among the arguments, and ``-k``/``-m`` (if given) evaluate true
    for it with pytest's own expression parser, over the names and markers pytest matches it by (its name
    ``compile``, its file's name and folders below the root, the ``kopt`` marker). False when unsure: an
    expression pytest cannot parse here, or one with call parameters."""
    opt = config.option
    if (getattr(opt, "collectonly", False) or getattr(opt, "lf", False) or getattr(opt, "stepwise", False)
            or getattr(opt, "deselect", None) or any("::" in str(a) for a in config.args)):
        return False
    try:
        from _pytest.mark.expression import Expression
    except ImportError:
        return False
    try:
        rel = kernel.resolve().relative_to(config.rootpath.resolve())
        names = {"compile", "kopt", *rel.parts}
    except ValueError:  # outside the root: pytest names it by its own folders
        names = {"compile", "kopt", kernel.name, kernel.parent.name}

    def keyword(sub: str, /, **kwargs: Any) -> bool:
        if kwargs:
            raise ValueError("call parameters")
        return any(sub.lower() in n.lower() for n in names)

    def marker(name: str, /, **kwargs: Any) -> bool:
        if kwargs:
            raise ValueError("call parameters")
        return name == "kopt"

    try:
        for expr, matcher in ((getattr(opt, "keyword", "") or "", keyword), (getattr(opt, "markexpr", "") or "",
                                                                             marker)):
            if expr.strip() and not Expression.compile(expr.strip()).evaluate(matcher):
                return False
    except Exception:  # a syntax pytest reports itself later, or an API this pytest lacks: no early start
        return False
    return True


def start_builds_early(config: pytest.Config, state: SessionState) -> int:
    """Start the session's ``.cu`` builds (:meth:`~pytest_kopt.gates.build.BuildAhead.start_early`) when this
    process runs the items (no xdist), nvcc is found, the arch is known before the probe (``--kopt-arch``, else
    :func:`~pytest_kopt.gates.hardware.nvml_arch`) and the selection keeps the kernel's compile item. Returns how
    many builds were started."""
    s = state.settings
    if getattr(config.option, "dist", "no") != "no" or getattr(config.option, "numprocesses", None):
        return 0  # each xdist worker starts its kernels' builds at its first item
    kernels = [k for k in s.kernels if k.suffix == ".cu" and selection_keeps_compile(config, k)]
    nvcc = hardware.find_tool("nvcc") if kernels else None
    arch = (s.arch or hardware.nvml_arch()) if nvcc else None
    if not arch or not nvcc:
        return 0
    return state.builds.start_early(kernels, arch, state.cache_dir(config) / "builds", nvcc,
                                    hardware.tool_version(nvcc), max(600.0, s.gate_timeout_s))
