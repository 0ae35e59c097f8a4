"""The ``hardware`` gate: GPUs through a real CUDA context, nvcc, ncu, cuobjdump, library versions (``env.json``).

The CUDA probe runs the driver API through ctypes in a child process, so the pytest process (and the xdist
controller) never initialises CUDA. The result is a plain dict written as SKILL.md's ``env.json``.
"""

from __future__ import annotations

import glob
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping

from ..artifacts import Env
from ..errors import HardwareError
from .context import Context, Outcome
from .gpus import arch_of, session_view

#: The probe's error when the driver library itself is absent (no retry can change that).
NO_DRIVER = "no NVIDIA driver"
#: Seconds between GPU probes of a loop session (SKILL.md step 0: discovery retried at most three times).
RETRY_PAUSE_S = 2.0

# Runs in a child: creates a context on every visible GPU, prints one JSON line. Through cuda-bindings' driver API
# where it is installed (torch's CUDA wheels bring it); through ctypes where it is not, or where its API differs from
# the calls below (a TypeError or AttributeError, never a CUDA error, sends the probe to ctypes). Whether the driver
# library is there at all is asked of the dynamic loader first, so its absence reads the same either way.
_PROBE = r"""
import ctypes, json, sys
out = {"gpus": [], "driver_version": None, "error": None, "probe": None}
try:
    ctypes.CDLL("libcuda.so.1")
except OSError as e:
    out["error"] = "no NVIDIA driver (libcuda.so.1 not found)"
    print(json.dumps(out)); sys.exit(0)
ATTRS = {"cc_major": 75, "cc_minor": 76, "sm_count": 16, "l2_bytes": 38, "smem_per_block_optin_bytes": 97,
         "sm_clock_khz": 13, "mem_clock_khz": 36, "mem_bus_width_bits": 37}
def gpu(i, name, uuid, attr, mem, free):
    u = bytes(uuid).hex(); u = "GPU-%s-%s-%s-%s-%s" % (u[:8], u[8:12], u[12:16], u[16:20], u[20:])
    a = {k: attr(v) for k, v in ATTRS.items()}
    return {"index": i, "name": name, "uuid": u, "cc": "%d.%d" % (a.pop("cc_major"), a.pop("cc_minor")),
            "sm_count": a.pop("sm_count"), "l2_bytes": a.pop("l2_bytes"),
            "smem_per_block_optin_bytes": a.pop("smem_per_block_optin_bytes"), "memory_bytes": mem,
            "free_bytes": free, **a}
def with_bindings():
    from cuda.bindings import driver as cu
    ok = cu.CUresult.CUDA_SUCCESS
    def chk(ret, what):
        err, rest = ret[0], ret[1:]
        if err != ok:
            s = cu.cuGetErrorString(err)[1] or b""
            raise RuntimeError("%s failed: CUDA error %d %s" % (what, int(err), s.decode()))
        return rest[0] if len(rest) == 1 else rest
    chk(cu.cuInit(0), "cuInit")
    v = chk(cu.cuDriverGetVersion(), "cuDriverGetVersion")
    out["driver_version"] = "%d.%d" % (v // 1000, (v % 1000) // 10)
    for i in range(chk(cu.cuDeviceGetCount(), "cuDeviceGetCount")):
        d = chk(cu.cuDeviceGet(i), "cuDeviceGet")
        name = chk(cu.cuDeviceGetName(256, d), "cuDeviceGetName").split(b"\0")[0].decode()
        attr = lambda a: chk(cu.cuDeviceGetAttribute(cu.CUdevice_attribute(a), d), "cuDeviceGetAttribute")
        mem = chk(cu.cuDeviceTotalMem(d), "cuDeviceTotalMem")
        uuid = chk(cu.cuDeviceGetUuid(d), "cuDeviceGetUuid").bytes
        ctx = chk(cu.cuDevicePrimaryCtxRetain(d), "cuDevicePrimaryCtxRetain")
        chk(cu.cuCtxPushCurrent(ctx), "cuCtxPushCurrent")
        free, _total = chk(cu.cuMemGetInfo(), "cuMemGetInfo")
        cu.cuCtxPopCurrent(); cu.cuDevicePrimaryCtxRelease(d)
        out["gpus"].append(gpu(i, name, uuid, attr, int(mem), int(free)))
def with_ctypes():
    cu = ctypes.CDLL("libcuda.so.1")
    def chk(r, what):
        if r != 0:
            s = ctypes.c_char_p(); cu.cuGetErrorString(r, ctypes.byref(s))
            raise RuntimeError("%s failed: CUDA error %d %s" % (what, r, (s.value or b"").decode()))
    chk(cu.cuInit(0), "cuInit")
    v = ctypes.c_int(); chk(cu.cuDriverGetVersion(ctypes.byref(v)), "cuDriverGetVersion")
    out["driver_version"] = "%d.%d" % (v.value // 1000, (v.value % 1000) // 10)
    n = ctypes.c_int(); chk(cu.cuDeviceGetCount(ctypes.byref(n)), "cuDeviceGetCount")
    for i in range(n.value):
        d = ctypes.c_int(); chk(cu.cuDeviceGet(ctypes.byref(d), i), "cuDeviceGet")
        name = ctypes.create_string_buffer(256); chk(cu.cuDeviceGetName(name, 256, d), "cuDeviceGetName")
        def attr(a):
            x = ctypes.c_int(); chk(cu.cuDeviceGetAttribute(ctypes.byref(x), a, d), "cuDeviceGetAttribute"); return x.value
        mem = ctypes.c_size_t(); chk(cu.cuDeviceTotalMem_v2(ctypes.byref(mem), d), "cuDeviceTotalMem")
        uuid = (ctypes.c_ubyte * 16)(); chk(cu.cuDeviceGetUuid(uuid, d), "cuDeviceGetUuid")
        ctx = ctypes.c_void_p(); chk(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), d), "cuDevicePrimaryCtxRetain")
        chk(cu.cuCtxPushCurrent_v2(ctx), "cuCtxPushCurrent")
        free, total = ctypes.c_size_t(), ctypes.c_size_t(); chk(cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "cuMemGetInfo")
        cu.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p())); cu.cuDevicePrimaryCtxRelease_v2(d)
        out["gpus"].append(gpu(i, name.value.decode(), uuid, attr, mem.value, free.value))
try:
    try:
        out["probe"] = "cuda-bindings"
        with_bindings()
    except (ImportError, TypeError, AttributeError, ValueError):
        out.update(gpus=[], driver_version=None, probe="ctypes")
        with_ctypes()
except Exception as e:
    out["error"] = str(e)
print(json.dumps(out))
"""


def probe_gpus(timeout_s: float = 60.0) -> dict[str, Any]:
    """Create a CUDA context on each visible GPU in a child process.

    Returns ``{"gpus": [{name, uuid, cc, sm_count, l2_bytes, memory_bytes, ...}], "driver_version", "error"}``;
    ``error`` is a one-line reason when no GPU could be used. Never raises.
    """
    try:
        proc = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"gpus": [], "driver_version": None, "error": f"CUDA context probe timed out after {timeout_s:.0f} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        return {"gpus": [], "driver_version": None,
                "error": f"CUDA context probe crashed (exit {proc.returncode}): {proc.stderr.strip()[-300:]}"}
    data: dict[str, Any] = json.loads(lines[-1])
    if not data["gpus"] and not data["error"]:
        data["error"] = "no CUDA GPU visible (cuDeviceGetCount returned 0; check CUDA_VISIBLE_DEVICES)"
    return data


def _cuda_roots() -> list[str]:
    roots = [os.environ.get(v, "") for v in ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT")]
    roots += sorted(glob.glob("/usr/local/cuda*"), reverse=True) + sorted(glob.glob("/opt/cuda*"), reverse=True)
    return [r for r in roots if r and os.path.isdir(r)]


def _triton_bin() -> str | None:
    """Folder of the tools triton's wheel bundles (ptxas, cuobjdump, nvdisasm), found without importing it."""
    spec = importlib.util.find_spec("triton")
    if spec is None or not spec.origin:
        return None
    path = Path(spec.origin).parent / "backends" / "nvidia" / "bin"
    return str(path) if path.is_dir() else None


def find_tool(name: str) -> str | None:
    """Find ``nvcc``, ``ncu`` or ``cuobjdump``: PATH, CUDA roots, Nsight Compute installs, then triton's wheel."""
    found = shutil.which(name)
    if found:
        return found
    candidates = [os.path.join(r, "bin", name) for r in _cuda_roots()]
    if name == "ncu":
        candidates += sorted(glob.glob("/opt/nvidia/nsight-compute/*/ncu"), reverse=True)
        candidates += sorted(glob.glob("/usr/local/NVIDIA-Nsight-Compute*/ncu"), reverse=True)
        candidates += [os.path.join(r, "nsight-compute", "ncu") for r in _cuda_roots()]
    if name in ("cuobjdump", "nvdisasm", "ptxas"):
        tb = _triton_bin()
        if tb:
            candidates.append(os.path.join(tb, name))
    for c in candidates:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def tool_version(path: str, timeout_s: float = 30.0) -> str | None:
    """The version string a CUDA tool prints for ``--version`` (e.g. ``13.0.88`` or ``2025.3.1.0``), or None."""
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=timeout_s).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"[Vv]ersion\s+([\d.]+)", out) or re.search(r"release\s+([\d.]+)", out)
    return m.group(1) if m else (out.strip().splitlines() or [None])[-1]


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def nvml_view(visible: str | None = None) -> tuple[int | None, str | None]:
    """What NVML (nvidia-ml-py) says, without a CUDA context, of the GPUs CUDA will show this process: (how many,
    their build arch), each None where NVML cannot vouch for it (:func:`nvml_gpu_count`, :func:`nvml_arch`), both
    None when NVML is missing or fails. One NVML session (0.09 s on the H200, against 0.47 s for
    :func:`probe_gpus`, which creates a context; 2026-12-03). ``visible`` is ``CUDA_VISIBLE_DEVICES`` (read from
    the environment when not given). Never raises; the probe stays the truth."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # not installed, no driver, or any NVML error: the probe decides
        return None, None
    try:
        return _nvml_count(pynvml, visible), _nvml_arch(pynvml, visible)
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _hides_every_gpu(visible: str | None) -> bool:
    """True when ``CUDA_VISIBLE_DEVICES`` starts with an entry that shows no whole GPU (empty, ``-1``, a MIG
    instance)."""
    first = visible.split(",")[0].strip() if visible is not None else None
    return first is not None and (not first or first == "-1" or first.startswith("MIG-"))


def _nvml_arch(nvml: Any, visible: str | None) -> str | None:
    if _hides_every_gpu(visible):
        return None
    first = visible.split(",")[0].strip() if visible is not None else None
    try:
        if first is not None and first.startswith("GPU-"):
            handles = [nvml.nvmlDeviceGetHandleByUUID(first)]
        else:
            handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        ccs = {tuple(nvml.nvmlDeviceGetCudaComputeCapability(h)) for h in handles}
    except Exception:
        return None
    if len(ccs) != 1:
        return None
    major, minor = ccs.pop()
    return arch_of(f"{major}.{minor}")


def _nvml_count(nvml: Any, visible: str | None) -> int | None:
    try:
        count = int(nvml.nvmlDeviceGetCount())
        if visible is None:
            return count
        entries = [e.strip() for e in visible.split(",")]
        seen = set()
        for entry in entries:
            if entry.isascii() and entry.isdigit():
                if int(entry) >= count:
                    return None
                seen.add(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(int(entry))))
            elif entry.startswith("GPU-"):
                seen.add(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByUUID(entry)))  # raises for a prefix
            else:
                return None
        return len(entries) if len(seen) == len(entries) else None  # a GPU named twice: CUDA shows none
    except Exception:
        return None


def nvml_arch(visible: str | None = None) -> str | None:
    """The build arch of the GPUs this process can see, read through NVML (:func:`nvml_view`), so nvcc can start
    while the probe runs. ``visible`` is ``CUDA_VISIBLE_DEVICES`` (read from the environment when not given).

    Returns None when NVML is missing or fails, when ``visible`` hides every GPU or names a MIG instance (NVML is
    not asked), or when the GPUs differ in compute capability and ``visible`` does not name one by UUID (NVML's
    order is not CUDA's). Never raises. The probe's arch stays the truth: a build started for another arch is simply
    not the one used."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible
    if _hides_every_gpu(visible):
        return None
    return nvml_view(visible)[1]


def nvml_gpu_count(visible: str | None = None) -> int | None:
    """How many GPUs CUDA will show this process, read through NVML (:func:`nvml_view`): every GPU NVML lists, or,
    with ``visible`` (``CUDA_VISIBLE_DEVICES``, read from the environment when not given), its entries, each naming
    one of them by ordinal or by full UUID. Returns None when NVML is missing or fails, and when an entry is one it
    cannot vouch for (empty, ``-1``, a MIG instance, a UUID prefix, an ordinal past NVML's count or in other than
    ASCII digits, a GPU named twice): CUDA stops listing at such an entry or shows no GPU, and the probe
    (:func:`probe_gpus`) decides. Never raises."""
    return nvml_view(visible)[0]


def _probe_with_retries(attempts: int) -> dict[str, Any]:
    """:func:`probe_gpus` up to ``attempts`` times (:data:`RETRY_PAUSE_S` apart) until it finds a GPU or finds no
    driver at all; its result gains ``attempts`` (one record per probe)."""
    probe: dict[str, Any] = {}
    hw_attempts = []
    for i in range(max(1, attempts)):
        if i:
            time.sleep(RETRY_PAUSE_S)
        probe = probe_gpus()
        hw_attempts.append({"attempt": i + 1, "gpus": len(probe["gpus"]), "error": probe["error"],
                            "probe": probe.pop("probe", None)})
        if probe["gpus"] or (probe["error"] or "").startswith(NO_DRIVER):
            break  # found, or no driver at all: another probe cannot change that
    return {**probe, "attempts": hw_attempts}


#: The tools ``env.json`` records (SKILL.md step 0)
TOOLS = ("nvcc", "ncu", "cuobjdump")
#: The distributions whose versions ``env.json`` records
PACKAGES = ("torch", "triton", "numpy", "pytest", "pytest-xdist", "hypothesis", "nvidia-cutlass", "cupti-python",
            "nvidia-cuda-cupti", "nvidia-cuda-cupti-cu12")


def detect_tools() -> dict[str, dict[str, str | None]]:
    """``env.json``'s ``tools``: each of :data:`TOOLS` with its path (:func:`find_tool`) and version, the
    ``--version`` runs side by side (0.09 s on the H200). Never raises."""
    from concurrent.futures import ThreadPoolExecutor

    found = {name: find_tool(name) for name in TOOLS}
    with ThreadPoolExecutor(max_workers=len(TOOLS), thread_name_prefix="kopt-tools") as pool:
        versions = {name: pool.submit(tool_version, path) for name, path in found.items() if path}
        return {name: {"path": path, "version": versions[name].result() if path else None}
                for name, path in found.items()}


def package_versions() -> dict[str, str | None]:
    """``env.json``'s ``packages``: the installed version of each of :data:`PACKAGES` (None when absent)."""
    return {n: _dist_version(n) for n in PACKAGES}


def detect(attempts: int = 1, tools: dict[str, dict[str, str | None]] | None = None) -> dict[str, Any]:
    """Detect the environment: SKILL.md's ``env.json`` document (GPUs, tools with versions, library versions).
    ``tools`` is :func:`detect_tools`' result when the caller has it already (the plugin's configure, for the builds
    it starts before the probe); otherwise the tools' ``--version`` runs overlap the GPU probe.

    ``generation_allowed`` is true only with a GPU context, nvcc, ncu and cuobjdump all present (SKILL.md step 0);
    ``can_read_counters`` stays None until the ncu gate has tried. Retries the GPU probe up to ``attempts`` times.
    """
    if tools is None:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="kopt-tools") as pool:
            pending = pool.submit(detect_tools)
            probe = _probe_with_retries(attempts)
            tools = pending.result()
    else:
        probe = _probe_with_retries(attempts)
    hw_attempts = probe.pop("attempts")
    gpus = probe["gpus"]
    return Env.document(gpus=gpus, sm_arch=arch_of(gpus[0]["cc"]) if gpus else None,
                        driver_version=probe["driver_version"], gpu_error=probe["error"], tools=tools,
                        hardware_attempts=hw_attempts, python=platform.python_version(), packages=package_versions(),
                        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"))


def cupti_pin(cuda: str | None) -> str:
    """The pip command that installs cupti-python and the CUPTI library it loads no newer than a driver's CUDA
    ``cuda`` (``env["driver_version"]``, such as ``13.0``): a newer CUPTI does not start (CUPTI_ERROR_NOT_INITIALIZED).
    The bound is below the next minor release (``<13.1``), since cupti-python has releases for some minors only;
    the library is ``nvidia-cuda-cupti`` from CUDA 13 on and ``nvidia-cuda-cupti-cu12`` before. Without a version,
    a sentence saying what to pin."""
    try:
        major, minor = (int(x) for x in str(cuda).split(".")[:2])
    except ValueError:
        return "pip install cupti-python, with it and nvidia-cuda-cupti no newer than the driver's CUDA"
    bound = f"<{major}.{minor + 1}"
    lib = "nvidia-cuda-cupti" if major >= 13 else f"nvidia-cuda-cupti-cu{major}"
    return f'pip install "cupti-python{bound}" "{lib}{bound}"'


def cupti_hint(env: dict[str, Any]) -> str | None:
    """What to install when a GPU is present and cupti-python is not (``env["packages"]``): the kernel-only (CUPTI)
    timing then goes through torch's profiler, whose first session costs each timing process 3.5-7 s (H200,
    2026-12-03, docs/timing.md; in a loop's close of 32 branches on an H100 the timing items waited 9-13 s for it,
    docs/loop.md). The pin is :func:`cupti_pin`'s. None when there is no GPU or cupti-python is installed (which
    client a timing used, and why, is ``bench.json``'s ``kernel_time.backend`` and ``backend_note``: one that is
    installed but does not start falls back to torch's profiler)."""
    if not env.get("gpu") or (env.get("packages") or {}).get("cupti-python"):
        return None
    return ("cupti-python is not installed: the kernel-only timing goes through torch's profiler, whose start costs "
            f"each timing process seconds ({cupti_pin(env.get('driver_version'))})")


def header_line(env: dict[str, Any]) -> str:
    """One line for the pytest header: GPU, arch, driver and tool versions, or the reason there is no GPU."""
    t = env["tools"]
    tools = ", ".join(f"{n} {t[n]['version'] or 'found'}" if t[n]["path"] else f"{n} missing" for n in t)
    pk = env["packages"]
    libs = f"torch {pk.get('torch') or 'missing'}, triton {pk.get('triton') or 'missing'}"
    if env["gpu"]:
        g = env["gpu"]
        gpu = f"{g['name']} (cc {g['cc']}, {env['sm_arch']}, {g['sm_count']} SMs, driver {env['driver_version']})"
        if len(env["gpus"]) > 1:
            gpu += f" +{len(env['gpus']) - 1} more"
    else:
        gpu = f"no GPU ({env['gpu_error']})"
    hint = cupti_hint(env)
    return f"kopt: {gpu}; {tools}; {libs}" + (f"; {hint}" if hint else "")


def generation_problem(env: Mapping[str, Any]) -> str | None:
    """None when the environment allows generation (SKILL.md step 0: a GPU context, nvcc, ncu and cuobjdump), else
    why not (``env.json``'s ``reason``)."""
    if env.get("generation_allowed"):
        return None
    return str(env.get("reason") or "env.json's generation_allowed is false")


def gate_hardware(ctx: Context, case: Any = None) -> Outcome:
    """The hardware gate: report the detected environment and write ``<outdir>/env.json``.

    Fails (HardwareError, exit 3) when a tool the kernel's kind cannot do without is missing
    (:meth:`~pytest_kopt.kinds.base.Kind.check_tools`: nvcc for a ``.cu``, triton for a Triton kernel), and in a
    ``--kopt-init`` on a machine that does not allow generation (SKILL.md step 0: a GPU context, nvcc, ncu and
    cuobjdump; ``env.json`` ``generation_allowed``), where the set-up stops with exit 3 and this is its only item
    (:func:`pytest_kopt.plugin.loop.keep_hardware_only`): the item fails with the step, its figures kept. Elsewhere
    no GPU is not a failure here: the GPU gates skip with the reason (a ``--kopt-run`` there reports its branches'
    other items, and a finish needs no GPU). On a GPU, ``cupti_python`` is the installed cupti-python (None: the
    kernel-only timing goes through torch's profiler, and the line says what to install)."""
    env = ctx.env
    # the session's document, the same from every xdist worker (each one's own GPU is in this item's figures)
    path = Env.write(ctx.settings.outdir, session_view(env))
    ctx.kind.check_tools(ctx)
    g = env.get("gpu") or {}
    # sm_arch: the detected GPU's, as env.json has it (None without one); build_arch: what the builds target
    # (--kopt-arch, else the GPU's, else sm_90a), which on a GPU-less machine is no GPU's
    figures = {"gpu": g.get("name", "none"), "sm_arch": env.get("sm_arch"), "build_arch": ctx.arch,
               "gpu_count": len(env.get("gpus", [])), "generation_allowed": env.get("generation_allowed")}
    if g:  # the installed cupti-python (None: the timing goes through torch's profiler); bench.json's
        # kernel_time.backend says which client measured (an installed one that cannot start falls back)
        figures["cupti_python"] = (env.get("packages") or {}).get("cupti-python")
    line = header_line(env)
    problem = generation_problem(env) if ctx.settings.loop_mode == "init" else None
    if problem is not None:
        raise HardwareError(f"the run's set-up needs a machine that allows generation (SKILL.md step 0): {problem}",
                            gate="hardware",
                            path=ctx.display, figures=figures,
                            fix="run the step where the report's loop.next.requires says: an NVIDIA GPU whose "
                                "counters ncu can read, with nvcc, ncu and cuobjdump")
    if env.get("pinned"):
        figures.update(gpu_uuid=g.get("uuid"), gpu_index=g.get("index"))
        line += f"; this worker's GPU: {g.get('index')} ({g.get('uuid')})"
    return Outcome(figures, line, (str(path),))
