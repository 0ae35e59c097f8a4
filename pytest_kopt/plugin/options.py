"""The ``--kopt-*`` options (each with an ini twin) and how they become the session's :class:`Settings`.

The options every session reads are here; each concern's own are declared beside its plugin (``OPTIONS`` and
``FLAGS`` of :mod:`~pytest_kopt.plugin.report`, :mod:`~pytest_kopt.plugin.compare`, :mod:`~pytest_kopt.plugin.loop`)
and added to the same group by :func:`add_options`."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from .. import defaults
from ..errors import ConfigError, KoptError, closest
from ..gates.shapes import listed_shapes
from ..loop import lock, session, state
from ..seeds import fresh_session_seed
from ..settings import Settings, build_settings

#: (option name, help, metavar) of the options every session reads. Each has an ini twin ``kopt_<name>`` with the
#: same help.
OPTIONS = (
    ("baseline", "Kernel to judge: a CUDA/CUTLASS .cu with extern \"C\" solve(), or a Triton .py", "PATH"),
    ("ref", "Reference file defining reference(**kwargs), optional atol/rtol/workload_model/shapes", "PATH"),
    ("dims", "Kernel dims as M=4096,N=4096,K=4096 or a JSON object; repeat for several shapes (correctness on "
             "each, timing on each, a geometric-mean speedup); default: ref.py's dims = [...]", "DIMS"),
    ("candidate", "Another kernel to judge in the same session (repeatable)", "PATH"),
    ("seed", "Session seed the correctness seeds derive from: an integer, or 'last' (default: drawn now)", "N"),
    ("seeds", "Explicit correctness seeds, comma-separated (instead of --kopt-seed)", "SEEDS"),
    ("atol", "Absolute tolerance, overriding the reference's atol", "FLOAT"),
    ("rtol", "Relative tolerance, overriding the reference's rtol", "FLOAT"),
    ("arch", "nvcc/Triton target arch such as sm_90a (default: the detected GPU's, else sm_90a)", "ARCH"),
    ("outdir", "Folder for env.json, bench.json, ncu reports and SASS (default .kopt)", "DIR"),
    ("timeout", "Per-gate timeout of a kernel run in seconds (default 60)", "SECONDS"),
    ("ncu-timeout", "Timeout of one ncu profile in seconds (default 300)", "SECONDS"),
    ("timing", "Timing method: cupti (default; the kernels' own span from CUPTI activity records, CUDA events "
               "beside it), events (CUDA events around each call) or graph (20 L2-flush+call pairs in a CUDA graph "
               "minus a flush-only graph)", "METHOD"),
    ("rotating-memory", "Largest fraction of free GPU memory the timing gate's rotating input sets may take "
                        "(default 0.25; at least one set is always used)", "FRACTION"),
    ("sanitizer", "Run compute-sanitizer tools on one call: memcheck,racecheck,initcheck,synccheck", "TOOLS"),
    ("gpus", "GPUs to spread the session over with -n: all (default: the first GPU's model), CUDA ordinals such "
             "as 0,1, or UUIDs or their prefixes; each xdist worker is pinned to the one with the fewest workers "
             "through CUDA_VISIBLE_DEVICES (ignored without a GPU)", "LIST"),
    ("ncu-num", f"Top ncu metrics kept per axis in ncu_top.json (default {defaults.NCU_NUM})", "N"),
    ("precision", "KernelBench problems: fp32 (default), fp16 or bf16, as KernelBench's precision argument (inputs "
                  "and both models cast, its tolerance 1e-4, 1e-2, 1e-2)", "PRECISION"),
    ("edge-shapes", "Correctness also at edge shapes derived from the dims (sizes 1, a small prime, not a multiple "
                    "of 16, just past a power of two, one off the given size) where the kernel takes its sizes at "
                    "run time: auto (default) or off", "MODE"),
)
#: (flag, help): boolean options every session reads, each with an ini twin.
FLAGS = (
    ("fresh-process", "Run every GPU request in a fresh child process instead of one warm child per kernel "
                      "(slower: torch import and CUDA context per request)"),
    ("no-fork-server", "Start each warm harness process as a new Python that imports torch itself, instead of "
                       "forking it from one process that imported torch once (slower; for comparison, or where "
                       "forking misbehaves)"),
)
#: pytest cache key of the last session seed (``--kopt-seed last``).
SEED_CACHE_KEY = "kopt/session_seed"
#: pytest cache key of the session seed of the last session with a failing item: ``--lf``, ``--ff`` and ``--sw``
#: re-run pytest's recorded failures, whose node ids (``correctness[seed=...]``) only that seed reproduces.
FAILED_SEED_CACHE_KEY = "kopt/failed_session_seed"
#: pytest options that re-run recorded failures (their ``dest``).
_REPLAY_OPTIONS = ("lf", "failedfirst", "stepwise", "stepwise_skip")


def add_options(parser: pytest.Parser, options: tuple[tuple[str, str, str], ...],
                flags: tuple[tuple[str, str], ...] = ()) -> None:
    """Add ``options`` and ``flags`` to the ``kopt`` option group, each ``--kopt-<name>`` with its ini twin."""
    group = parser.getgroup("kopt", "GPU kernel gates (pytest-kopt)")
    for name, help_text, metavar in options:
        dest = "kopt_" + name.replace("-", "_")
        if name in ("candidate", "dims"):
            group.addoption(f"--kopt-{name}", dest=dest, action="append", default=None, metavar=metavar,
                            help=help_text)
            parser.addini(dest, help=help_text, type="paths" if name == "candidate" else "linelist", default=[])
            continue
        group.addoption(f"--kopt-{name}", dest=dest, default=None, metavar=metavar, help=help_text)
        parser.addini(dest, help=help_text, default=None)
    for name, help_text in flags:
        dest = "kopt_" + name.replace("-", "_")
        group.addoption(f"--kopt-{name}", dest=dest, action="store_true", default=None, help=help_text)
        parser.addini(dest, help=help_text, type="bool", default=False)


def check_known(args: list[str], flags: list[str], base: Path) -> None:
    """Raise UsageError for a ``--kopt-*`` argument that is none of ``flags``, naming the closest real one
    (argparse only says "unrecognized arguments"). Options are not parsed yet: a ``--kopt-json PATH`` among
    ``args`` (relative to ``base``, the invocation folder) gets the report of that usage error all the same.
    (An option given without its value is argparse's error, raised before any plugin hook: no report.)"""
    for arg in args:
        if arg == "--":
            break
        name = arg.split("=", 1)[0]
        if name.startswith("--kopt") and name not in flags:
            close = closest(name, flags)
            hint = f"did you mean {close}?" if close else "see pytest --help, group \"GPU kernel gates\""
            exc = ConfigError(f"unknown option {name}", fix=hint)
            write_error_report(exc, base, _arg_value(args, "--kopt-json"), _arg_value(args, "--kopt-run"))
            raise pytest.UsageError(f"pytest-kopt: {exc.message}\n  fix: {exc.fix}")


def _arg_value(args: list[str], flag: str) -> str | None:
    """The value of ``flag`` in unparsed ``args`` (``--flag VALUE`` or ``--flag=VALUE``; the last one given)."""
    found = None
    for i, arg in enumerate(args):
        if arg == "--":
            break
        if arg == flag and i + 1 < len(args):
            found = args[i + 1]
        elif arg.startswith(flag + "="):
            found = arg.split("=", 1)[1]
    return found


def write_error_report(exc: ConfigError, base: Path, path: Any, run_dir: Any = None) -> None:
    """Write the ``--kopt-json`` report of a session stopped by ``exc`` (:func:`config_error_document`) to ``path``
    (relative to ``base``); nothing for no path or ``-`` (stdout holds pytest's usage error alone)."""
    if path in (None, "", "-"):
        return
    target = Path(base, str(path))
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(config_error_document(exc, run_dir, target.resolve()), indent=2) + "\n")
    except OSError:
        pass  # the usage error itself still says what is wrong


def raw(config: pytest.Config, name: str) -> Any:
    """An option's value as given: the command line, else the ini file (``name`` without the ``kopt_`` prefix,
    underscores for dashes)."""
    dest = "kopt_" + name
    value = config.getoption(dest)
    if name in ("candidate", "dims"):
        return value or [str(p) for p in config.getini(dest)]
    return value if value is not None else config.getini(dest)


def usage_error(exc: ConfigError, config: pytest.Config | None = None) -> pytest.UsageError:
    """A ConfigError as pytest's usage error (exit 4), message and fix. With ``config`` and ``--kopt-json PATH``,
    the report is written too (:func:`config_error_document`), so an agent or CI reading it learns why nothing ran."""
    if config is not None and not hasattr(config, "workerinput"):
        write_error_report(exc, config.invocation_params.dir, raw(config, "json"), raw(config, "run"))
    return pytest.UsageError(f"pytest-kopt: {exc.message}\n  fix: {exc.fix}")


def config_error_document(exc: ConfigError, run_dir: Any = None, report: Path | None = None) -> dict[str, Any]:
    """The ``--kopt-json`` report (written to ``report``) of a session stopped before collection: ``exit_code`` 4,
    no items, ``error`` (status, gate, message, fix, path, line, problems); with ``--kopt-run``, a ``loop`` section
    whose ``stage`` is the gate (``methods`` for a methods.json that breaks a rule) and whose ``next`` says what to
    do (where the run's state cannot be read: the same command again, writing its report to ``report``)."""
    from .. import __version__
    from .ledger import JSON_SCHEMA_VERSION

    error = {"status": exc.status, "gate": exc.gate or "config", "message": exc.message, "fix": exc.fix,
             "path": exc.path, "line": exc.line,
             "problems": [ln.strip()[2:] for ln in (exc.details or "").splitlines() if ln.strip().startswith("- ")]}
    if exc.figures.get("problem_details"):  # each problem's fields (method, rule, metric, value, ...)
        error["problem_details"] = exc.figures["problem_details"]
    doc: dict[str, Any] = {"schema_version": JSON_SCHEMA_VERSION, "tool": "pytest-kopt", "version": __version__,
                           "exit_code": 4, "error": error, "items": [], "comparisons": [], "loop": None}
    if run_dir not in (None, ""):
        run_dir = Path(str(run_dir)).resolve()
        from ..loop import state as st

        nxt: dict[str, Any] = {"action": "fix_and_rerun", "write": [exc.path] if exc.path else [],
                               "command": [*st.PYTEST, f"--kopt-run={run_dir}"]}
        try:  # an open run: the step's own next, to fix and rerun; else what its state says (start over, done)
            step = st.next_step(Path(run_dir))
            nxt = {**step, **nxt, "command": step.get("command") or nxt["command"]} \
                if st.load_state(Path(run_dir)).get("open_iter") else step
        except (OSError, ValueError, KeyError, KoptError):  # a bad state.json: the error says so
            pass
        if not nxt.get("requires"):
            nxt = {**nxt, "runs_here": None}  # not known: this session stopped while it was being configured
        nxt = st.rerun_writing(nxt, report)
        try:
            view = st.run_view(Path(run_dir))
        except (OSError, ValueError, KeyError, KoptError):  # a bad state.json: the error says so
            view = {}
        doc["loop"] = {**view, "mode": "run", "run_dir": str(run_dir), "exit_code": 4, "stage": error["gate"],
                       "message": exc.message, "next": nxt}
    return doc


def session_seed(config: pytest.Config, given: Any, handed: dict[str, Any]) -> str | None:
    """The session seed as text: the one the xdist controller ``handed`` down; ``last`` reads pytest's cache;
    ``--lf``/``--ff``/``--sw`` without a seed take the seed of the last session that had a failure (so the recorded
    failures' node ids exist again); nothing given draws a fresh one (unless ``--kopt-seeds`` lists the seeds).
    Raises UsageError for ``last`` without one."""
    if "kopt_session_seed" in handed:
        return handed["kopt_session_seed"]
    if given in (None, "") and raw(config, "seeds"):
        return None
    cache = getattr(config, "cache", None)
    if given in (None, "") and cache is not None and any(config.getoption(o, False) for o in _REPLAY_OPTIONS):
        failed = cache.get(FAILED_SEED_CACHE_KEY, None)  # the seed whose failures pytest recorded
        if failed is not None:
            return str(failed)
        if cache.get(SEED_CACHE_KEY, None) is not None:
            given = "last"
    if str(given).strip().lower() == "last":
        if cache is None:
            raise usage_error(ConfigError("--kopt-seed last needs pytest's cache (it is disabled: -p no:cacheprovider)",
                                          fix="pass --kopt-seed N"), config)
        last = cache.get(SEED_CACHE_KEY, None)
        if last is None:
            raise usage_error(ConfigError("--kopt-seed last: no earlier session seed is recorded in the pytest cache",
                                          fix="run once without it, or pass --kopt-seed N"), config)
        return str(last)
    if given in (None, ""):
        return str(fresh_session_seed())
    return str(given)


def hold_run_lock(config: pytest.Config, run_dir: Path, mode: str) -> None:
    """A loop step's controller holds its run directory's lock (:func:`pytest_kopt.loop.lock.hold`) from here to
    the session's end (released by the config's cleanup, after every unconfigure hook); an xdist worker works
    under its controller's. Raises ConfigError when another step holds it."""
    if hasattr(config, "workerinput"):
        return
    config.add_cleanup(lock.hold(run_dir, mode).release)


def read_settings(config: pytest.Config, handed: dict[str, Any],
                  suffixes: tuple[str, ...] = (".cu", ".py")) -> Settings:
    """The session's settings from the options (``handed``: what the xdist controller gave a worker, {} in the
    controller). ``--kopt-run DIR`` takes the kernels, reference, dims and seeds from the run's state; ``--kopt-init``
    gets a new run folder (the controller's, in a worker). ``suffixes``: the kernel files the session's kinds may
    claim. Raises UsageError (exit 4) naming the option and fix."""
    overrides: dict[str, Any] = {}
    run_dir = raw(config, "run")
    if run_dir not in (None, ""):
        folder = Path(config.invocation_params.dir, str(run_dir)).resolve()
        try:
            hold_run_lock(config, folder, "run")
            overrides = session.run_overrides(folder)
        except ConfigError as exc:
            raise usage_error(exc, config) from None
    seed = None
    if (overrides.get("baseline") or raw(config, "baseline")) not in (None, "") and "seeds" not in overrides:
        seed = session_seed(config, raw(config, "seed"), handed)

    def get(name: str) -> Any:
        if name in overrides:
            return overrides[name]
        return seed if name == "seed" else raw(config, name)

    try:
        settings = build_settings(get, Path(config.invocation_params.dir), suffixes, listed=listed_shapes)
    except ConfigError as exc:
        raise usage_error(exc, config) from None
    if handed.get("kopt_outdir") and settings.active:
        outdir = Path(handed["kopt_outdir"])
        if not outdir.parent.is_dir():
            raise usage_error(ConfigError(
                f"--kopt-outdir {outdir}: this worker's host does not see the controller's folder {outdir.parent}, "
                "so the artifacts it writes (bench.json, ncu reports, correctness records) would be lost",
                fix="give --kopt-outdir a folder on a filesystem every host of --tx shares (the same absolute path)"))
        settings = dataclasses.replace(settings, outdir=outdir)
    if overrides.get("_run_dir"):
        dirs = {str(k): str(k.parent) for k in settings.kernels}
        return dataclasses.replace(settings, run_dir=Path(overrides["_run_dir"]), loop_mode="run",
                                   artifact_dirs=dirs, ncu_set=overrides.get("ncu_set"))
    if not settings.init or not settings.active:
        return settings
    assert settings.baseline is not None
    folder = Path(handed["kopt_run_dir"]) if "kopt_run_dir" in handed else state.new_run_dir(settings.baseline)
    try:
        hold_run_lock(config, folder, "init")
    except ConfigError as exc:
        raise usage_error(exc, config) from None
    return dataclasses.replace(settings, run_dir=folder, loop_mode="init",
                               artifact_dirs={str(settings.baseline): str(folder / "baseline")})
