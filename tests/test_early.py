"""Tests for the work started before the GPU probe (pytest_kopt.plugin.early: builds, harness processes) and what
NVML says without a CUDA context (pytest_kopt.gates.hardware.nvml_arch, nvml_gpu_count). No GPU and no nvcc
needed, except the build session test."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pytest_kopt.gates.hardware import find_tool


def _config(tmp_path: Path, keyword: str = "", markexpr: str = "", args: tuple[str, ...] = (), **flags: object):
    from types import SimpleNamespace

    option = SimpleNamespace(keyword=keyword, markexpr=markexpr, collectonly=False, lf=False, stepwise=False,
                             deselect=None)
    for name, value in flags.items():
        setattr(option, name, value)
    return SimpleNamespace(option=option, args=list(args), rootpath=tmp_path,
                           invocation_params=SimpleNamespace(dir=tmp_path))


def _state(**fields: object):
    """What selection_keeps reads of a session's state: kopt's gate table and kernel kinds."""
    from types import SimpleNamespace

    from pytest_kopt.gates.builtin import default_table
    from pytest_kopt.kinds.builtin import default_kinds

    return SimpleNamespace(gates=default_table(), kinds=default_kinds(), **fields)


@pytest.mark.parametrize("keyword, markexpr, flags, kept", [
    ("", "", {}, True),
    ("compile", "", {}, True),
    ("COMPILE or timing", "", {}, True),
    ("not compile", "", {}, False),
    ("correctness", "", {}, False),
    ("b0", "", {}, True),                      # the file's name
    ("b1", "", {}, False),
    ("sub and compile", "", {}, True),         # a folder below the root
    ("kopt and not kopt_gpu", "", {}, True),   # the marker is a keyword too
    ("", "not kopt_gpu", {}, True),            # a CI's GPU-less selection keeps compile (no kopt_gpu marker)
    ("", "kopt_gpu", {}, False),
    ("", "gpu", {}, False),                    # a user's own gpu marker: no kopt item carries it
    ("", "kopt(gate='compile')", {}, False),   # call parameters: unsure, so no early start
    ("compile and (", "", {}, False),           # pytest reports the syntax error itself, later
    ("", "", {"collectonly": True}, False),
    ("", "", {"lf": True}, False),
    ("", "", {"stepwise": True}, False),
    ("", "", {"deselect": ["sub/b0.cu::compile"]}, False),
    ("", "", {"help": True}, False),           # no item runs: --help, the listings, the setup plans
    ("", "", {"markers": True}, False),
    ("", "", {"setupplan": True}, False),
    ("", "", {"cacheshow": True}, False),
])
def test_builds_start_early_only_where_the_selection_surely_keeps_compile(tmp_path: Path, keyword: str,
                                                                           markexpr: str, flags: dict,
                                                                           kept: bool) -> None:
    """A build started before collection is waited for at the session's end even when the selection then drops
    its compile item (a CUTLASS build takes a minute), so it starts early only where -k/-m (evaluated by pytest's
    own parser over the names pytest matches the item by) and the other selection options surely keep it."""
    from pytest_kopt.plugin.early import selection_keeps

    kernel = tmp_path / "sub" / "b0.cu"
    config: Any = _config(tmp_path, keyword, markexpr, **flags)
    assert selection_keeps(config, _state(), kernel) is kept  # type: ignore[arg-type]


def test_node_ids_missing_paths_and_kernels_outside_the_root_keep_builds_at_the_first_item(tmp_path: Path) -> None:
    """``pytest k.cu::timing`` selects by node id, a missing path argument ends the session at collection (a
    usage error), and a kernel outside the root is named by folders the prediction does not know: none is surely
    a session whose compile item runs, so nothing starts early."""
    from pytest_kopt.plugin.early import selection_keeps

    state: Any = _state()
    (tmp_path / "k.cu").write_text("")
    assert selection_keeps(_config(tmp_path, args=("k.cu",)), state, tmp_path / "k.cu")  # type: ignore[arg-type]
    assert not selection_keeps(_config(tmp_path, args=("k.cu::timing",)), state,  # type: ignore[arg-type]
                               tmp_path / "k.cu")
    assert not selection_keeps(_config(tmp_path, args=("nope.cu",)), state, tmp_path / "k.cu")  # type: ignore[arg-type]
    outside = tmp_path.parent / "elsewhere" / "deep" / "k.cu"
    assert not selection_keeps(_config(tmp_path, "not deep"), state, outside)  # type: ignore[arg-type]


class _FakeNvml:
    """pynvml's calls the arch needs, over GPUs given as (uuid, (major, minor))."""

    def __init__(self, gpus: list[tuple[str, tuple[int, int]]], init_error: bool = False) -> None:
        self.gpus, self.init_error, self.shut = gpus, init_error, 0

    def nvmlInit(self) -> None:
        if self.init_error:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlShutdown(self) -> None:
        self.shut += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:
        return next(i for i, g in enumerate(self.gpus) if g[0] == uuid)

    def nvmlDeviceGetCudaComputeCapability(self, handle: int) -> tuple[int, int]:
        return self.gpus[handle][1]

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return self.gpus[handle][0]


@pytest.mark.parametrize("gpus, visible, arch", [
    ([("GPU-a", (9, 0)), ("GPU-b", (9, 0))], None, "sm_90a"),
    ([("GPU-a", (8, 0))], None, "sm_80"),
    ([("GPU-a", (9, 0)), ("GPU-b", (8, 0))], None, None),         # NVML's order is not CUDA's: unsure
    ([("GPU-a", (9, 0)), ("GPU-b", (8, 0))], "GPU-b,GPU-a", "sm_80"),  # named by UUID: that one
    ([("GPU-a", (9, 0)), ("GPU-b", (8, 0))], "1", None),
    ([("GPU-a", (9, 0))], "", None),                              # every GPU hidden
    ([("GPU-a", (9, 0))], "-1", None),
    ([("GPU-a", (9, 0))], "MIG-1234", None),
    ([], None, None),
])
def test_nvml_arch_is_the_visible_gpus_one_arch_or_none(monkeypatch: pytest.MonkeyPatch, gpus, visible,
                                                        arch) -> None:
    """The arch read without a CUDA context (0.09 s against the probe's 0.47 s on the H200), or None wherever it
    could differ from the probe's: the probe's arch stays the truth."""
    import sys

    from pytest_kopt.gates.hardware import nvml_arch

    fake = _FakeNvml(gpus)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert nvml_arch(visible) == arch
    assert fake.shut == (1 if visible not in ("", "-1", "MIG-1234") else 0)
    monkeypatch.setitem(sys.modules, "pynvml", _FakeNvml(gpus, init_error=True))
    assert nvml_arch(visible) is None


@pytest.mark.parametrize("gpus, visible, count", [
    ([("GPU-a", (9, 0))], None, 1),
    ([("GPU-a", (9, 0)), ("GPU-b", (9, 0))], None, 2),
    ([("GPU-a", (9, 0)), ("GPU-b", (9, 0))], "1", 1),
    ([("GPU-a", (9, 0)), ("GPU-b", (9, 0))], "GPU-b", 1),
    ([("GPU-a", (9, 0)), ("GPU-b", (9, 0))], "0, GPU-b", 2),
    ([("GPU-a", (9, 0))], "1", None),            # past NVML's count: CUDA stops there
    ([("GPU-a", (9, 0))], "GPU-", None),         # a UUID prefix CUDA may resolve and NVML does not
    ([("GPU-a", (9, 0))], "", None),             # every GPU hidden
    ([("GPU-a", (9, 0))], "-1", None),
    ([("GPU-a", (9, 0))], "MIG-1234", None),
    ([("GPU-a", (9, 0)), ("GPU-b", (9, 0))], "0,0", None),     # a GPU named twice: CUDA shows none
    ([("GPU-a", (9, 0)), ("GPU-b", (9, 0))], "GPU-a,0", None),
    ([("GPU-a", (9, 0))], "\uff10", None),       # a full-width 0: str.isdigit, not an ordinal to CUDA
    ([("GPU-a", (9, 0))], "\u0660", None),       # an Arabic-Indic 0
    ([], None, 0),
])
def test_nvml_gpu_count_is_what_cuda_will_show_or_none(monkeypatch: pytest.MonkeyPatch, gpus, visible,
                                                       count) -> None:
    """The GPUs CUDA will list for this process, counted without a CUDA context, or None wherever CUDA's own
    reading of ``CUDA_VISIBLE_DEVICES`` could differ (the probe then decides)."""
    import sys

    from pytest_kopt.gates.hardware import nvml_gpu_count

    fake = _FakeNvml(gpus)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert nvml_gpu_count(visible) == count
    assert fake.shut == 1
    monkeypatch.setitem(sys.modules, "pynvml", _FakeNvml(gpus, init_error=True))
    assert nvml_gpu_count(visible) is None


@pytest.mark.parametrize("gpus, option, flags, settings, kept", [
    (1, {}, {}, {}, {"plan", "correctness", "timing"}),
    (1, {"keyword": "not timing"}, {}, {}, {"plan", "correctness"}),
    (1, {"keyword": "compile"}, {}, {}, None),         # no plan item: nothing for the processes to serve first
    (1, {"markexpr": "not kopt_gpu"}, {}, {}, {"plan"}),  # a .cu's correctness and timing items carry kopt_gpu
    (1, {"keyword": "not kopt_gpu"}, {}, {}, {"plan"}),   # and -k matches marker names
    (2, {}, {}, {}, None),                             # the probe may pin another GPU after they inherited the env
    (None, {}, {}, {}, None),                          # NVML cannot say: the probe decides, collection starts them
    (1, {}, {"numprocesses": 2, "dist": "load"}, {}, None),  # each xdist worker starts its own
    (1, {}, {}, {"gpus": "0"}, None),                  # --kopt-gpus pins
    (1, {}, {}, {"arch": None, "nvml_arch": None}, None),  # no arch: a Triton build folder could not be named
])
def test_harness_processes_start_at_configure_only_where_collection_would_start_the_same(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpus, option, flags, settings, kept) -> None:
    """Before the probe, the first kernel's processes start only where they are the ones collection would start:
    no xdist, no --kopt-gpus, one GPU by NVML, the plan item surely kept; the environment they are keyed by holds
    the GPU, its arch and the package versions (a Triton kernel's TRITON_CACHE_DIR is named by them)."""
    from types import SimpleNamespace

    from pytest_kopt.plugin import early

    kernel, ref = tmp_path / "k.cu", tmp_path / "ref.py"
    seen: list[tuple[str, dict, frozenset[str]]] = []
    monkeypatch.setattr(early.hardware, "nvml_view", lambda: (gpus, settings.get("nvml_arch", "sm_90a")))
    monkeypatch.setattr(early.hardware, "package_versions", lambda: {"triton": "3.6.0"})
    s = SimpleNamespace(gpus=settings.get("gpus"), kernels=(kernel,), ref=ref, arch=settings.get("arch"))
    ahead = SimpleNamespace(prestart_harness=lambda ctx: seen.append((ctx.display, ctx.env, ctx.collected)))
    state = _state(settings=s, ahead=ahead, context=lambda config, k, display, env=None, collected=None:
                   SimpleNamespace(display=display, env=env, collected=collected))
    config = _config(tmp_path, numprocesses=flags.get("numprocesses"), dist=flags.get("dist", "no"), **option)
    started = early.prestart_harness_early(config, state)  # type: ignore[arg-type]
    assert started is (kept is not None)
    if kept is None:
        assert seen == []
    else:
        assert seen == [("k.cu", {"gpu_available": True, "sm_arch": "sm_90a", "packages": {"triton": "3.6.0"}},
                         frozenset(kept))]


@pytest.mark.parametrize("dist, numprocesses, tx, local", [
    ("no", None, [], True),
    ("load", 8, ["popen"] * 8, True),
    ("loadscope", None, ["2*popen//python=python3"], True),
    ("load", None, ["ssh=gpu-box//python=python3"], False),   # another host: its own build cache
    ("load", None, ["popen", "socket=10.0.0.2:8888"], False),
])
def test_builds_start_in_the_controller_only_where_its_workers_are_local(dist: str, numprocesses: int | None,
                                                                         tx: list[str], local: bool) -> None:
    from types import SimpleNamespace

    from pytest_kopt.plugin.early import local_items

    config = SimpleNamespace(option=SimpleNamespace(dist=dist, numprocesses=numprocesses, tx=tx))
    assert local_items(config) is local  # type: ignore[arg-type]


CONFTEST = '''
import threading

def pytest_sessionstart(session):
    alive = sorted(t.name for t in threading.enumerate() if t.name.startswith("kopt-build"))
    print("BUILDS AT SESSION START:", len(alive))
'''


@pytest.mark.skipif(find_tool("nvcc") is None, reason="nvcc not found (PATH, $CUDA_HOME/bin, /usr/local/cuda*/bin)")
def test_with_the_arch_given_nvcc_runs_before_collection(pytester: pytest.Pytester) -> None:
    """With --kopt-arch the builds start at configure, so nvcc is already running when the session starts (before
    the GPU probe's end, collection and the first item); a selection without the compile item starts none, and
    the compile item still reports its build as built, not as a cache hit."""
    from test_plugin import GOOD_CU, SCALE_REF

    from pytest_kopt.gates.hardware import nvml_arch

    pytester.makefile(".cu", k=GOOD_CU)
    pytester.makepyfile(ref=SCALE_REF)
    pytester.makeconftest(CONFTEST)
    base = ["-s", "-p", "no:xdist", "--kopt-baseline", "k.cu", "--kopt-ref", "ref.py", "--kopt-dims", "n=4096"]
    got = pytester.runpytest_subprocess(*base, "--kopt-arch", "sm_90a", "-k", "compile", timeout=600)
    assert got.ret == 0, got.stdout.str()[-2000:]
    got.stdout.fnmatch_lines(["*BUILDS AT SESSION START: 1*", "compile * built in * (started ahead): *"])
    got = pytester.runpytest_subprocess(*base, "--kopt-arch", "sm_80", "-k", "preflight", timeout=600)
    got.stdout.fnmatch_lines(["*BUILDS AT SESSION START: 0*"])
    # without --kopt-arch the arch comes from NVML where it can be read, else the builds wait for the first item
    got = pytester.runpytest_subprocess(*base, "-k", "compile", timeout=600)
    assert got.ret == 0, got.stdout.str()[-2000:]
    got.stdout.fnmatch_lines([f"*BUILDS AT SESSION START: {1 if nvml_arch() else 0}*"])
    # under xdist the controller builds while its workers start; the worker's compile item finds the build in the
    # content-addressed cache
    pytester.makefile(".cu", k2=GOOD_CU.replace("256", "128"))
    xbase = [a for a in base if a not in ("-p", "no:xdist")] + ["--kopt-candidate", "k2.cu", "-n", "2"]
    got = pytester.runpytest_subprocess(*xbase, "--kopt-arch", "sm_90a", "-k", "compile", "-v", timeout=600)
    assert got.ret == 0, got.stdout.str()[-2000:]
    got.stdout.fnmatch_lines(["*BUILDS AT SESSION START: [12]*"])  # one thread may serve both
    assert sum("cache hit" in ln for ln in got.stdout.lines) == 2, got.stdout.str()[-2000:]


def test_the_compile_item_imports_hypothesis_only_while_it_waits_for_its_build(monkeypatch: pytest.MonkeyPatch,
                                                                               tmp_path: Path) -> None:
    """hypothesis's pytest plugin imports hypothesis in every terminal summary (0.64 s on the H200): the compile
    item does that import where it would only wait for its build started ahead, in the thread that runs the
    items (a second thread importing it deadlocked), and not when the build is done already."""
    import threading
    from concurrent.futures import Future
    from types import SimpleNamespace

    from pytest_kopt import scheduler
    from pytest_kopt.gates import build
    from pytest_kopt.kinds.builtin import default_kinds
    from pytest_kopt.proc.pool import HarnessPool

    calls: list[str] = []
    monkeypatch.setattr(scheduler, "import_hypothesis", lambda: calls.append(threading.current_thread().name))
    monkeypatch.setattr(build, "ensure_built",
                        lambda ctx: build.BuildResult(str(tmp_path / "k.so"), "key", False, 1.5, ["nvcc"], ""))
    ahead = scheduler.Scheduler(HarnessPool())
    ctx = SimpleNamespace(kind=default_kinds().by_name("cuda"), kernel=tmp_path / "k.cu", arch="sm_90a", ahead=ahead,
                          tool=lambda name: None, collected=frozenset())  # no cuobjdump: no SASS dump started
    pending: Future[None] = Future()
    threading.Timer(0.2, pending.set_result, (None,)).start()
    monkeypatch.setitem(ahead._builds, ctx.kernel, pending)
    out = build.gate_compile(ctx)  # type: ignore[arg-type]
    assert calls == [threading.current_thread().name] and pending.done()
    assert out.figures["compile_s"] == 1.5 and out.summary.startswith("built in 1.5 s")
    finished: Future[None] = Future()
    finished.set_result(None)
    monkeypatch.setitem(ahead._builds, ctx.kernel, finished)
    build.gate_compile(ctx)  # type: ignore[arg-type]
    assert len(calls) == 1


NVCC_LOG = """#!/bin/sh
echo "$@" >> "{log}"
exec "{nvcc}" "$@"
"""


@pytest.mark.skipif(find_tool("nvcc") is None, reason="nvcc not found (PATH, $CUDA_HOME/bin, /usr/local/cuda*/bin)")
def test_a_build_started_early_is_the_compile_items_own(pytester: pytest.Pytester) -> None:
    """A build started before the probe is the one the compile item would make: a kernel that fails to compile
    runs nvcc once (its failure remembered, reported by the compile item with file:line), and one whose contract
    fails runs nvcc never (before, three times and once)."""
    import os

    from test_plugin import GOOD_CU, SCALE_REF

    log = pytester.path / "nvcc.log"
    wrap = pytester.path / "bin" / "nvcc"
    wrap.parent.mkdir()
    wrap.write_text(NVCC_LOG.format(log=log, nvcc=find_tool("nvcc")))
    wrap.chmod(0o755)
    pytester.makefile(".cu", bad=GOOD_CU + "\nthis is not C++;\n",
                      nosolve=GOOD_CU.replace("solve(", "run_it("))
    pytester.makepyfile(ref=SCALE_REF)
    env = {"PATH": f"{wrap.parent}{os.pathsep}{os.environ['PATH']}"}
    for kernel, status in (("bad.cu", "FAILED"), ("nosolve.cu", "")):
        log.unlink(missing_ok=True)
        with pytest.MonkeyPatch.context() as mp:
            for k, v in env.items():
                mp.setenv(k, v)
            got = pytester.runpytest_subprocess("-p", "no:xdist", "--kopt-baseline", kernel, "--kopt-ref", "ref.py",
                                                "--kopt-dims", "n=4096", "--kopt-arch", "sm_90a", timeout=600)
        builds = [ln for ln in (log.read_text().splitlines() if log.exists() else []) if "--version" not in ln]
        if kernel == "bad.cu":
            assert len(builds) == 1, builds
            got.stdout.fnmatch_lines(["*bad.cu:*: error*"])
            assert (pytester.path / ".kopt" / "bad.cu" / "compile_error.json").is_file()
        else:
            assert builds == [], builds
            assert "CONTRACT_ERROR" in got.stdout.str() or "preflight" in got.stdout.str()


NVML_CONFTEST = '''
import json
import sys


class _Nvml:
    """pynvml over {gpus} GPUs of compute capability 9.0: what NVML would say on an H200 machine."""

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return {gpus}

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetCudaComputeCapability(self, handle):
        return (9, 0)


sys.modules["pynvml"] = _Nvml()


def pytest_sessionstart(session):
    from pytest_kopt.plugin.stash import STATE

    pool = session.config.stash[STATE].pool
    print("PROCESSES AT SESSION START:", ",".join(sorted(k[0].split(":")[0] for k in pool.starting)) or "none")
    with open("pids.json", "w") as f:
        json.dump([srv.proc.pid for srv in pool.starting.values()], f)
'''


def _running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not ended (a zombie has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_where_nvml_shows_one_gpu_the_harness_processes_start_at_configure_and_end_with_the_session(
        pytester: pytest.Pytester) -> None:
    """With NVML showing one GPU the first kernel's processes (here the judge and the kernel's correctness process:
    the selection drops timing) are running when the session starts, before collection; when the probe then
    finds no GPU (this machine's case, or a broken driver) they serve what they can, and none outlives the session.
    With two GPUs none starts before the probe."""
    import json

    from test_plugin import GOOD_CU, SCALE_REF

    pytester.makefile(".cu", k=GOOD_CU)
    pytester.makepyfile(ref=SCALE_REF)
    args = ["-s", "-p", "no:xdist", "-p", "no:cacheprovider", "--kopt-baseline", "k.cu", "--kopt-ref", "ref.py",
            "--kopt-dims", "n=4096", "-k", "preflight or plan"]
    pytester.makeconftest(NVML_CONFTEST.replace("{gpus}", "1"))
    got = pytester.runpytest_subprocess(*args, timeout=300)
    got.stdout.fnmatch_lines(["*PROCESSES AT SESSION START: check,judge*"])
    pids = json.loads((pytester.path / "pids.json").read_text())
    assert len(pids) == 2
    assert [p for p in pids if _running(p)] == []
    one = got.ret
    pytester.makeconftest(NVML_CONFTEST.replace("{gpus}", "2"))
    got = pytester.runpytest_subprocess(*args, timeout=300)
    got.stdout.fnmatch_lines(["*PROCESSES AT SESSION START: none*"])
    assert got.ret == one  # the same verdicts either way



def test_the_gpu_marker_in_a_selection_is_the_gates_own(tmp_path: Path) -> None:
    """``-m "not kopt_gpu"`` (a CI's GPU-less selection) drops a ``.cu``'s correctness and timing items, which carry the
    ``kopt_gpu`` marker, and keeps a Triton kernel's correctness (it runs in Triton's interpreter without a GPU): what
    is started early for a selection follows the markers pytest will match."""
    from pytest_kopt.plugin.early import selection_keeps

    cu, py = tmp_path / "k.cu", tmp_path / "k.py"
    py.write_text("import triton\n\n\n@triton.jit\ndef k(x):\n    pass\n")
    not_gpu: Any = _config(tmp_path, markexpr="not kopt_gpu")
    kept = {g: selection_keeps(not_gpu, _state(), cu, g) for g in ("plan", "compile", "correctness", "timing")}
    assert kept == {"plan": True, "compile": True, "correctness": False, "timing": False}
    kept = {g: selection_keeps(not_gpu, _state(), py, g) for g in ("correctness", "timing")}
    assert kept == {"correctness": True, "timing": False}
    assert selection_keeps(_config(tmp_path, markexpr="kopt_gpu"), _state(), cu, "timing")  # type: ignore[arg-type]
    assert not selection_keeps(_config(tmp_path, markexpr="kopt_gpu"), _state(), cu, "plan")  # type: ignore[arg-type]


IN_PROCESS = '''
import json
import sys

import pytest

NVML


class LaterPluginFails:
    @pytest.hookimpl(trylast=True)
    def pytest_configure(self, config):
        from pytest_kopt.plugin.stash import STATE

        pool = config.stash[STATE].pool
        json.dump([srv.proc.pid for srv in pool.starting.values()], open("pids.json", "w"))
        raise pytest.UsageError("a later plugin's usage error")


rc = pytest.main(["-p", "no:xdist", "-p", "no:cacheprovider", "--kopt-baseline", "k.cu", "--kopt-ref", "ref.py",
                  "--kopt-dims", "n=4096"], plugins=[LaterPluginFails()])
print("RC", int(rc))
'''


def test_a_session_ended_at_configure_in_process_leaves_no_harness_process(pytester: pytest.Pytester) -> None:
    """pytest.main() in a long-lived process (an IDE, a notebook) whose configure fails after kopt's (another
    plugin's usage error): the harness processes kopt started at configure end when pytest.main returns, not at the
    caller's exit."""
    import json
    import subprocess
    import sys

    from test_plugin import GOOD_CU, SCALE_REF

    pytester.makefile(".cu", k=GOOD_CU)
    pytester.makepyfile(ref=SCALE_REF)
    nvml = NVML_CONFTEST.replace("{gpus}", "1").split("\n\ndef pytest_sessionstart")[0]
    script = pytester.path / "inproc.py"
    script.write_text(IN_PROCESS.replace("NVML", nvml) + '''
import os
pids = json.load(open("pids.json"))
def running(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
print("STARTED", len(pids), "RUNNING", [p for p in pids if running(p)])
''')
    got = subprocess.run([sys.executable, str(script)], cwd=pytester.path, capture_output=True, text=True,
                         timeout=300)
    lines = [ln for ln in got.stdout.splitlines() if ln.startswith(("RC", "STARTED"))]
    assert lines == ["RC 4", "STARTED 4 RUNNING []"], got.stdout[-2000:] + got.stderr[-2000:]
    assert json.loads((pytester.path / "pids.json").read_text())
