"""The shapes a problem lists: ref.py's ``dims`` (test shapes) and ``benchmarks`` (timed shapes) literals, or a
GPU MODE ``task.yml``'s ``tests`` and ``benchmarks`` rows beside it.

Read from the file's syntax tree (:func:`pytest_kopt.gates.pycontract.read_python`), never by running it. The
plugin hands :func:`listed_shapes` to :func:`pytest_kopt.settings.build_settings`, which takes the test shapes from
here when no ``--kopt-dims`` is given.
"""

from __future__ import annotations

import copy
import functools
import reprlib
from pathlib import Path
from typing import Any

from ..errors import ConfigError, ContractError
from ..settings import NAME_RE, fits_int64
from .pycontract import read_python


def ref_shapes(ref: Path, name: str) -> list[dict[str, Any]]:
    """ref.py's ``dims`` (test shapes) or ``benchmarks`` (timed shapes) literal: a list of dicts of dims, whose
    values may be numbers, booleans, strings or tuples of numbers (a KernelBench size, a GPU MODE key); [] when it
    has none. Raises ConfigError naming the file and line when the literal is malformed."""
    try:
        c = read_python(ref)
    except ContractError:
        return []  # the preflight item reports a reference that does not parse
    if name not in c.constants:
        if c.problem_format == "gpumode":
            return task_shapes(ref.parent / "task.yml", "tests" if name == "dims" else "benchmarks")
        return []
    value = c.constants[name]
    ok = isinstance(value, (list, tuple)) and value and all(
        isinstance(d, dict) and d and all(isinstance(k, str) and NAME_RE.match(k) and _dim_value(v)
                                          for k, v in d.items()) for d in value)
    if not ok:
        raise ConfigError(f"{ref}:{c.constant_lines.get(name)}: {name} = {value!r} is not a list of shapes",
                          fix=f'write {name} = [{{"M": 1024, "N": 1024}}, {{"M": 4096, "N": 512}}] (a dict of dims '
                              "per shape: numbers, booleans, strings or tuples of numbers)")
    return [{k: list(v) if isinstance(v, tuple) else v for k, v in d.items()} for d in value]


def task_rows(ref: Path) -> bool:
    """True when ``ref``'s test shapes are a GPU MODE ``task.yml``'s rows (a GPU MODE problem without a ``dims``
    list of its own)."""
    try:
        c = read_python(ref)
    except ContractError:
        return False
    return c.problem_format == "gpumode" and "dims" not in c.constants


def task_shapes(path: Path, key: str) -> list[dict[str, Any]]:
    """A GPU MODE ``task.yml``'s ``tests`` or ``benchmarks``: one dict of ``generate_input`` arguments per shape,
    its ``seed`` left out (kopt's seeds are used); [] when there is no such file or list. Read once per version of
    the file (its path, modification time and size), as :func:`~pytest_kopt.gates.pycontract.read_python` reads
    ref.py: a session asks for it from every item. Raises ConfigError when the file is not UTF-8 or not YAML, a row
    is no dict of sizes, or pyyaml is missing."""
    try:
        st = path.stat()
    except OSError:
        return []
    if not path.is_file():
        return []
    return copy.deepcopy(list(_task_shapes(str(path), st.st_mtime_ns, st.st_size, key)))


#: How a bad row is shown: two levels deep, a few items each (its aliases may nest a billion values).
_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxdict, _SHORT.maxstring = 2, 4, 6, 40


@functools.lru_cache(maxsize=64)
def _task_shapes(path_str: str, mtime_ns: int, size: int, key: str) -> tuple[dict[str, Any], ...]:
    path = Path(path_str)
    try:
        import yaml
    except ImportError:
        raise ConfigError(f"{path}: reading a GPU MODE task.yml needs pyyaml", fix="pip install pyyaml") from None
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})",
                          fix="save task.yml as UTF-8") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read ({exc.strerror})", fix="check task.yml's permissions") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc})", fix="fix task.yml") from None
    rows = (doc or {}).get(key) if isinstance(doc, dict) else None
    if not isinstance(rows, list):
        return ()
    out = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or not all(isinstance(k, str) and _dim_value(v) for k, v in row.items()):
            # the row as YAML wrote it may be an alias expanded many times over: shown cut, never whole
            raise ConfigError(f"{path}: {key} entry {i + 1} ({_SHORT.repr(row)[:160]}) is not a dict of sizes",
                              fix=f"write each of {key} as a dict, e.g. - {{size: 1024, seed: 1}}")
        shape = {k: v for k, v in row.items() if k != "seed"}
        if shape:
            out.append(shape)
    return tuple(out)


def _dim_value(v: Any) -> bool:
    """A value a shape may give a dim: a number (an int within 64 bits: every launcher passes one as such), a
    boolean, a string, or a list of numbers."""
    if isinstance(v, (bool, int, float, str)):
        return fits_int64(v)
    return isinstance(v, (list, tuple)) and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                and fits_int64(x) for x in v)


def listed_shapes(ref: Path) -> tuple[list[dict[str, Any]], bool]:
    """``ref``'s test shapes (:func:`ref_shapes` ``dims``) and whether they are a ``task.yml``'s rows
    (:func:`task_rows`), the pair :func:`pytest_kopt.settings.build_settings` takes. Raises ConfigError as
    :func:`ref_shapes` does."""
    return ref_shapes(ref, "dims"), task_rows(ref)


__all__ = ["listed_shapes", "ref_shapes", "task_rows", "task_shapes"]
