"""The pytest adapter: options, collection of one item per gate, reporting and SKILL.md's exit codes.

Registered through the ``pytest11`` entry point ``kopt``. Gate logic lives in :mod:`pytest_kopt.gates`; this
module only collects, runs and reports. Nothing here imports torch or touches CUDA.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from . import __version__, gates, hardware
from .errors import Blocked, ConfigError, KoptError, NotApplicable
from .gates import GATE_ORDER, GATES, Context, Gate, case_label, correctness_cases
from .inputs import fresh_session_seed
from .settings import Settings, build_settings

SETTINGS_KEY = pytest.StashKey[Settings]()
ENV_KEY = pytest.StashKey[dict]()
KERNELS_KEY = pytest.StashKey[frozenset]()
#: CUDA_VISIBLE_DEVICES as it was before this process pinned itself to a GPU (restored at unconfigure)
VISIBLE_KEY = pytest.StashKey["str | None"]()
JSON_SCHEMA_VERSION = 1

#: (option name, help, metavar). Each has an ini twin ``kopt_<name>`` with the same help.
OPTIONS = (
    ("baseline", "Kernel to judge: a CUDA/CUTLASS .cu with extern \"C\" solve(), or a Triton .py", "PATH"),
    ("ref", "Reference file defining reference(**kwargs), optional atol/rtol/workload_model/shapes", "PATH"),
    ("dims", "Kernel dims as M=4096,N=4096,K=4096 or a JSON object", "DIMS"),
    ("candidate", "Another kernel to judge in the same session (repeatable)", "PATH"),
    ("seed", "Session seed the correctness seeds derive from: an integer, or 'last' (default: drawn now)", "N"),
    ("seeds", "Explicit correctness seeds, comma-separated (instead of --kopt-seed)", "SEEDS"),
    ("atol", "Absolute tolerance, overriding the reference's atol", "FLOAT"),
    ("rtol", "Relative tolerance, overriding the reference's rtol", "FLOAT"),
    ("arch", "nvcc/Triton target arch such as sm_90a (default: the detected GPU's, else sm_90a)", "ARCH"),
    ("json", "Write the session's JSON report to PATH ('-' for stdout)", "PATH"),
    ("outdir", "Folder for env.json, bench.json, ncu reports and SASS (default .kopt)", "DIR"),
    ("timeout", "Per-gate timeout of a kernel run in seconds (default 60)", "SECONDS"),
    ("ncu-timeout", "Timeout of one ncu profile in seconds (default 300)", "SECONDS"),
    ("timing", "Timing method: events (default; CUDA events around each call) or graph (20 L2-flush+call pairs "
               "in a CUDA graph minus a flush-only graph, for kernels of a few µs)", "METHOD"),
    ("rotating-memory", "Largest fraction of free GPU memory the timing gate's rotating input sets may take "
                        "(default 0.25; at least one set is always used)", "FRACTION"),
    ("sanitizer", "Run compute-sanitizer tools on one call: memcheck,racecheck,initcheck,synccheck", "TOOLS"),
    ("fail-slower", "PR gate: fail when a --kopt-candidate is confidently slower than the baseline by more than "
                    "this many percent (e.g. 3)", "PCT"),
    ("save", "Save every kernel's timing samples as a baseline NAME (pytest-benchmark's storage format)", "NAME"),
    ("compare", "Compare every kernel's timing with the newest saved baseline NAME of the same GPU model", "NAME"),
    ("storage", "Folder of saved baselines (default .benchmarks, pytest-benchmark's)", "DIR"),
    ("gpus", "GPUs to spread the session over with -n: all (default: the first GPU's model), CUDA ordinals such "
             "as 0,1, or UUIDs or their prefixes; each xdist worker is pinned to the one with the fewest workers "
             "through CUDA_VISIBLE_DEVICES (ignored without a GPU)", "LIST"),
    ("run", "Close the open iteration of this run directory (branches and ablations the agent wrote)", "DIR"),
    ("iterations", "Loop: maximum number of iterations for --kopt-init (default 3)", "N"),
    ("branches", "Loop: branch folders per iteration for --kopt-init (default 4)", "K"),
    ("ncu-num", "Loop: top ncu metrics kept per axis (default 5)", "N"),
    ("noise", "Loop: noise threshold in percent for improvement and attribution (default 2)", "PCT"),
    ("numerics-mode", "Loop: reference, strict or approximate (default reference)", "MODE"),
)
#: (flag, help): boolean options, each with an ini twin.
FLAGS = (
    ("init", "Create a run directory beside the baseline: all strict gates, baseline profile, iteration 1 opened"),
    ("finalize", "With --kopt-run: complete the run after this close and render summary.md"),
    ("fresh-process", "Run every GPU request in a fresh child process instead of one warm child per kernel "
                      "(slower: torch import and CUDA context per request)"),
)
SEED_CACHE_KEY = "kopt/session_seed"


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add the ``kopt`` option group: every ``--kopt-*`` flag with its ini twin."""
    group = parser.getgroup("kopt", "GPU kernel gates (pytest-kopt)")
    for name, help_text, metavar in OPTIONS:
        dest = "kopt_" + name.replace("-", "_")
        if name == "candidate":
            group.addoption(f"--kopt-{name}", dest=dest, action="append", default=None, metavar=metavar,
                            help=help_text)
            parser.addini(dest, help=help_text, type="paths", default=[])
            continue
        group.addoption(f"--kopt-{name}", dest=dest, default=None, metavar=metavar, help=help_text)
        parser.addini(dest, help=help_text, default=None)
    for name, help_text in FLAGS:
        dest = "kopt_" + name.replace("-", "_")
        group.addoption(f"--kopt-{name}", dest=dest, action="store_true", default=None, help=help_text)
        parser.addini(dest, help=help_text, type="bool", default=False)


def _session_seed(config: pytest.Config, given: Any) -> str | None:
    """The session seed as text: xdist workers take the controller's; ``last`` reads pytest's cache; nothing
    given draws a fresh one (unless ``--kopt-seeds`` lists the seeds). Raises UsageError for ``last`` without one."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and "kopt_session_seed" in workerinput:
        return workerinput["kopt_session_seed"]
    if given in (None, "") and (config.getoption("kopt_seeds") or config.getini("kopt_seeds")):
        return None
    cache = getattr(config, "cache", None)
    if given in (None, "") and config.getoption("lf", False) and cache is not None \
            and cache.get(SEED_CACHE_KEY, None) is not None:
        given = "last"  # --lf replays the failures of the last session: same seeds, same node ids
    if str(given).strip().lower() == "last":
        if cache is None:
            raise pytest.UsageError("pytest-kopt: --kopt-seed last needs pytest's cache (it is disabled: "
                                    "-p no:cacheprovider)\n  fix: pass --kopt-seed N")
        last = cache.get(SEED_CACHE_KEY, None) if cache is not None else None
        if last is None:
            raise pytest.UsageError("pytest-kopt: --kopt-seed last: no earlier session seed is recorded in the "
                                    "pytest cache\n  fix: run once without it, or pass --kopt-seed N")
        return str(last)
    if given in (None, ""):
        return str(fresh_session_seed())
    return str(given)


def _settings(config: pytest.Config) -> Settings:
    def raw(name: str) -> Any:
        dest = "kopt_" + name
        value = config.getoption(dest)
        if name == "candidate":
            return value or [str(p) for p in config.getini(dest)]
        return value if value is not None else config.getini(dest)

    overrides: dict[str, Any] = {}
    run_dir = raw("run")
    if run_dir not in (None, ""):
        from . import driver

        try:
            overrides = driver.run_overrides(Path(config.invocation_params.dir, str(run_dir)).resolve())
        except ConfigError as exc:
            raise pytest.UsageError(f"pytest-kopt: {exc.message}\n  fix: {exc.fix}") from None
    seed = None
    if (overrides.get("baseline") or raw("baseline")) not in (None, "") and "seeds" not in overrides:
        seed = _session_seed(config, raw("seed"))

    def get(name: str) -> Any:
        if name in overrides:
            return overrides[name]
        return seed if name == "seed" else raw(name)

    try:
        settings = build_settings(get, Path(config.invocation_params.dir))
    except ConfigError as exc:
        raise pytest.UsageError(f"pytest-kopt: {exc.message}\n  fix: {exc.fix}") from None
    return _loop_settings(config, settings, overrides)


def _loop_settings(config: pytest.Config, settings: Settings, overrides: dict[str, Any]) -> Settings:
    """Attach the loop mode, run directory and artifact folders. --kopt-init's run folder is made by the
    controller and handed to xdist workers, so every process writes into the same one."""
    import dataclasses

    from . import loop

    if overrides.get("_run_dir"):
        run_dir = Path(overrides["_run_dir"])
        dirs = {str(k): str(k.parent) for k in settings.kernels}
        return dataclasses.replace(settings, run_dir=run_dir, loop_mode="run", artifact_dirs=dirs)
    init = config.getoption("kopt_init") or config.getini("kopt_init")
    if not init or not settings.active:
        return settings
    assert settings.baseline is not None
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and "kopt_run_dir" in workerinput:
        run_dir = Path(workerinput["kopt_run_dir"])
    else:
        run_dir = loop.new_run_dir(settings.baseline)
    return dataclasses.replace(settings, run_dir=run_dir, loop_mode="init",
                               artifact_dirs={str(settings.baseline): str(run_dir / "baseline")})


def pytest_configure(config: pytest.Config) -> None:
    """Parse settings once, register markers, aim collection at the kernel, detect the hardware (controller only;
    workers receive it through ``workerinput``)."""
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU; skipped with the reason when none is visible")
    config.addinivalue_line("markers", "kopt(gate): a pytest-kopt gate item")
    settings = _settings(config)
    config.stash[SETTINGS_KEY] = settings
    if not settings.active:
        return
    assert settings.baseline is not None
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        config.args = [str(k) for k in settings.kernels]
    else:
        for kernel in settings.kernels:
            if not any(Path(a.split("::")[0]).resolve() == kernel for a in config.args):
                config.args.append(str(kernel))
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and "kopt_env" in workerinput:
        config.stash[ENV_KEY] = _worker_env(workerinput)
        if config.stash[ENV_KEY].get("pinned"):
            config.stash[VISIBLE_KEY] = before
        if "kopt_key" in workerinput:
            gates.use_session_key(workerinput["kopt_key"])
        return
    config.stash[ENV_KEY] = _controller_env(config)
    if config.stash[ENV_KEY].get("pinned"):
        config.stash[VISIBLE_KEY] = before
    if settings.loop_mode == "init":
        _init_run(config, settings)
    cache = getattr(config, "cache", None)
    if settings.session_seed is not None and cache is not None:
        cache.set(SEED_CACHE_KEY, settings.session_seed)
    if config.getoption("dist", "no") == "load":
        # one kernel's items go to one worker, in gate order (loadgroup reorders them); kernels still compile in
        # parallel on different workers, and the per-GPU lock keeps GPU work one child at a time
        config.option.dist = "loadscope"
    config.pluginmanager.register(KoptController(config), "kopt-controller")


def _controller_env(config: pytest.Config) -> dict[str, Any]:
    """Detect the hardware and choose the session's GPUs (``--kopt-gpus``). When the session pins GPUs (several
    used, or the option given), this process is pinned to the first one: the loop's decisions (re-timing, the
    champion's profile) run there. Raises UsageError for a bad ``--kopt-gpus``."""
    from . import gpus

    env = hardware.detect()
    spec = config.getoption("kopt_gpus") or config.getini("kopt_gpus")
    try:
        chosen = gpus.select(env, spec)
    except ConfigError as exc:
        raise pytest.UsageError(f"pytest-kopt: {exc.message}\n  fix: {exc.fix}") from None
    if not gpus.should_pin(chosen, spec):
        return env
    os.environ["CUDA_VISIBLE_DEVICES"] = chosen[0]["uuid"]
    return gpus.pinned({**env, "gpus": chosen}, chosen[0])


def _worker_env(workerinput: dict[str, Any]) -> dict[str, Any]:
    """An xdist worker's environment: the controller's, pinned to the worker's GPU when the session pins (its
    ``CUDA_VISIBLE_DEVICES`` set, so every child it starts uses that GPU). A worker on another host (an ``ssh``
    or ``socket`` gateway of ``--tx``) detects its own GPUs instead, since the controller's UUIDs name none there."""
    from . import gpus

    env = workerinput["kopt_env"]
    if workerinput.get("kopt_detect_here"):
        env = hardware.detect()
        own = gpus.select(env, None)
        gpu = gpus.worker_gpu(own, workerinput.get("workerid", ""))
        if gpu is None or len(own) < 2:
            return env
        env = gpus.pinned({**env, "gpus": own}, gpu)
    elif env.get("pinned") and workerinput.get("kopt_gpu"):
        env = gpus.pinned(env, workerinput["kopt_gpu"])
    if env.get("pinned"):
        os.environ["CUDA_VISIBLE_DEVICES"] = env["gpu"]["uuid"]
    return env


def _int_option(config: pytest.Config, name: str, default: float) -> float:
    value = config.getoption(f"kopt_{name.replace('-', '_')}") or config.getini(f"kopt_{name.replace('-', '_')}")
    if value in (None, ""):
        return default
    try:
        number = float(value)
    except ValueError:
        raise pytest.UsageError(f"pytest-kopt: --kopt-{name}: {value!r} is not a number\n  fix: e.g. "
                                f"--kopt-{name} {default:g}") from None
    if not math.isfinite(number) or number <= 0 and name != "noise" or number < 0:
        raise pytest.UsageError(f"pytest-kopt: --kopt-{name}: {value!r} must be a positive number")
    if name == "noise" and number >= 100:
        raise pytest.UsageError(f"pytest-kopt: --kopt-noise: {value!r} percent leaves no improvement possible "
                                "(a new best must be faster than best x (1 - noise/100))\n  fix: e.g. --kopt-noise 2")
    return number


def _init_run(config: pytest.Config, settings: Settings) -> None:
    """--kopt-init, controller side: create the run folder and state.json before any gate writes into it."""
    from . import loop

    assert settings.run_dir is not None and settings.baseline is not None and settings.ref is not None
    mode = config.getoption("kopt_numerics_mode") or config.getini("kopt_numerics_mode") or "reference"
    if mode not in ("reference", "strict", "approximate"):
        raise pytest.UsageError(f"pytest-kopt: --kopt-numerics-mode: {mode!r}\n  fix: reference, strict or approximate")
    loop.init_state(settings.run_dir, settings.baseline, settings.ref, settings.dims,
                    iterations=int(_int_option(config, "iterations", 3)),
                    branches=int(_int_option(config, "branches", 4)), ncu_num=int(_int_option(config, "ncu-num", 5)),
                    noise_pct=_int_option(config, "noise", 2.0), numerics_mode=mode, seeds=list(settings.seeds),
                    env=config.stash[ENV_KEY])


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    """The detected GPU and tools, one line."""
    if ENV_KEY not in config.stash:
        return None
    settings = config.stash[SETTINGS_KEY]
    if settings.session_seed is not None:
        seeds = f"kopt seed: {settings.session_seed} (replay: --kopt-seed {settings.session_seed})"
    else:
        seeds = f"kopt seeds: {','.join(map(str, settings.seeds))}"
    return [hardware.header_line(config.stash[ENV_KEY]), seeds]


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    """Collect the ``--kopt-baseline`` file as a :class:`KoptFile`."""
    if file_path.suffix in (".cu", ".py") and file_path.resolve() in _kernel_set(parent.config):
        return KoptFile.from_parent(parent, path=file_path)
    return None


def _kernel_set(config: pytest.Config) -> frozenset[Path]:
    """The session's kernel paths, computed once (pytest asks for every file of every argument's folder)."""
    if KERNELS_KEY not in config.stash:
        settings = config.stash.get(SETTINGS_KEY, None)
        config.stash[KERNELS_KEY] = frozenset(settings.kernels) if settings is not None and settings.active \
            else frozenset()
    return config.stash[KERNELS_KEY]


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    """A Triton/Python kernel given to kopt is not a test module: keep pytest's python plugin from importing it
    (that would import torch/triton into the pytest process and collect its functions)."""
    if module_path.resolve() in _kernel_set(parent.config):
        return _NotATestModule.from_parent(parent, path=module_path)
    return None


class _NotATestModule(pytest.File):
    """Stands in for the python plugin's Module of a kernel file; collects nothing (KoptFile has the items)."""

    def collect(self) -> list[pytest.Item]:
        """Nothing: the kernel's items come from :class:`KoptFile`."""
        return []


def context(config: pytest.Config, kernel: Path, nodeid: str) -> Context:
    """The gate context of one kernel file, from the session's settings and environment."""
    settings = config.stash[SETTINGS_KEY]
    assert settings.ref is not None
    cache = getattr(config, "cache", None)  # absent under -p no:cacheprovider
    cache_dir = cache.mkdir("kopt") if cache is not None else config.rootpath / ".pytest_cache" / "d" / "kopt"
    return Context(settings=settings, env=config.stash[ENV_KEY], kernel=Path(kernel).resolve(), ref=settings.ref,
                   display=nodeid.split("::")[0], cache_dir=Path(cache_dir))


class KoptFile(pytest.File):
    """A kernel file: yields one :class:`KoptItem` per gate of :data:`~pytest_kopt.gates.GATES`."""

    def collect(self) -> Iterator[pytest.Item]:
        """Items in gate order; ``correctness`` once per seed (``correctness[seed=7]``)."""
        settings = self.config.stash[SETTINGS_KEY]
        ctx = context(self.config, self.path, self.nodeid)
        for gate in GATES:
            if settings.loop_mode == "run" and gate.name in ("ncu", "roofline"):
                continue  # profiled once, for the champion, when the session closes the iteration
            if gate.name == "correctness":
                params: list[Any] = [(c, f"[{case_label(c)}]") for c in correctness_cases(ctx)]
            elif gate.name == "sanitizer":
                params = [(t, f"[{t}]") for t in settings.sanitizer]
            else:
                params = [(None, "")]
            for param, suffix in params:
                item = KoptItem.from_parent(self, name=gate.name + suffix, gate=gate, param=param)
                item.add_marker(pytest.mark.kopt(gate.name))
                if gate.serial and (gate.name != "correctness" or ctx.kind == "cuda"):
                    item.add_marker(pytest.mark.gpu)
                yield item


class KoptItem(pytest.Item):
    """One gate run on one kernel; delegates to the gate function and renders its errors."""

    def __init__(self, *, gate: Gate, param: Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.gate = gate
        self.param = param

    def runtest(self) -> None:
        """Run the gate; a Blocked prerequisite becomes a skip naming the gate that blocked it."""
        self.user_properties.append(("kopt_gate", self.gate.name))
        try:
            outcome = self.gate.fn(context(self.config, self.path, self.nodeid), self.param)
        except NotApplicable as exc:
            self.user_properties.append(("kopt_status", "NOT_APPLICABLE"))
            pytest.skip(f"not applicable: {exc}")
        except Blocked as exc:
            self.user_properties.append(("kopt_status", "SKIPPED"))
            pytest.skip(str(exc))
        except KoptError as exc:
            if not exc.gate:
                exc.gate = self.gate.name
            self.user_properties += [("kopt_status", exc.status), ("kopt_exit_code", exc.exit_code),
                                     ("kopt_message", exc.message)]
            raise
        self.user_properties.append(("kopt_status", "PASSED"))
        self.user_properties += [(k, v) for k, v in outcome.figures.items() if isinstance(v, (int, float, str, bool))]
        if outcome.summary:
            self.user_properties.append(("kopt_summary", outcome.summary))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        """Gate errors as their own text (file:line, message, details, fix); anything else as a traceback."""
        if isinstance(excinfo.value, KoptError):
            return excinfo.value.render()
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[Path, int, str]:
        """Location shown by pytest: the kernel file and the gate name."""
        return self.path, 0, f"kopt {self.name}"


def _finite(x: Any) -> Any:
    """The report with NaN/inf floats as null: JSON has no such numbers (strict parsers reject them)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


class KoptController:
    """Session-level bookkeeping that exists only on the controller (or the single process without xdist):
    hands the detected environment to xdist workers, collects every item's report, sets SKILL.md's exit code,
    prints the summary and writes ``--kopt-json``."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.records: list[dict[str, Any]] = []
        self.stdout_doc: str | None = None
        self.loop_result: dict[str, Any] | None = None
        self.json_error: str | None = None
        self.comparisons: list[dict[str, Any]] = []
        #: GPU UUID -> ids of the live xdist workers pinned to it
        self.gpu_workers: dict[str, set[str]] = {}

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """xdist: a worker ended (or crashed): its GPU has one worker less for the next one started."""
        wid = getattr(node, "workerinput", {}).get("workerid")
        for ids in self.gpu_workers.values():
            ids.discard(wid)

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        """xdist: give each worker the detected environment, its GPU when the session pins (the one with the
        fewest live workers), the session seed and the MAC key of cached results (builtins only), so workers never
        probe CUDA themselves, collect the same items and trust each other's reference outputs and correctness
        records. A worker on another host (a gateway that is not ``popen``) detects its own GPUs."""
        env = self.config.stash[ENV_KEY]
        node.workerinput["kopt_env"] = env
        if not getattr(getattr(node.gateway, "spec", None), "popen", True):
            node.workerinput["kopt_detect_here"] = True  # another host: its GPUs are not the controller's
        elif env.get("pinned"):
            from . import gpus

            gpu = gpus.least_loaded(env["gpus"], {u: len(ids) for u, ids in self.gpu_workers.items()})
            if gpu is not None:
                node.workerinput["kopt_gpu"] = gpu
                self.gpu_workers.setdefault(gpu["uuid"], set()).add(node.workerinput["workerid"])
        node.workerinput["kopt_key"] = gates.session_key()
        if self.config.stash[SETTINGS_KEY].run_dir is not None:
            node.workerinput["kopt_run_dir"] = str(self.config.stash[SETTINGS_KEY].run_dir)
        seed = self.config.stash[SETTINGS_KEY].session_seed
        if seed is not None:
            node.workerinput["kopt_session_seed"] = str(seed)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Keep one record per kopt item: the call report, or the setup report when it skipped or failed there."""
        props = dict(report.user_properties)
        if "kopt" not in report.keywords:
            return
        if report.when != "call" and not (report.when == "setup" and not report.passed):
            return
        props.setdefault("kopt_gate", report.nodeid.split("::")[-1].split("[")[0])
        message = None
        if report.skipped and isinstance(report.longrepr, tuple):
            message = report.longrepr[2].removeprefix("Skipped: ")
        elif report.failed:
            message = props.get("kopt_message") or str(report.longrepr).splitlines()[-1][:500]
        self.records.append({"nodeid": report.nodeid, "gate": props.get("kopt_gate"), "outcome": report.outcome,
                             "status": props.get("kopt_status", "SKIPPED" if report.skipped else
                                                 ("ERROR" if report.failed else "PASSED")),
                             "exit_code": props.get("kopt_exit_code"), "duration_s": round(report.duration, 4),
                             "summary": props.get("kopt_summary"), "message": message,
                             "figures": {k: v for k, v in props.items() if not k.startswith("kopt_")}})

    def exit_code(self) -> int | None:
        """SKILL.md's code of the earliest failing gate in table order (2, 3 or 4), or None when none failed."""
        failed = [r for r in self.records if r["outcome"] == "failed" and r["exit_code"] is not None]
        if not failed:
            return None
        first = min(failed, key=lambda r: GATE_ORDER.get(r["gate"] or "", 99))
        return int(first["exit_code"])

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        """Map pytest's "tests failed" (1) to SKILL.md's code when every failure is a gate's; write the JSON."""
        settings = self.config.stash[SETTINGS_KEY]
        pytest_status = session.exitstatus
        code = self.exit_code()
        other_failures = any(r["outcome"] == "failed" and r["exit_code"] is None for r in self.records)
        if code is not None and pytest_status == pytest.ExitCode.TESTS_FAILED and not other_failures:
            session.exitstatus = code
        # pytest's own "interrupted" (2) and "internal error" (3) share numbers with SKILL.md's codes: decide on the
        # status pytest itself reported, before any mapping
        if settings.loop_mode is not None and pytest_status in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
            self.loop_result = self._finish_loop(settings)
            if self.loop_result["exit_code"] and session.exitstatus in (0, code):
                session.exitstatus = code if code is not None else self.loop_result["exit_code"]
        self.comparisons = self._pr_gate(settings) + self._saved_baselines(settings)
        if any(c.get("fails") for c in self.comparisons) and session.exitstatus == 0:
            session.exitstatus = 2  # SKILL.md's kernel-validation code: the candidate regressed
        if settings.json_path:
            doc = {"schema_version": JSON_SCHEMA_VERSION, "tool": "pytest-kopt", "version": __version__,
                   "exit_code": int(session.exitstatus), "kernel": str(settings.baseline), "ref": str(settings.ref),
                   "dims": settings.dims, "seeds": list(settings.seeds), "env": self.config.stash[ENV_KEY],
                   "outdir": str(settings.outdir), "items": self.records,
                   "comparisons": self.comparisons,
                   "loop": {**self.loop_result, "run_dir": str(settings.run_dir), "mode": settings.loop_mode}
                   if self.loop_result else None}
            doc = _finite(doc)
            if settings.json_path == "-":
                self.stdout_doc = json.dumps(doc, default=str, allow_nan=False)  # printed last, in unconfigure
            else:
                text = json.dumps(doc, indent=2, default=str, allow_nan=False)
                try:
                    Path(settings.json_path).parent.mkdir(parents=True, exist_ok=True)
                    Path(settings.json_path).write_text(text + "\n")
                except OSError as exc:
                    self.json_error = f"--kopt-json: could not write {settings.json_path}: {exc}"

    def _per_kernel(self, tr: Any, rows: list[dict[str, Any]]) -> None:
        """``-q``: one line per kernel: its verdict (the first failing gate's status, else PASSED with the number of
        skipped gates), the timing median and the speedup over the reference."""
        by: dict[str, list[dict[str, Any]]] = {}
        for r in rows:
            by.setdefault(r["nodeid"].split("::")[0], []).append(r)
        width = max(len(k) for k in by)
        for kernel, recs in by.items():
            failed = [r for r in recs if r["outcome"] == "failed"]
            skipped = sum(r["outcome"] == "skipped" for r in recs)
            checked = any(r["gate"] == "correctness" and r["outcome"] == "passed" for r in recs)
            note = f"{skipped} skipped" + ("" if checked else "; output not checked")
            status = f"{failed[0]['status']} at {failed[0]['gate']}" if failed else \
                "PASSED" + (f" ({note})" if skipped else "")
            timing = next((r["figures"] for r in recs if r["gate"] == "timing" and r["outcome"] == "passed"), {})
            fig = f"  {timing['median_ms']:.4g} ms, {timing['speedup_vs_ref']:.2f}x ref" if timing else ""
            tr.write_line(f"{kernel:<{width}}  {status}{fig}"[:200])

    def _pr_gate(self, settings: Settings) -> list[dict[str, Any]]:
        """--kopt-fail-slower: each candidate's timing samples against the baseline's (see
        :func:`pytest_kopt.prgate.verdict`). A candidate without valid timing (it failed a gate, or no GPU) gets
        verdict NOT_TIMED and the gate's own failure decides."""
        from . import prgate

        value = self.config.getoption("kopt_fail_slower") or self.config.getini("kopt_fail_slower")
        if value in (None, "") or not settings.candidates or settings.baseline is None:
            return []
        threshold = float(str(value).rstrip("%"))

        samples = self._timed_samples
        base = samples(settings.baseline)
        out = []
        for cand in settings.candidates:
            cs = samples(cand)
            entry: dict[str, Any] = {"baseline": str(settings.baseline), "candidate": str(cand)}
            # the baseline timed in the candidate's own rounds (interleaved), else the baseline's timing gate
            paired = self._paired_baseline(cand, settings.baseline)
            if cs is None or (paired is None and base is None):
                entry.update(verdict="NOT_TIMED", fails=False)
            else:
                entry.update(prgate.verdict(paired or base, cs, threshold), interleaved=paired is not None)
            out.append(entry)
        return out

    def _paired_baseline(self, kernel: Path, baseline: Path | None) -> list[float] | None:
        """The baseline's samples (ms) timed in ``kernel``'s timing rounds (``pr_baseline`` in its bench.json)."""
        path = context(self.config, kernel, str(kernel)).outdir / "bench.json"
        if baseline is None or not path.is_file():
            return None
        pr = json.loads(path.read_text()).get("pr_baseline") or {}
        same = pr.get("kernel") and Path(pr["kernel"]).resolve() == Path(baseline).resolve()
        return pr.get("samples_ms") if same and pr.get("samples_ms") else None

    def _timed_samples(self, kernel: Path) -> list[float] | None:
        """A kernel's timing samples (ms) from this session's bench.json, None when its timing is not valid."""
        path = context(self.config, kernel, str(kernel)).outdir / "bench.json"
        if not path.is_file():
            return None
        bench = json.loads(path.read_text())
        return bench["samples_ms"] if bench.get("timing_valid") else None

    def _saved_baselines(self, settings: Settings) -> list[dict[str, Any]]:
        """--kopt-save / --kopt-compare through pytest-benchmark's storage, keyed by GPU model."""
        name_save = self.config.getoption("kopt_save") or self.config.getini("kopt_save")
        name_cmp = self.config.getoption("kopt_compare") or self.config.getini("kopt_compare")
        if not name_save and not name_cmp:
            return []
        env = self.config.stash[ENV_KEY]
        gpu = (env.get("gpu") or {}).get("name")
        if not gpu:
            self.json_error = "--kopt-save/--kopt-compare: no GPU, nothing was timed"
            return []
        try:
            from . import saved
        except ImportError:  # pragma: no cover - pytest-benchmark is the optional [benchmark] extra
            self.json_error = "--kopt-save/--kopt-compare need pytest-benchmark: pip install pytest-benchmark"
            return []
        from . import prgate

        storage = Path(self.config.invocation_params.dir,
                       self.config.getoption("kopt_storage") or self.config.getini("kopt_storage") or ".benchmarks")
        current = {settings.label(k): s for k in settings.kernels if (s := self._timed_samples(k))}
        out: list[dict[str, Any]] = []
        if name_cmp:
            old = saved.load_latest(storage, name_cmp, gpu)
            value = self.config.getoption("kopt_fail_slower") or self.config.getini("kopt_fail_slower")
            threshold = float(str(value).rstrip("%")) if value not in (None, "") else 3.0
            for label, samples in current.items():
                entry: dict[str, Any] = {"baseline": f"saved:{name_cmp}:{label}", "candidate": label}
                if not old or label not in old or not old[label]:
                    entry.update(verdict="NOT_SAVED", fails=False)
                else:
                    entry.update(prgate.verdict(old[label], samples, threshold))
                    entry["fails"] = entry["fails"] and value not in (None, "")
                out.append(entry)
        if name_save and current:
            entries = [saved.benchmark_entry(label, s, {"dims": settings.dims, "gpu": gpu})
                       for label, s in current.items()]
            saved.save(storage, name_save, gpu, entries, {"gpu": gpu, "driver": env.get("driver_version"),
                                                           "packages": env.get("packages")})
        return out

    def _finish_loop(self, settings: Settings) -> dict[str, Any]:
        """--kopt-init: stop the run or open iteration 1; --kopt-run: close the open iteration."""
        from . import driver

        assert settings.run_dir is not None
        rootpath = self.config.rootpath

        def ctx_for(kernel: Path) -> Context:
            return context(self.config, kernel, str(kernel))

        if settings.loop_mode == "init":
            assert settings.baseline is not None
            return driver.finish_init(settings.run_dir, ctx_for(settings.baseline), self.records, rootpath)
        finalize = bool(self.config.getoption("kopt_finalize") or self.config.getini("kopt_finalize"))
        return driver.finish_run(settings.run_dir, ctx_for, self.records, rootpath, finalize)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        """``--kopt-json -``: the document as the very last line of stdout (one line: ``tail -n 1`` reads it)."""
        if self.stdout_doc is not None:
            sys.stdout.write("\n" + self.stdout_doc + "\n")
            sys.stdout.flush()

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        """One line per gate item: outcome and its key figures (or the reason it skipped/failed)."""
        if not self.records:
            return
        tr = terminalreporter
        tr.section("kopt gates")
        order = {r["nodeid"]: i for i, r in enumerate(self.records)}
        rows = sorted(self.records, key=lambda r: (r["nodeid"].split("::")[0], GATE_ORDER.get(r["gate"] or "", 99),
                                                   order[r["nodeid"]]))
        kernels = {r["nodeid"].split("::")[0] for r in rows}
        if self.config.get_verbosity() < 0:
            self._per_kernel(tr, rows)
            rows = []
        width = max((len(r["nodeid"] if len(kernels) > 1 else r["nodeid"].split("::", 1)[-1]) for r in rows),
                    default=0)
        for r in rows:
            name = r["nodeid"] if len(kernels) > 1 else r["nodeid"].split("::", 1)[-1]
            text = r["summary"] if r["outcome"] == "passed" else (r["message"] or "")
            line = f"{name:<{width}} {r['status']:<20} {text}"
            tr.write_line(line if len(line) <= 400 else line[:399] + "…")
        per_gate: dict[str, list[float]] = {}
        for r in self.records:
            per_gate.setdefault(r["gate"] or "?", []).append(r["duration_s"])
        tr.write_line("kopt item time per gate: " + ", ".join(
            f"{g} {sum(d):.1f} s" + (f" ({len(d)})" if len(d) > 1 else "")
            for g, d in sorted(per_gate.items(), key=lambda kv: GATE_ORDER.get(kv[0], 99))))
        for c in self.comparisons:
            if c["verdict"] in ("NOT_TIMED", "NOT_SAVED"):
                what = "not timed (see its gates)" if c["verdict"] == "NOT_TIMED" else f"no {c['baseline']} saved"
                tr.write_line(f"kopt PR gate: {c['candidate']} {what}")
            else:
                lo, hi = c["ci95"]
                tr.write_line(f"kopt PR gate: {c['candidate']} vs {c['baseline']}: {c['verdict']}, speedup "
                              f"{c['speedup']:.3f}x [{lo:.3f}, {hi:.3f}] (threshold {c['threshold_pct']:g}%)",
                              red=c["fails"], green=c["verdict"] == "FASTER")
        if self.loop_result is not None:
            tr.write_line(f"kopt loop: {self.loop_result['message']}")
        if self.json_error:
            tr.write_line(f"kopt: {self.json_error}", red=True)
        code = self.exit_code()
        if code is None and self.loop_result is not None and self.loop_result["exit_code"]:
            code = self.loop_result["exit_code"]
        if code is not None:
            tr.write_line(f"kopt exit code: {code} (SKILL.md: 2 kernel validation, 3 hardware/tool/ncu, "
                          f"4 configuration/contract)")


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """End this process's warm harness children (pytest_kopt.runner.HarnessServer); atexit would too, later."""
    from .runner import shutdown_servers

    shutdown_servers()


def pytest_unconfigure(config: pytest.Config) -> None:
    """Give CUDA_VISIBLE_DEVICES back as it was, when this process pinned itself to a GPU (an in-process pytest
    run, such as pytester's ``runpytest()``, must not leave its pin to the caller)."""
    if VISIBLE_KEY not in config.stash:
        return
    before = config.stash[VISIBLE_KEY]
    if before is None:
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = before
