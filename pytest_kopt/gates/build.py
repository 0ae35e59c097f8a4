"""The ``compile`` gate: the kernel built by its kind (:meth:`pytest_kopt.kinds.base.Kind.build`: nvcc for a ``.cu``,
Triton's compiler for a Triton file) into a content-addressed cache, a build failure remembered per the build's
inputs, and the gate's report.

The cache key covers the source, every local header it includes (recursively), the compiler and its version, the
flags and the arch (SKILL.md's build manifest). A ``filelock`` per key lets parallel xdist workers share builds.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..artifacts import read_dict, write_json
from ..child.autotune import describe
from ..errors import Blocked, CompileError, ContractError, KoptError
from .context import Context, Outcome
from .preflight import preflight
from .trust import digest, local_sources

BUILD_SCHEMA = 1

#: The status of a build a signal ended (nvcc, or the compiler it ran): not the kernel's error, never remembered.
INTERRUPTED = "INTERRUPTED"


@dataclass(frozen=True, slots=True)
class BuildResult:
    """A finished build: ``artifact`` is the .so (CUDA) or the folder of cubins (Triton); ``seconds`` is the
    compile wall time in s (0 on a cache hit); ``command`` the compiler command line; ``log`` its output."""

    artifact: str
    key: str
    cache_hit: bool
    seconds: float
    command: list[str]
    log: str
    cubins: tuple[str, ...] = ()
    #: CUTLASS/CuTe include folders the build used (empty for a kernel without CUTLASS)
    include_dirs: tuple[str, ...] = ()
    #: Triton: one cubin per kernel, of the config every later gate runs (an ``@triton.autotune`` kernel's tuned or
    #: stated config)
    pinned: tuple[str, ...] = ()
    #: Triton: per ``@triton.autotune`` kernel, ``config`` (the pinned config's kwargs), ``configs`` (how many it
    #: has), ``compiled`` (how many were compiled ahead of time without a GPU)
    autotune: dict[str, Any] = field(default_factory=dict)

    @property
    def warnings(self) -> list[str]:
        """The compiler's warning lines (``k.cu:12: warning #177-D: ...``), in order."""
        return [ln.strip() for ln in self.log.splitlines() if re.search(r":\d+: warning\b", ln)]


def cache_key(parts: dict[str, Any], files: list[Path]) -> str:
    """The build cache key (24 hex digits of SHA-256) of ``parts`` (JSON) and the contents of ``files``."""
    h = hashlib.sha256(json.dumps(parts, sort_keys=True).encode())
    for f in files:
        h.update(str(f).encode())
        h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()[:24]


def build_mark(ctx: Context) -> str:
    """What a build's outcome depends on, for the remembered failure (``compile_error.json``): the kernel, the
    ``.py`` files beside it, what its kind adds (:meth:`~pytest_kopt.kinds.base.Kind.build_inputs`: a ``.cu``'s
    local headers, a Triton build's dims), the arch and the tools' and libraries' versions."""
    return digest(local_sources(ctx.kernel), ctx.kernel.read_bytes(), ctx.kind.name, *ctx.kind.build_inputs(ctx),
                  ctx.arch, ctx.env.get("tools"), ctx.env.get("packages"))


def ensure_built(ctx: Context) -> BuildResult:
    """Build (or reuse) the kernel for ``ctx.arch``. A compile error is remembered per :func:`build_mark` in
    ``<outdir>/compile_error.json`` (this or a later session does not try the same sources again) and forgotten once
    a build succeeds. Raises CompileError/HardwareError (or, for a Triton file, the harness's error), or Blocked by
    preflight when the static contract fails."""
    try:
        preflight(ctx)
    except ContractError as exc:
        raise Blocked("preflight", exc.message) from None
    failed = ctx.outdir / "compile_error.json"
    mark = build_mark(ctx)
    rec = read_dict(failed)
    if rec is not None and rec.get("mark") == mark:
        raise CompileError(rec.get("message", "failed before"), gate="compile", path=ctx.display,
                           line=rec.get("line"), details=rec.get("details"), fix=rec.get("fix"),
                           status=rec.get("status"))
    try:
        res = ctx.kind.build(ctx, ctx.cache_dir / "builds")
    except CompileError as exc:
        if exc.status != INTERRUPTED:  # an interrupted build says nothing about the sources
            write_json(failed, {"mark": mark, "message": exc.message, "line": exc.line, "details": exc.details,
                                "fix": exc.fix, "status": exc.status})
        raise
    failed.unlink(missing_ok=True)
    return res


def built(ctx: Context) -> BuildResult:
    """:func:`ensure_built` for a gate that needs the build: any failure to build is Blocked by compile (the
    compile item reports it), never this gate's own failure."""
    try:
        return ensure_built(ctx)
    except KoptError as exc:
        raise Blocked("compile", exc.message) from None


def gate_compile(ctx: Context, case: Any = None) -> Outcome:
    """The compile gate: the kernel built for the target arch by its kind (content-addressed cache), waiting for
    its build when the session's scheduler started it ahead; the build's SASS dumps start here where no build
    thread started them (:meth:`~pytest_kopt.scheduler.Scheduler.dump_sass_ahead`)."""
    ctx.ahead.wait_build(ctx)
    res = ensure_built(ctx)
    ctx.ahead.dump_sass_ahead(ctx, res)  # for the sass item, while the correctness and timing items run
    built_ahead = ctx.ahead.built_ahead(res)  # built by this process, from its first item on
    ahead = built_ahead is not None
    seconds = built_ahead if built_ahead is not None else res.seconds
    figures: dict[str, Any] = {"arch": ctx.arch, "cache_hit": res.cache_hit and not ahead,
                               "compile_s": round(seconds, 3), "build_key": res.key,
                               "compiler_warnings": len(res.warnings)}
    where = res.artifact if not res.cubins else f"{len(res.cubins)} cubin(s) in {res.artifact}"
    line = (f"built in {seconds:.1f} s (started ahead)" if ahead else
            "cache hit" if res.cache_hit else f"built in {res.seconds:.1f} s") + f": {where}"
    if res.include_dirs:
        figures["cutlass_include"] = res.include_dirs[0]
        line += f"; CUTLASS headers from {res.include_dirs[0]}"
    for name, tuned in sorted(res.autotune.items()):
        how = (f"tuned over {tuned['configs']} configs" if ctx.gpu else
               f"{tuned.get('compiled', tuned['configs'])} of {tuned['configs']} configs compiled, the first stated")
        figures[f"autotune_{name}"] = describe(tuned["config"])
        line += f"; @triton.autotune {name}: {how}, pinned {describe(tuned['config'])}"
    if res.warnings:
        figures["first_warning"] = res.warnings[0][:300]
        line += f"; {len(res.warnings)} compiler warning(s), the first: {res.warnings[0][:200]}"
    return Outcome(figures, line, (res.artifact,))
