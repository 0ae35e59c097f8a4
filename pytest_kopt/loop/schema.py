"""The loop's files checked against ``registries/loop_schema.json`` when read (jsonschema, Draft 2020-12), and the
one error every bad loop file becomes: a :class:`~pytest_kopt.errors.ConfigError` (exit 4) listing each problem.

An agent or a candidate may write any bytes into a run directory; what the loop reads is decoded as UTF-8, parsed
as JSON and validated here before any field is used, so a bad file is a usage error naming the file, the field and
the fix, never a traceback.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, Iterable

from .. import registry
from ..errors import ConfigError

#: The registry file of the loop's schemas (one ``$defs`` entry per file kind).
SCHEMA = registry.LOOP_SCHEMA


def loop_error(message: str, problems: Iterable[str], *, fix: str, path: Path | str | None = None,
               gate: str = "loop") -> ConfigError:
    """A ConfigError (exit 4) whose message ends with each problem on its own line; ``details`` lists them as
    ``- problem`` lines, which the ``--kopt-json`` report gives as ``error.problems``."""
    listed = list(dict.fromkeys(str(p) for p in problems)) or [message]
    return ConfigError(message + ":\n  - " + "\n  - ".join(listed), gate=gate,
                       path=None if path is None else str(path), fix=fix,
                       details="\n".join(f"- {p}" for p in listed))


def problem_lines(exc: ConfigError) -> list[str]:
    """The problems of a ConfigError made by :func:`loop_error` (its ``details`` lines), else its message."""
    lines = [ln[2:] for ln in (exc.details or "").splitlines() if ln.startswith("- ")]
    return lines or [exc.message]


@functools.lru_cache(maxsize=16)
def _validator(kind: str) -> Any:
    """The validator of ``$defs/<kind>`` (built once per process: jsonschema is imported only by a loop step)."""
    import jsonschema

    schema = registry.load(SCHEMA)
    return jsonschema.Draft202012Validator({"$schema": schema["$schema"], "$defs": schema["$defs"],
                                            "$ref": f"#/$defs/{kind}"})


def problems(doc: Any, kind: str, where: str) -> list[str]:
    """Each way ``doc`` breaks the schema ``$defs/<kind>``, as sentences naming ``where`` (a file name) and the
    field (``state.json: open_iter: 'x' is not of type 'integer', 'null'``); [] when it is valid."""
    out = []
    for err in sorted(_validator(kind).iter_errors(doc), key=lambda e: [str(p) for p in e.absolute_path]):
        field = ".".join(str(p) for p in err.absolute_path)
        out.append(f"{where}: {field + ': ' if field else ''}{_short(err)}")
    return out


def _short(err: Any) -> str:
    """jsonschema's message, without the whole value when it is long (a history list, a hostile blob)."""
    text = str(err.message)
    return text if len(text) <= 300 else text[:297] + "..."


def check(doc: Any, kind: str, path: Path | str, *, fix: str) -> None:
    """Raise the loop's ConfigError when ``doc`` breaks ``$defs/<kind>`` (see :func:`problems`)."""
    found = problems(doc, kind, Path(path).name)
    if found:
        raise loop_error(f"{path} is not a valid {Path(path).name}", found, path=path, fix=fix)


def read_text(path: Path, *, fix: str, gate: str = "loop") -> str:
    """The file's text as UTF-8 (a byte-order mark dropped). Raises the loop's ConfigError (its ``gate``) when it
    is missing, unreadable, not UTF-8 or holds a NUL byte."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise loop_error(f"{path} is missing", [f"{path}: no such file"], path=path, fix=fix, gate=gate) from None
    except OSError as exc:
        raise loop_error(f"{path} cannot be read", [f"{path}: {exc.strerror or exc}"], path=path, fix=fix,
                         gate=gate) from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise loop_error(f"{path} is not UTF-8 text", [f"{path.name}: byte {exc.start} is not UTF-8 "
                                                       f"({data[exc.start:exc.start + 1]!r})"],
                         path=path, fix=fix, gate=gate) from None
    if "\x00" in text:
        raise loop_error(f"{path} is not text", [f"{path.name}: holds a NUL byte"], path=path, fix=fix, gate=gate)
    return text


def read_json(path: Path, *, fix: str, gate: str = "loop") -> Any:
    """The JSON document of a loop file (see :func:`read_text`); NaN and infinities are refused. Raises the loop's
    ConfigError (its ``gate``) naming the line and column of a syntax error."""
    text = read_text(path, fix=fix, gate=gate)

    def constant(name: str) -> Any:
        raise ValueError(f"{name} is not a JSON number")

    try:
        return json.loads(text, parse_constant=constant)
    except json.JSONDecodeError as exc:
        raise loop_error(f"{path} is not valid JSON", [f"{path.name}: {exc.msg} at line {exc.lineno} column "
                                                       f"{exc.colno}"], path=path, fix=fix, gate=gate) from None
    except (ValueError, RecursionError) as exc:
        raise loop_error(f"{path} is not valid JSON", [f"{path.name}: {exc}"], path=path, fix=fix,
                         gate=gate) from None
