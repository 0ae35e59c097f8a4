"""The plugin's settings: parsed once from the ``--kopt-*`` options (or their ini twins) into a frozen dataclass.

Parsing is plain Python; it raises :class:`~pytest_kopt.errors.ConfigError` naming the option and the fix, which
the pytest layer turns into ``pytest.UsageError``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from . import defaults
from .errors import ConfigError
from .seeds import SEED_COUNT, derive_seeds

DEFAULT_SEEDS = defaults.SEEDS
#: Arch used when no GPU is visible (:data:`pytest_kopt.defaults.ARCH`).
DEFAULT_ARCH = defaults.ARCH
DEFAULT_GATE_TIMEOUT_S = 60.0
DEFAULT_NCU_TIMEOUT_S = 300.0
TIMING_METHODS = ("cupti", "events", "graph")
NUMERICS_MODES = defaults.NUMERICS_MODES
SANITIZER_TOOLS = ("memcheck", "racecheck", "initcheck", "synccheck")
#: KernelBench's precisions (``--kopt-precision``; :data:`pytest_kopt.child.kernelbench.TOLERANCE` their tolerances)
PRECISIONS = ("fp32", "fp16", "bf16")

#: Compute capabilities nvcc 12-13 knows (``nvcc --list-gpu-arch``, CUDA 13.0).
KNOWN_SM = {50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 88, 89, 90, 100, 101, 103, 110, 120, 121}
_ARCH_RE = re.compile(r"^sm_(\d{2,3})([af]?)$")
#: A dim's int value is below this in magnitude: solve() and the launchers take it as a 64-bit integer.
INT64_LIMIT = 2 ** 63
#: A dim's name: a Python identifier (``M``, ``eps``, ``block_size``).
NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True, slots=True)
class Settings:
    """Validated settings of one session.

    ``dims`` maps each kernel scalar (``M``, ``N``, ``eps``...) to an int or float; ``seeds`` are the correctness
    seeds, derived from ``session_seed`` unless ``--kopt-seeds`` listed them (then ``session_seed`` is None);
    ``candidates`` are further kernels judged in the same session; ``sanitizer`` lists compute-sanitizer tools; ``atol``/``rtol`` override the reference's values when not None; ``arch`` is an nvcc arch like
    ``sm_90a`` or None (take the detected GPU's); timeouts are in seconds.
    """

    baseline: Path | None = None
    ref: Path | None = None
    dims: dict[str, Any] = field(default_factory=dict)
    #: every test shape (dims of each, the first is ``dims``): ``--kopt-dims`` repeated, or ref.py's ``dims`` list
    shapes: tuple[dict[str, Any], ...] = ()
    seeds: tuple[int, ...] = DEFAULT_SEEDS
    atol: float | None = None
    rtol: float | None = None
    arch: str | None = None
    json_path: str | None = None
    outdir: Path = Path(".kopt")
    #: The folder pytest was started in: relative paths and artifact folders are taken from it.
    invocation_dir: Path = Path(".")
    gate_timeout_s: float = DEFAULT_GATE_TIMEOUT_S
    ncu_timeout_s: float = DEFAULT_NCU_TIMEOUT_S
    candidates: tuple[Path, ...] = ()
    session_seed: int | None = None
    sanitizer: tuple[str, ...] = ()
    #: Loop mode (``--kopt-init`` / ``--kopt-run``): kernel path -> its artifact folder inside the run directory; a
    #: close's context adds a run kernel the session does not judge (:func:`pytest_kopt.plugin.stash.with_run_kernel`).
    artifact_dirs: dict[str, str] = field(default_factory=dict)
    run_dir: Path | None = None
    loop_mode: str | None = None
    #: True: every GPU request in a fresh child process; False (default): one warm child per kernel and one per
    #: reference file serve a kernel's correctness and timing requests (pytest_kopt.runner.HarnessServer).
    fresh_process: bool = False
    #: True (default): warm harness processes are forked from one process per pytest process that imported torch
    #: once (:mod:`pytest_kopt.proc.forkserver`); False (``--kopt-no-fork-server``): each starts a new Python.
    fork_server: bool = True
    #: Timing method: ``cupti`` (the kernels' own span from CUPTI activity records, with one CUDA event pair per call
    #: beside it; events when the profiler gives no records), ``events`` (one CUDA event pair per call) or
    #: ``graph`` (N flush+call pairs in a CUDA graph minus a flush-only graph; for kernels of a few µs).
    timing_method: str = "cupti"
    #: Largest fraction of the GPU's free memory the timing gate's rotating input sets may take (0 < f <= 0.9).
    rotating_memory: float = 0.25
    #: PR gate (``--kopt-fail-slower PCT``): the slowdown threshold in percent, None when not asked for; each
    #: candidate's timing gate then also times the baseline, round by round.
    fail_slower_pct: float | None = None
    #: ``--kopt-save`` / ``--kopt-compare``: names of saved timing baselines, and their folder (``--kopt-storage``).
    save: str | None = None
    compare: str | None = None
    storage: Path = Path(".benchmarks")
    #: ``--kopt-gpus`` as given (None: all GPUs of the first one's model); see :func:`pytest_kopt.gates.gpus.select`.
    gpus: str | None = None
    #: Loop (SKILL.md's inputs): ``--kopt-init`` seeds a run; ``--kopt-run`` closes one (``run_dir`` and
    #: ``loop_mode`` are set then); the rest configure a run made by ``--kopt-init``.
    init: bool = False
    finalize: bool = False
    iterations: int = defaults.ITERATIONS
    branches: int = defaults.BRANCHES
    ncu_num: int = defaults.NCU_NUM
    #: ``--kopt-run``: the run's ncu metric bundle (``state.json`` ``ncu_set``, chosen by the baseline's profile);
    #: every later profile uses it (SKILL.md 3g). None: the adaptive choice of :func:`pytest_kopt.gates.ncu.choose_set`.
    ncu_set: str | None = None
    noise_pct: float = defaults.NOISE_PCT
    numerics_mode: str = defaults.NUMERICS_MODE
    #: ``--kopt-precision``: a KernelBench problem's precision (``fp32``, ``fp16``, ``bf16``: its inputs and both
    #: models cast, KernelBench's tolerance for it); None: fp32, as KernelBench's default
    precision: str | None = None
    #: ``--kopt-compile-jobs``: ``auto`` (SKILL.md's default) or the most nvcc builds at once
    #: (:mod:`pytest_kopt.compile_jobs`)
    compile_jobs: str | int = defaults.COMPILE_JOBS
    #: ``--kopt-edge-shapes``: ``auto`` (correctness also at edge shapes derived from the dims,
    #: :mod:`pytest_kopt.gates.edges`) or ``off`` (the given dims and ``extra_dims`` only)
    edge_shapes: str = "auto"

    @property
    def pr_gate(self) -> bool:
        """True when the session compares candidates with the baseline (``--kopt-fail-slower`` and candidates)."""
        return self.fail_slower_pct is not None and bool(self.candidates)

    @property
    def kernels(self) -> tuple[Path, ...]:
        """The baseline, then every ``--kopt-candidate``, without repeats."""
        return tuple(dict.fromkeys(((self.baseline,) if self.baseline else ()) + self.candidates))

    def artifact_dir(self, kernel: Path) -> Path:
        """Where a kernel's artifacts go: its folder in ``artifact_dirs`` (in loop mode, a run kernel's own folder,
        ``iterv<i>/branches/b<k>/``; one this session does not judge is added by the session's contexts and
        :meth:`pytest_kopt.plugin.stash.SessionState.artifact_dir`, so read a run kernel's records through those), else
        ``<outdir>/<path>/`` where
        ``<path>`` is the kernel's path relative to the invocation folder (``.kopt/examples/gemm/gemm.cu/``), so two
        kernels never share a folder, in one session or across sessions; a kernel outside the invocation folder
        goes to ``<outdir>/_external/<hash of its folder>/<name>/``."""
        if str(kernel) in self.artifact_dirs:
            return Path(self.artifact_dirs[str(kernel)])
        kernel = Path(kernel)
        try:
            rel = kernel.relative_to(self.invocation_dir)
        except ValueError:
            digest = hashlib.sha256(str(kernel.parent).encode()).hexdigest()[:10]
            rel = Path("_external") / digest / kernel.name
        return self.outdir / rel

    def label(self, kernel: Path) -> str:
        """A kernel's short name in reports and saved baselines: its stem, or ``<parent>_<stem>`` when two kernels of
        the session share a stem."""
        same = [k for k in self.kernels if k.stem == kernel.stem]
        return kernel.stem if len(same) < 2 else f"{kernel.parent.name}_{kernel.stem}"

    @property
    def active(self) -> bool:
        """True when a baseline kernel was given, i.e. the plugin has something to collect."""
        return self.baseline is not None


def parse_dims(text: str, source: str = "--kopt-dims") -> dict[str, Any]:
    """Parse ``M=4096,N=4096`` or a JSON object ``{"M": 4096}`` into ``{name: value}``: an int or float; a list of
    ints for a tuple size (``input_shape=3x64x64``, or a JSON list); a string, quoted (``case="dense"``) or a JSON
    string.

    Raises ConfigError (naming ``source``) on an empty name, a duplicate, a value of none of these kinds or bad
    JSON.
    """
    text = text.strip()
    if not text:
        return {}
    raw: dict[str, Any]
    from_json = text.startswith("{")
    if from_json:
        def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
            # json.loads keeps the last of a repeated key silently; a dim given twice is a mistake
            obj: dict[str, Any] = {}
            for key, value in pairs:
                if key in obj:
                    raise ConfigError(f"{source}: dim {key!r} given twice", fix="give each dim once")
                obj[key] = value
            return obj
        try:
            raw = json.loads(text, object_pairs_hook=no_duplicates)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{source}: not valid JSON ({exc.msg} at column {exc.colno})",
                              fix='write it as M=4096,N=4096 or as a JSON object like {"M": 4096}') from None
        except ValueError as exc:  # an int past Python's digit limit
            raise ConfigError(f"{source}: {exc}", fix=_FIT_FIX) from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{source}: JSON must be an object of name: number", fix='e.g. {"M": 4096}')
    else:
        raw = {}
        for part in text.split(","):
            part = part.strip()
            if not part:
                continue
            name, sep, value = part.partition("=")
            name = name.strip().lstrip("-")
            if not sep:
                raise ConfigError(f"{source}: {part!r} has no '='", fix="write each dim as NAME=VALUE, e.g. M=4096")
            if name in raw:
                raise ConfigError(f"{source}: dim {name!r} given twice", fix="give each dim once")
            raw[name] = value.strip()
    dims: dict[str, Any] = {}
    for name, value in raw.items():
        if not NAME_RE.match(str(name)):
            raise ConfigError(f"{source}: {name!r} is not a valid dim name", fix="use the C identifier of solve()'s parameter")
        dims[str(name)] = _dim(value, f"{source}: dim {name}", from_json)
    return dims


_TUPLE_RE = re.compile(r"^[1-9][0-9]*(?:x[1-9][0-9]*)+$")  # sizes >= 1, so 0x10 stays hex
_QUOTED_RE = re.compile(r"""^(["'])([^"']*)\1$""")


def _dim(value: Any, what: str, from_json: bool) -> Any:
    """A dim's value: a number (:func:`_number`); a tuple of sizes, written ``3x224x224`` or as a JSON list (a
    KernelBench size such as ``input_shape``); a string, quoted in the text form (``case="dense"``) or a JSON
    string (a GPU MODE argument). Raises ConfigError naming ``what``."""
    if isinstance(value, list):
        return [_number(v, what) for v in value]
    if isinstance(value, str) and _TUPLE_RE.match(value.strip()):
        return [_number(v, what) for v in value.strip().split("x")]
    quoted = _QUOTED_RE.match(value.strip()) if isinstance(value, str) and not from_json else None
    if quoted:
        return quoted.group(2)
    try:
        return _number(value, what)
    except ConfigError as exc:
        if exc.fix == _FIT_FIX:
            raise
        if isinstance(value, str) and from_json:  # a JSON string that is not a number is a string dim
            return value
        raise ConfigError(exc.message, fix="give a number (4096, 1e-5), a tuple of sizes (3x64x64) or a quoted "
                                           "string (case=\"dense\")") from None


_DECIMAL_RE = re.compile(r"^[+-]?[0-9](?:_?[0-9])*$")
_PREFIXED_RE = re.compile(r"^[+-]?0[xXoObB][0-9a-fA-F_]+$")


_FIT_FIX = "give a size below 2**63"


def fits_int64(value: Any) -> bool:
    """False for an int at or beyond :data:`INT64_LIMIT` in magnitude (no launcher can pass it), True otherwise."""
    return not isinstance(value, int) or isinstance(value, bool) or abs(value) < INT64_LIMIT


def _fits(value: int | float, what: str, text: str | None = None) -> int | float:
    """``value``, or ConfigError naming ``what`` (and ``text``, as written) for an int beyond 64 bits
    (:data:`INT64_LIMIT`)."""
    if not fits_int64(value):
        shown = text if text is not None else str(value)
        raise ConfigError(f"{what}: {shown[:24]}{'...' if len(shown) > 24 else ''} does not fit a 64-bit integer",
                          fix=_FIT_FIX)
    return value


def _number(value: Any, what: str) -> int | float:
    """An int (decimal, leading zeros allowed: ``08`` is 8; or ``0x``/``0o``/``0b``) or a float, written in ASCII
    (``int()`` would take other scripts' digits, such as ``٦٤``). Raises ConfigError naming ``what``."""
    if isinstance(value, bool):
        raise ConfigError(f"{what}: {value!r} is not a number", fix="give an integer or a float")
    if isinstance(value, (int, float)):
        return _fits(value, what)
    s = str(value).strip()
    if not s.isascii():
        raise ConfigError(f"{what}: {s!r} is not a number written in ASCII digits",
                          fix="write it with the digits 0-9, e.g. 64")
    if _DECIMAL_RE.match(s):
        return _fits(int(s) if len(s) < 40 else INT64_LIMIT, what, s)  # a long one is never parsed whole
    if _PREFIXED_RE.match(s):
        return _fits(int(s, 0) if len(s) < 80 else INT64_LIMIT, what, s)
    try:
        return float(s)
    except ValueError:
        raise ConfigError(f"{what}: {s!r} is not a number", fix="give an integer (4096) or a float (1e-5)") from None


def dims_label(dims: dict[str, Any]) -> str:
    """``M=4096,N=1024`` for a shape (a tuple size as ``4x64``): the node-id case of a per-shape item, ``-k``
    friendly."""
    def show(v: Any) -> str:
        return "x".join(str(x) for x in v) if isinstance(v, (list, tuple)) else str(v)
    return ",".join(f"{k}={show(v)}" for k, v in dims.items())


def parse_seeds(text: str, source: str = "--kopt-seeds") -> tuple[int, ...]:
    """Parse ``7,19,41`` into a tuple of distinct non-negative ints; raises ConfigError naming ``source``."""
    seeds: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            seed = int(part)
        except ValueError:
            raise ConfigError(f"{source}: {part!r} is not an integer seed", fix="e.g. --kopt-seeds 7,19,41") from None
        if seed < 0 or seed >= 2**63:
            raise ConfigError(f"{source}: seed {seed} is out of range", fix="use seeds in [0, 2**63)")
        if seed in seeds:
            raise ConfigError(f"{source}: seed {seed} given twice", fix="give each seed once")
        seeds.append(seed)
    if not seeds:
        raise ConfigError(f"{source}: no seed given", fix="e.g. --kopt-seeds 7,19,41")
    return tuple(seeds)


def parse_arch(text: str, source: str = "--kopt-arch") -> str:
    """Validate an nvcc arch such as ``sm_90a`` or ``sm_80`` (``90a`` is accepted too); raises ConfigError."""
    t = text.strip().lower()
    if t.isdigit() or (t[:-1].isdigit() and t[-1:] in "af"):
        t = "sm_" + t
    m = _ARCH_RE.match(t)
    if not m:
        raise ConfigError(f"{source}: {text!r} is not an arch", fix="write it like sm_90a (H100/H200) or sm_80 (A100)")
    if int(m.group(1)) not in KNOWN_SM:
        raise ConfigError(f"{source}: {text!r} is not a CUDA GPU architecture",
                          fix=f"use one of sm_{', sm_'.join(map(str, sorted(KNOWN_SM)))} (with 'a' for arch-specific)")
    return t


def _float(text: str, source: str, positive: bool = False, example: str = "1e-3") -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{source}: {text!r} is not a number", fix=f"give a number, e.g. {example}") from None
    if value != value or value == float("inf") or value < 0 or (positive and value == 0):
        raise ConfigError(f"{source}: {text!r} must be {'> 0' if positive else '>= 0'}",
                          fix=f"give a finite {'positive' if positive else 'non-negative'} number")
    return value


def _path(text: str, source: str, base: Path, suffixes: tuple[str, ...]) -> Path:
    path = Path(text)
    if not path.is_absolute():
        path = base / path
    if path.is_dir():
        raise ConfigError(f"{source}: {text!r} is a folder, not a file", fix="give the kernel or reference file in it")
    if not path.is_file():
        raise ConfigError(f"{source}: file {text!r} does not exist (looked in {base})",
                          fix="give the path of an existing file")
    if suffixes and path.suffix not in suffixes:
        raise ConfigError(f"{source}: {text!r} must end in {' or '.join(suffixes)}",
                          fix="give a CUDA/CUTLASS .cu file or a Triton .py file" if ".cu" in suffixes else "give a .py file")
    path = path.resolve()
    control = sorted({c for c in str(path) if ord(c) < 0x20 or ord(c) == 0x7f})
    if control:  # the run's records (state.json's path patterns) and the tools' command lines take none
        raise ConfigError(f"{source}: the path {str(path)!r} has a control character ({', '.join(map(repr, control))})",
                          fix="move or rename the file (or its folder) to a path without newlines, tabs or other "
                              "control characters")
    return path


def _count(text: str, source: str, example: int) -> int:
    """A positive integer option (``--kopt-iterations``...); raises ConfigError naming ``source``."""
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{source}: {text!r} is not a number", fix=f"e.g. {source} {example}") from None
    if not value.is_integer() or value < 1:
        raise ConfigError(f"{source}: {text!r} must be a positive integer", fix=f"e.g. {source} {example}")
    return int(value)


def build_settings(get: Callable[[str], Any], base: Path, suffixes: tuple[str, ...] = (".cu", ".py"), *,
                   listed: Callable[[Path], tuple[list[dict[str, Any]], bool]]) -> Settings:
    """Build Settings from ``get(name)``, which returns the option value, the ini value or None.

    ``name`` is the option's dest without prefix (``baseline``, ``dims``...). Relative paths are taken from
    ``base`` (the invocation directory); a kernel file must have one of ``suffixes`` (those the session's kernel
    kinds may claim). Without ``--kopt-dims``, the shapes are ``listed(ref)``'s: the reference's test shapes and
    whether they are a GPU MODE ``task.yml``'s rows (the plugin passes
    :func:`pytest_kopt.gates.shapes.listed_shapes`). Raises ConfigError for any bad value, naming the option.
    """
    def opt(name: str) -> Any:
        value = get(name)
        return None if value is None or value == "" or value == [] else value

    baseline = opt("baseline")
    ref = opt("ref")
    if baseline is None:
        if ref is not None or opt("dims") is not None:
            raise ConfigError("--kopt-ref/--kopt-dims given without --kopt-baseline",
                              fix="add --kopt-baseline path/to/kernel.cu (or .py)")
        return Settings()
    baseline_path = _path(str(baseline), "--kopt-baseline", base, suffixes)
    if ref is None:
        raise ConfigError("--kopt-ref is missing", fix="add --kopt-ref path/to/ref.py (it defines reference(**kwargs))")
    ref_path = _path(str(ref), "--kopt-ref", base, (".py",))
    given_dims = get("dims")
    if isinstance(given_dims, str):
        given_dims = [given_dims]
    texts = [str(t) for t in (given_dims or []) if str(t).strip()]
    if texts:
        shapes = [parse_dims(t, "--kopt-dims" if len(texts) == 1 else f"--kopt-dims #{i + 1}")
                  for i, t in enumerate(texts)]
        task_rows = False
    else:
        shapes, task_rows = listed(ref_path)
    shapes = [d for i, d in enumerate(shapes) if d not in shapes[:i]]
    # a GPU MODE task.yml's rows are generate_input's arguments, and an optional one (linalg's case) may be left out
    # of some; a shape given otherwise is one set of values for the same dims
    if len({tuple(sorted(d)) for d in shapes}) > 1 and not task_rows:
        names = sorted({tuple(sorted(d)) for d in shapes})
        where = "--kopt-dims" if texts else f"{ref_path.name}'s dims = [...]"
        raise ConfigError(f"{where}: the shapes name different dims ({' vs '.join(','.join(n) for n in names)})",
                          fix="give every shape the same dim names (a shape is one set of values for them)")
    dims = shapes[0] if shapes else {}
    session_seed: int | None = None
    seed_text = str(opt("seed")) if opt("seed") is not None else None
    if opt("seeds") is not None and seed_text is not None:
        raise ConfigError("--kopt-seed and --kopt-seeds both given", fix="give one: a session seed, or a seed list")
    if opt("seeds") is not None:
        seeds = parse_seeds(str(opt("seeds")))
    elif seed_text is None:
        seeds = DEFAULT_SEEDS  # the plugin passes a drawn session seed; plain callers get SKILL.md's fixed list
    else:
        try:
            session_seed = int(seed_text)
        except ValueError:
            raise ConfigError(f"--kopt-seed: {seed_text!r} is not an integer",
                              fix="e.g. --kopt-seed 12345, or --kopt-seed last") from None
        if not 0 <= session_seed < 2**63:
            raise ConfigError(f"--kopt-seed: {session_seed} is out of range", fix="use a seed in [0, 2**63)")
        seeds = derive_seeds(session_seed, SEED_COUNT)
    candidates = tuple(_path(str(c), "--kopt-candidate", base, suffixes) for c in (get("candidate") or ()))
    sanitizer: tuple[str, ...] = ()
    if opt("sanitizer") is not None:
        sanitizer = tuple(t.strip() for t in str(opt("sanitizer")).split(",") if t.strip())
        for t in sanitizer:
            if t not in SANITIZER_TOOLS:
                raise ConfigError(f"--kopt-sanitizer: unknown tool {t!r}",
                                  fix=f"choose from {','.join(SANITIZER_TOOLS)}")
    atol = _float(str(opt("atol")), "--kopt-atol") if opt("atol") is not None else None
    rtol = _float(str(opt("rtol")), "--kopt-rtol") if opt("rtol") is not None else None
    arch = parse_arch(str(opt("arch"))) if opt("arch") is not None else None
    outdir = Path(str(opt("outdir") or ".kopt"))
    if not outdir.is_absolute():
        outdir = base / outdir
    timeout = _float(str(opt("timeout")), "--kopt-timeout", positive=True, example="120") if opt("timeout") is not None else DEFAULT_GATE_TIMEOUT_S
    ncu_timeout = (_float(str(opt("ncu_timeout")), "--kopt-ncu-timeout", positive=True, example="600")
                   if opt("ncu_timeout") is not None else DEFAULT_NCU_TIMEOUT_S)
    rotating_memory = 0.25
    if opt("rotating_memory") is not None:
        rotating_memory = _float(str(opt("rotating_memory")), "--kopt-rotating-memory", positive=True, example="0.25")
        if rotating_memory > 0.9:
            raise ConfigError(f"--kopt-rotating-memory: {rotating_memory:g} is more than 0.9 of the free memory",
                              fix="give a fraction such as 0.25 (the kernel's own buffers need the rest)")
    timing_method = str(opt("timing") or "cupti")
    if timing_method not in TIMING_METHODS:
        raise ConfigError(f"--kopt-timing: unknown method {timing_method!r}", fix=f"choose {', '.join(TIMING_METHODS[:-1])} or {TIMING_METHODS[-1]}")
    json_path = opt("json")
    if json_path is not None and json_path != "-":
        json_path = os.fspath(Path(base, json_path)) if not os.path.isabs(json_path) else json_path
        jp = Path(json_path)
        if jp.is_dir() or any(p.exists() and not p.is_dir() for p in jp.parents):
            raise ConfigError(f"--kopt-json: {json_path} is a folder or lies under a file", fix="give a file path")
    if outdir.exists() and not outdir.is_dir():
        raise ConfigError(f"--kopt-outdir: {outdir} exists and is not a folder", fix="give a folder path")
    fail_slower = None
    if opt("fail_slower") is not None:
        fail_slower = _float(str(opt("fail_slower")).rstrip("%"), "--kopt-fail-slower", example="3")
    noise = (_float(str(opt("noise")), "--kopt-noise", example="2") if opt("noise") is not None
             else defaults.NOISE_PCT)
    if noise >= 100:
        raise ConfigError(f"--kopt-noise: {noise:g} percent leaves no improvement possible (a new best must be faster "
                          "than best x (1 - noise/100))", fix="e.g. --kopt-noise 2")
    mode = str(opt("numerics_mode") or defaults.NUMERICS_MODE)
    if mode not in NUMERICS_MODES:
        raise ConfigError(f"--kopt-numerics-mode: {mode!r}", fix=f"choose {', '.join(NUMERICS_MODES)}")
    precision = str(opt("precision")) if opt("precision") is not None else None
    if precision is not None and precision not in PRECISIONS:
        raise ConfigError(f"--kopt-precision: {precision!r} is not one of KernelBench's precisions",
                          fix=f"choose {', '.join(PRECISIONS)}")
    edge_shapes = str(opt("edge_shapes") or "auto")
    if edge_shapes not in ("auto", "off"):
        raise ConfigError(f"--kopt-edge-shapes: {edge_shapes!r}", fix="choose auto or off")
    storage = Path(str(opt("storage") or ".benchmarks"))
    compile_jobs = parse_compile_jobs(opt("compile_jobs"))
    return Settings(invocation_dir=base.resolve(), baseline=baseline_path, ref=ref_path, dims=dims,
                    shapes=tuple(shapes) or (dims,), seeds=seeds,
                    atol=atol, rtol=rtol, arch=arch,
                    json_path=json_path, outdir=outdir.resolve(), gate_timeout_s=timeout, ncu_timeout_s=ncu_timeout,
                    candidates=candidates, session_seed=session_seed, sanitizer=sanitizer,
                    fresh_process=bool(get("fresh_process")),
                    fork_server=not get("no_fork_server"), timing_method=timing_method,
                    rotating_memory=rotating_memory, fail_slower_pct=fail_slower,
                    save=opt("save"), compare=opt("compare"),
                    storage=storage if storage.is_absolute() else base / storage,
                    gpus=opt("gpus"), init=bool(get("init")), finalize=bool(get("finalize")),
                    iterations=(_count(str(opt("iterations")), "--kopt-iterations", defaults.ITERATIONS)
                                if opt("iterations") else defaults.ITERATIONS),
                    branches=(_count(str(opt("branches")), "--kopt-branches", defaults.BRANCHES)
                              if opt("branches") else defaults.BRANCHES),
                    ncu_num=(_count(str(opt("ncu_num")), "--kopt-ncu-num", defaults.NCU_NUM)
                             if opt("ncu_num") else defaults.NCU_NUM),
                    noise_pct=noise, numerics_mode=mode, precision=precision, compile_jobs=compile_jobs,
                    edge_shapes=edge_shapes)


def parse_compile_jobs(value: Any, source: str = "--kopt-compile-jobs") -> str | int:
    """``auto`` (None or empty too) or a positive integer; raises ConfigError naming ``source``."""
    if value is None or str(value).strip().lower() in ("", "auto"):
        return "auto"
    text = str(value).strip()
    if not text.isascii() or not text.isdigit() or int(text) < 1:
        raise ConfigError(f"{source}: {value!r} is neither auto nor a positive integer",
                          fix=f"{source} auto (SKILL.md's default) or {source} 4")
    return int(text)
