"""The ``preflight`` gate: the kernel's and the reference's contracts, checked from their source (nothing imported
or run; the parsers are :mod:`pytest_kopt.gates.contract`)."""

from __future__ import annotations

import warnings
from typing import Any

from ..errors import ConfigError, ContractError
from ..settings import ref_shapes
from . import contract
from .context import Context, Outcome
from .inputs import REGIMES


class KoptDimsWarning(UserWarning):
    """A --kopt-dims entry that no function or solve() parameter names (likely a typo); never a failure."""


def preflight(ctx: Context) -> list[contract.Param]:
    """The static contract check, shared by every later gate: the reference's (its literals: ``regimes``,
    ``dims``, ``benchmarks``, ``inplace``, ``extra_dims``), then the kernel's, which its kind checks
    (:meth:`~pytest_kopt.kinds.base.Kind.preflight`). Returns ``solve``'s parameters ([] for a kind without them).
    Raises ContractError (exit 4) naming the file, the line and the fix."""
    c = contract.check_reference(ctx.ref)
    regimes = c.constants.get("regimes")
    if "regimes" in c.constants and (not isinstance(regimes, (list, tuple)) or not regimes
                                     or any(r not in REGIMES for r in regimes)):
        raise ContractError(f"regimes = {regimes!r} is not a list of {', '.join(REGIMES)}", gate="preflight",
                            path=str(ctx.ref), fix='e.g. regimes = ["normal", "uniform", "small_int", "wide"]')
    for listed in ("dims", "benchmarks"):
        try:
            ref_shapes(ctx.ref, listed)
        except ConfigError as exc:
            raise ContractError(exc.message.split(": ", 1)[1], gate="preflight", path=str(ctx.ref),
                                line=c.constant_lines.get(listed), fix=exc.fix) from None
    inplace = c.constants.get("inplace")
    if "inplace" in c.constants and (not isinstance(inplace, (list, tuple))
                                     or not all(isinstance(v, str) for v in inplace)):
        raise ContractError(f"inplace = {inplace!r} is not a list of buffer names", gate="preflight",
                            path=str(ctx.ref), line=c.constant_lines.get("inplace"),
                            fix='name the outputs that are also inputs, e.g. inplace = ["x"]')
    extra = c.constants.get("extra_dims")
    if "extra_dims" in c.constants and (not isinstance(extra, (list, tuple)) or not all(
            isinstance(d, dict) and all(isinstance(v, (int, float)) for v in d.values()) for d in extra)):
        raise ContractError(f"extra_dims = {extra!r} is not a list of dicts of numbers", gate="preflight",
                            path=str(ctx.ref), fix='e.g. extra_dims = [{"M": 1, "N": 1}, {"M": 127, "N": 33}]')
    return ctx.kind.preflight(ctx)


def gate_preflight(ctx: Context, case: Any = None) -> Outcome:
    """Check the kernel and reference contracts without running anything. Dims that nothing names (see
    :func:`pytest_kopt.gates.contract.unused_dims`) give a KoptDimsWarning and a note in the summary."""
    params = preflight(ctx)
    own = ctx.kind.source_contract(ctx)
    unused = contract.unused_dims(ctx.settings.dims, params, contract.read_python(ctx.ref), *([own] if own else []))
    note = ""
    if unused:
        note = f"; --kopt-dims {', '.join(unused)} not named by solve(), setup() or ref.py (a typo?)"
        warnings.warn(KoptDimsWarning(f"{ctx.display}: {note[2:]}"), stacklevel=1)
    figures, line = ctx.kind.describe(ctx, params, note)
    return Outcome(figures, line)
