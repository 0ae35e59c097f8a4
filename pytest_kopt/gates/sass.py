"""The ``sass`` gate: ``cuobjdump --dump-sass`` of the built artifact, split and saved per kernel function; and
the SASS verification of the loop's claimed methods against ``registries/sass_signatures.json``."""

from __future__ import annotations

import collections
import hashlib
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ..errors import EmptyKernelError, HardwareError
from .build import built
from .context import Context, Outcome
from .kernel_names import qualified_name

_FUNC_RE = re.compile(r"^\s*Function\s*:\s*(\S+)\s*$", re.M)
#: An instruction line: ``/*0040*/  @!P0 IMAD.WIDE R2, R3, R4, R2 ;`` -> opcode ``IMAD.WIDE``.
_INSN_RE = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:\{\s*)?(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", re.M)


@dataclass(frozen=True, slots=True)
class SassFunction:
    """SASS of one kernel function: ``opcodes`` counts each full mnemonic (``FFMA``, ``LDG.E.128``...)."""

    name: str
    arch: str
    text: str
    opcodes: dict[str, int]

    @property
    def instructions(self) -> int:
        """Number of instructions (including NOPs and the final BRA loop)."""
        return sum(self.opcodes.values())


def parse_sass(dump: str) -> list[SassFunction]:
    """Split ``cuobjdump --dump-sass`` text into functions. Returns [] when the dump holds no function."""
    functions = []
    arch = ""
    matches = list(_FUNC_RE.finditer(dump))
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(dump)
        before = dump[: m.start()]
        archs = re.findall(r"code for (sm_\w+)", before)
        arch = archs[-1] if archs else arch
        body = dump[m.start():end]
        ops = collections.Counter(_INSN_RE.findall(body))
        functions.append(SassFunction(name=m.group(1), arch=arch, text=body, opcodes=dict(ops)))
    return functions


def dump_sass(cuobjdump: str | None, artifacts: list[str], timeout_s: float = 120.0,
              ahead: Any = None) -> list[SassFunction]:
    """Run ``cuobjdump --dump-sass`` on each artifact (.so or .cubin) and parse it; ``ahead`` (the session's
    scheduler, :class:`pytest_kopt.scheduler.Scheduler`) gives a dump it made ahead (``sass_text``) instead.

    Raises HardwareError when cuobjdump is missing or fails; returns [] when the artifacts hold no kernel function
    (the caller decides what that means: never "patterns missing", FIELD.md §3).
    """
    if not cuobjdump:
        raise HardwareError("cuobjdump not found (CUDA toolkit bin/, or triton's bundled copy)", gate="sass",
                            fix="install the CUDA toolkit or pip install triton")
    functions: list[SassFunction] = []
    for art in artifacts:
        text = ahead.sass_text(cuobjdump, art, timeout_s) if ahead is not None else None
        if text is None:
            text = run_cuobjdump(cuobjdump, art, timeout_s)
        functions += parse_sass(text)
    return functions


def run_cuobjdump(cuobjdump: str, art: str, timeout_s: float) -> str:
    """``cuobjdump --dump-sass ART``'s text. Raises HardwareError when it cannot run, runs past ``timeout_s`` or
    fails."""
    try:
        proc = subprocess.run([cuobjdump, "--dump-sass", art], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise HardwareError(f"cuobjdump ran past {timeout_s:.0f} s on {art}", gate="sass") from None
    except OSError as exc:
        raise HardwareError(f"cuobjdump could not run: {exc}", gate="sass",
                            fix="install the CUDA toolkit or pip install triton") from None
    if proc.returncode != 0:
        raise HardwareError(f"cuobjdump failed (exit {proc.returncode}) on {art}", gate="sass",
                            details=proc.stderr[-2000:], fix="check that the artifact holds SASS for this arch")
    return proc.stdout


def save_sass(functions: list[SassFunction], folder: Path) -> list[str]:
    """Write one ``<function>.sass`` file per function into ``folder``, replacing the ``.sass`` files an earlier
    build left there (a function renamed since must not be read as this build's); returns the paths."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.sass"):
        old.unlink()
    paths = []
    for f in functions:
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", f.name)[:150]
        p = folder / f"{safe}.sass"
        p.write_text(f.text)
        paths.append(str(p))
    return paths


#: Mnemonics (before the first '.') that write global memory: stores, reductions, atomics, TMA and bulk copies,
#: surface stores. A kernel without any of them cannot produce an output.
GLOBAL_WRITES = {"STG", "ST", "RED", "REDG", "ATOM", "ATOMG", "UTMASTG", "UTMAREDG", "UBLKCP", "UBLKRED", "SUST",
                 "SURED"}
_ARCH_GUARD_RE = re.compile(r"^\s*#\s*(?:if|elif|ifdef|ifndef)\b.*__CUDA_ARCH.*$", re.M)


def writes_global(f: SassFunction) -> bool:
    """True when the function has an instruction that writes global memory (:data:`GLOBAL_WRITES`)."""
    return any(op.split(".")[0] in GLOBAL_WRITES for op in f.opcodes)


def _arch_guards(paths: list[Path]) -> list[str]:
    """``file:line: #if ...`` of every preprocessor condition on ``__CUDA_ARCH__``/``__CUDA_ARCH_FEAT_*``."""
    out = []
    for path in paths:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for m in _ARCH_GUARD_RE.finditer(text):
            out.append(f"{path.name}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0).strip()}")
    return out


def gate_sass(ctx: Context, case: Any = None) -> Outcome:
    """``cuobjdump --dump-sass`` of the build (a Triton build: its cubins), one ``sass/<function>.sass`` per kernel
    function. Fails as EMPTY_KERNEL when a function of the candidate's own writes no global memory (its work was
    compiled out, e.g. under an ``#if __CUDA_ARCH__`` guard the target does not meet); a library header's kernels
    (the kind's :meth:`~pytest_kopt.kinds.base.Kind.own_functions` leaves them out: CUB's never-launched
    ``EmptyKernel<void>``) are listed in the summary, not judged. A build that holds no kernel function is the kind's
    to judge (:meth:`~pytest_kopt.kinds.base.Kind.no_sass`: a ``.cu`` whose ``solve()`` only copies or calls a library
    is NotApplicable)."""
    sources = ctx.kind.sass_sources(ctx)
    res = built(ctx)
    artifacts = ctx.kind.sass_artifacts(res)
    functions = dump_sass(ctx.tool("cuobjdump"), artifacts, ahead=ctx.ahead)
    if not functions:
        raise ctx.kind.no_sass(ctx, artifacts)
    paths = save_sass(functions, ctx.outdir / "sass")
    total = sum(f.instructions for f in functions)
    figures = {"functions": len(functions), "instructions": total, "sass_arch": functions[0].arch}
    own = ctx.kind.own_functions(ctx, [f.name for f in functions])
    library = [] if own is None else [f for f in functions if f.name not in set(own)]
    if library:
        figures["library_functions"] = len(library)
    judged = [f for f in functions if f not in library]
    idle = [f for f in judged if not writes_global(f)]
    if idle:
        shown = "; ".join(f"{f.name} ({f.instructions} insns: {', '.join(sorted(f.opcodes)[:6])})" for f in idle)
        guards = _arch_guards(sources)
        raise EmptyKernelError(
            f"{len(idle)} kernel function(s) write no global memory on {functions[0].arch}: {shown}; their work "
            "was compiled out for this arch", gate="sass", path=ctx.display,
            details="arch guards in the source:\n" + "\n".join(guards) if guards else None,
            fix=f"give {functions[0].arch} a code path (the guard above excludes it), or build for the arch the "
                "guard needs with --kopt-arch")
    parts = [", ".join(f"{f.name} ({f.instructions} insns)" for f in judged[:4])] if judged else []
    if library:
        parts.append(f"{len(library)} library kernel(s) compiled in from included headers, not checked: "
                     + ", ".join(qualified_name(f.name) for f in library[:3]))
    return Outcome(figures, f"{functions[0].arch}: {'; '.join(parts)}", tuple(paths))


#: A whole instruction line, from its offset comment on: ``/*0040*/  IMAD.WIDE R2, R3, R4, R2 ;  /* 0x... */``.
_INSN_LINE_RE = re.compile(r"^\s*(/\*[0-9a-f]{4,}\*/\s+\S.*?)\s*$", re.M)


def instruction_digest(text: str) -> str:
    """SHA-256 (hex) of one function's instruction lines alone (offset, instruction, operands, encoding), so two
    builds that differ only in what the dump says around the code (``identifier = <build dir>/kopt_shim.cu``) digest
    the same, and any changed instruction, operand or scheduling bit digests differently."""
    return hashlib.sha256("\n".join(m.group(1) for m in _INSN_LINE_RE.finditer(text)).encode()).hexdigest()


def sass_digests(folder: Path) -> dict[str, str]:
    """``{function: instruction_digest}`` of the ``<function>.sass`` files :func:`save_sass` wrote in ``folder``;
    {} when there are none (the sass gate did not run)."""
    return {p.stem: instruction_digest(p.read_text()) for p in sorted(folder.glob("*.sass"))}


def opcodes(sass_texts: list[str]) -> set[str]:
    """Full opcodes (mnemonic + modifiers) in the instruction lines of the kernel functions' SASS only, so a symbol
    name or header comment never matches (upstream matched substrings of the whole dump)."""
    ops: set[str] = set()
    for text in sass_texts:
        ops.update(_INSN_RE.findall(text))
    return ops


def _has(ops: set[str], pattern: str) -> bool:
    return any(op == pattern or op.startswith(pattern + ".") for op in ops)


def verify_methods(methods: list[str], sass_texts: list[str], signatures: Mapping[str, Any]) -> dict[str, str]:
    """Per claimed method: ``pass`` (its signature's opcodes appear), ``fail`` (they do not), ``inconclusive`` (the
    registry says why no opcode can show it, or its signature lists no opcode), ``not_applicable`` (no signature:
    counts as unverified) or ``tool_error`` (no SASS at all: never pass). See :func:`sass_evidence`."""
    return {m: e["status"] for m, e in sass_evidence(methods, sass_texts, signatures).items()}


def sass_evidence(methods: list[str], sass_texts: list[str], signatures: Mapping[str, Any]) -> dict[str, dict]:
    """Per claimed method, what ``sass_check.json`` records: ``status`` (see :func:`verify_methods`),
    ``require_all``/``require_any`` (the opcodes the signature looks for, registries/sass_signatures.json),
    ``found`` and ``missing`` (of those, in the kernel functions' instruction lines only), ``reason`` (why it is
    inconclusive or not applicable). SKILL.md: empty patterns and unavailable artifacts are never success."""
    has_sass = bool(sass_texts) and any(t.strip() for t in sass_texts)
    ops = opcodes(sass_texts) if has_sass else set()
    out: dict[str, dict] = {}
    for m in methods:
        sig = signatures["signatures"].get(m) or {}
        need_all, need_any = list(sig.get("require_all", [])), list(sig.get("require_any", []))
        entry: dict[str, Any] = {"require_all": need_all, "require_any": need_any, "found": [], "missing": [],
                                 "reason": None}
        if not has_sass:
            entry.update(status="tool_error", reason="no SASS of the kernel's own functions to read")
        elif m in signatures.get("inconclusive", {}):
            entry.update(status="inconclusive", reason=signatures["inconclusive"][m])
        elif not sig:
            entry.update(status="not_applicable", reason="registries/sass_signatures.json has no signature for it")
        elif not need_all and not need_any:
            entry.update(status="inconclusive", reason="its signature lists no opcode")
        else:
            entry["found"] = [p for p in need_all + need_any if _has(ops, p)]
            entry["missing"] = [p for p in need_all if not _has(ops, p)] + \
                ([] if not need_any or any(_has(ops, p) for p in need_any) else need_any)
            entry["status"] = "pass" if not entry["missing"] else "fail"
        out[m] = entry
    return out
