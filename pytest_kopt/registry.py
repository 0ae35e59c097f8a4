"""The registries: method catalogue, ncu metric aliases, SASS signatures, the report schema and the agent's guides.

They live in the repository's top-level ``registries/`` folder and ship in the wheel as package data of
``pytest_kopt`` (``pytest_kopt/registries/`` in site-packages; see ``pyproject.toml``). A source checkout or an
editable install reads the top-level folder itself.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
#: Where the files are: package data in an installed wheel, else the repository's top-level folder.
REGISTRY_DIR = _HERE / "registries" if (_HERE / "registries").is_dir() else _HERE.parent / "registries"

METHODS = "method_registry"
METRICS = "metric_registry"
SASS = "sass_signatures"
REPORT_SCHEMA = "report_schema"
LOOP_SCHEMA = "loop_schema"


def path(name: str) -> Path:
    """The path of registry file ``name`` (``method_registry``, ``metric_registry``, ``sass_signatures``,
    ``report_schema``, ``loop_schema``, or a guide's file name such as ``optimization_catalog.md``). Raises
    FileNotFoundError naming the folder looked in when it is not there (a broken install)."""
    p = REGISTRY_DIR / (name if "." in name else f"{name}.json")
    if not p.is_file():
        raise FileNotFoundError(f"pytest-kopt registry {p.name} not found in {REGISTRY_DIR} (a broken install? "
                                "reinstall pytest-kopt)")
    return p


def files() -> list[Path]:
    """Every registry file (the JSON registries and the agent's guides), sorted: what a session pins at its start
    (:mod:`pytest_kopt.gates.pins`)."""
    return sorted(p for p in REGISTRY_DIR.glob("*") if p.suffix in (".json", ".md") and p.is_file())


@functools.lru_cache(maxsize=8)
def load(name: str) -> dict[str, Any]:
    """The JSON document of registry ``name``, read once per process. Raises FileNotFoundError (see :func:`path`)
    or json.JSONDecodeError. Callers must not modify it."""
    return json.loads(path(name).read_text())
