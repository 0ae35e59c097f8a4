"""The one-house layout: the gate table drives collection and blocking, artifacts have one home per kernel, the
build cache keys the right file, the wheel carries the registries, the plugin imports nothing heavy, the child
package stands alone. Tests run sessions through ``--kopt-json`` (pytest's ``RunAndParse`` idea), not the
terminal text."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from pytest_kopt.gates import hardware
from pytest_kopt.gates.builtin import default_table
from pytest_kopt.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "pytest_kopt"
needs_nvcc = pytest.mark.skipif(hardware.find_tool("nvcc") is None, reason="nvcc not found")
needs_triton = pytest.mark.skipif(__import__("importlib.util").util.find_spec("triton") is None,
                                  reason="triton not installed")

SCALE_REF = """\
atol = 1e-6
rtol = 1e-6
def reference(x, y, **_):
    y.copy_(2 * x)
"""
TRITON_SCALE = """\
import torch
import triton
import triton.language as tl


@triton.jit
def {name}(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(y_ptr + offs, {op}, mask=m)


def setup(n, seed, device="cuda"):
    x = torch.empty(n, device=device)
    return {{"inputs": {{"x": x, "y": torch.empty_like(x)}}, "outputs": ["y"]}}


def run_kernel(x, y):
    {name}[(triton.cdiv(x.numel(), 256),)](x, y, x.numel(), BLOCK=256)
"""


def session(pytester: pytest.Pytester, *args: str, json_name: str = "r.json") -> tuple[pytest.RunResult, dict]:
    """A pytest session in a subprocess and its ``--kopt-json`` report."""
    result = pytester.runpytest_subprocess(*args, "--kopt-json", json_name, timeout=600)
    path = pytester.path / json_name
    assert path.is_file(), result.stdout.str()[-3000:]
    return result, json.loads(path.read_text())


def by_item(doc: dict) -> dict[str, dict]:
    return {i["nodeid"]: i for i in doc["items"]}


@needs_triton
def test_a_failed_build_blocks_later_gates_without_running_them_again(pytester: pytest.Pytester,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A Triton file whose build fails (run_kernel raises, as an unpinned @triton.autotune does without a driver):
    compile fails once; every correctness item and sass skip as blocked by compile, and the kernel's code ran
    once in the whole session (before, each later gate ran it again and failed with the same error)."""
    log = pytester.path / "calls.log"
    monkeypatch.setenv("KOPT_TEST_LOG", str(log))
    pytester.makepyfile(ref=SCALE_REF, k=TRITON_SCALE.format(name="scale", op="2 * tl.load(x_ptr + offs, mask=m)")
                        .replace('def run_kernel(x, y):\n', 'def run_kernel(x, y):\n    import os\n    open(os.environ['
                                 '"KOPT_TEST_LOG"], "a").write("call\\n")\n    raise RuntimeError("0 active drivers")\n'))
    result, doc = session(pytester, "--kopt-baseline", "k.py", "--kopt-ref", "ref.py", "--kopt-dims", "n=64",
                          "--kopt-seeds", "1,2,3", "-p", "no:cacheprovider")
    items = by_item(doc)
    # the build's call of run_kernel failed: a compile error, pointing at the line of k.py that raised
    compile_ = items["k.py::compile"]
    assert compile_["status"] == "COMPILE_ERROR", result.stdout.str()[-3000:]
    assert (compile_["path"], compile_["message"]) == ("k.py", "run_kernel() raised RuntimeError: 0 active drivers")
    assert compile_["line"] and "pytest_kopt" not in compile_["details"], compile_
    blocked = [n for n in items if n.startswith("k.py::correctness") or n == "k.py::sass"]
    assert len(blocked) == 4
    for n in blocked:
        assert (items[n]["outcome"], items[n]["blocked_by"]) == ("skipped", "compile"), items[n]
        assert "0 active drivers" in items[n]["message"]
        assert items[n]["fix"].startswith("make the compile item pass"), items[n]
    assert log.read_text().splitlines() == ["call"]
    assert doc["exit_code"] == result.ret == 2


def test_a_contract_error_shows_the_users_frames_only_and_a_specific_fix(pytester: pytest.Pytester) -> None:
    """A setup() that builds a buffer of another shape than ref.shapes() says: the plan item's CONTRACT_ERROR points
    at that setup(), names the buffer, both shapes and what to change, with none of kopt's own frames (protocol.py,
    plan.py, inputs.py)."""
    pytester.makepyfile(ref=SCALE_REF + 'def shapes(n):\n    return {"x": ((n, 2), "float32"), "y": ((n, 2), '
                                        '"float32")}\n',
                        k='import torch\ndef setup(n, seed, device="cpu"):\n    x = torch.empty(n, device=device)\n'
                          '    return {"inputs": {"x": x, "y": torch.empty_like(x)}, "outputs": ["y"]}\n'
                          'def run_kernel(x, y):\n    y.copy_(2 * x)\n')
    result, doc = session(pytester, "--kopt-baseline", "k.py", "--kopt-ref", "ref.py", "--kopt-dims", "n=64",
                          "--kopt-seeds", "1", "-k", "plan", "-p", "no:cacheprovider")
    plan = by_item(doc)["k.py::plan"]
    assert plan["status"] == "CONTRACT_ERROR" and result.ret == 4, result.stdout.str()[-3000:]
    assert "'x' is float32[64]" in plan["message"] and "float32[64, 2]" in plan["message"]
    assert plan["fix"].startswith("make the candidate's setup() build x as float32[64, 2] at these dims"), plan
    assert plan["details"] is None and "pytest_kopt" not in result.stdout.str(), result.stdout.str()[-3000:]
    assert (plan["path"], plan["line"]) == ("k.py", 2)  # the candidate's setup(), which built the buffer


@pytest.mark.parametrize("role", ["baseline", "candidate"])
def test_a_syntax_error_in_a_kernel_file_is_a_preflight_contract_error(pytester: pytest.Pytester,
                                                                       role: str) -> None:
    """A Triton/Python kernel that does not parse: preflight fails as CONTRACT_ERROR naming file:line (exit 4) and
    the later gates are blocked by preflight; collection goes on, so a good baseline beside it is still judged."""
    broken = "import torch\nimport triton\n\ndef setup(n, seed\n    return {}\n"
    pytester.makepyfile(ref=SCALE_REF, bad=broken, good=BROKEN_PY.replace("y.copy_(x)", "y.copy_(2 * x)"))
    kernels = ["--kopt-baseline", "bad.py"] if role == "baseline" else ["--kopt-baseline", "good.py",
                                                                       "--kopt-candidate", "bad.py"]
    result, doc = session(pytester, *kernels, "--kopt-ref", "ref.py", "--kopt-dims", "n=64", "--kopt-seeds", "1",
                          "-p", "no:cacheprovider")
    items = by_item(doc)
    pre = items["bad.py::preflight"]
    assert pre["status"] == "CONTRACT_ERROR" and "syntax error" in pre["message"], result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(["*[[]preflight[]] CONTRACT_ERROR: *bad.py:4: syntax error*"])
    assert items["bad.py::compile"]["blocked_by"] == "preflight"
    assert items["bad.py::correctness[seed=1]"]["blocked_by"] == "preflight"
    if role == "candidate":
        assert items["good.py::correctness[seed=1]"]["status"] == "PASSED"
    assert doc["exit_code"] == result.ret == 4


@needs_triton
def test_two_triton_files_of_one_folder_get_their_own_build(pytester: pytest.Pytester) -> None:
    """a.py and b.py beside each other: each has its own build key and its own SASS (before, the key covered the
    folder's .py files but not which one was built, so b.py got a.py's cubins: a PR gate of main.py vs pr.py
    reported the baseline's SASS for the candidate)."""
    pytester.makepyfile(ref=SCALE_REF, a=TRITON_SCALE.format(name="add_one", op="tl.load(x_ptr + offs, mask=m) + 1"),
                        b=TRITON_SCALE.format(name="mul_two", op="tl.load(x_ptr + offs, mask=m) * 2"))
    result, doc = session(pytester, "--kopt-baseline", "a.py", "--kopt-candidate", "b.py", "--kopt-ref", "ref.py",
                          "--kopt-dims", "n=1024", "--kopt-seeds", "1", "-k", "compile or sass", "-p",
                          "no:cacheprovider")
    items = by_item(doc)
    assert items["a.py::compile"]["status"] == items["b.py::compile"]["status"] == "PASSED", \
        result.stdout.str()[-3000:]
    assert items["a.py::compile"]["figures"]["build_key"] != items["b.py::compile"]["figures"]["build_key"]
    assert "add_one" in items["a.py::sass"]["summary"] and "mul_two" not in items["a.py::sass"]["summary"]
    assert "mul_two" in items["b.py::sass"]["summary"] and "add_one" not in items["b.py::sass"]["summary"]


def test_kernels_of_one_stem_have_their_own_artifact_folders(tmp_path: Path) -> None:
    """softmax_cuda/softmax.cu and softmax_triton/softmax.py, in one session or in two: two folders, named after
    each kernel's path (before, both wrote .kopt/softmax/ when run in separate sessions)."""
    base = tmp_path.resolve()
    a, b = base / "softmax_cuda" / "softmax.cu", base / "softmax_triton" / "softmax.py"
    alone = [Settings(baseline=k, invocation_dir=base, outdir=base / ".kopt").artifact_dir(k) for k in (a, b)]
    together = Settings(baseline=a, candidates=(b,), invocation_dir=base, outdir=base / ".kopt")
    assert alone == [together.artifact_dir(a), together.artifact_dir(b)]
    assert alone == [base / ".kopt" / "softmax_cuda" / "softmax.cu", base / ".kopt" / "softmax_triton" / "softmax.py"]
    outside = Path("/elsewhere/k.cu")
    assert together.artifact_dir(outside).parent.parent == base / ".kopt" / "_external"


@needs_nvcc
def test_a_fixed_compile_error_leaves_no_stale_record(pytester: pytest.Pytester) -> None:
    """compile_error.json remembers a failed build (the same sources are not built again); once the kernel builds
    it is removed, so no stale error stays in the kernel's folder."""
    good = (ROOT / "tests" / "test_plugin.py").read_text().split('GOOD_CU = """\\\n')[1].split('"""')[0]
    pytester.makefile(".cu", k=good.replace("y[i] = 2.0f * x[i];", "y[i] = 2.0f * x[i]"))
    pytester.makepyfile(ref=SCALE_REF)
    args = ["--kopt-baseline", "k.cu", "--kopt-ref", "ref.py", "--kopt-dims", "n=64", "-k", "compile",
            "--kopt-seeds", "1"]
    _, doc = session(pytester, *args)
    assert by_item(doc)["k.cu::compile"]["status"] == "COMPILE_ERROR"
    record = pytester.path / ".kopt" / "k.cu" / "compile_error.json"
    assert record.is_file()
    (pytester.path / "k.cu").write_text(good)
    _, doc = session(pytester, *args)
    assert by_item(doc)["k.cu::compile"]["status"] == "PASSED"
    assert not record.exists()


@needs_nvcc
def test_a_torn_build_manifest_is_built_again(tmp_path: Path) -> None:
    """The manifest is written atomically; a truncated one (a build killed mid-write by an older version, or a
    full disk) reads as no manifest, and the kernel is built again instead of every later run failing with a raw
    JSONDecodeError until --cache-clear."""
    from pytest_kopt.kinds.nvcc import build_cuda

    nvcc = hardware.find_tool("nvcc")
    good = (ROOT / "tests" / "test_plugin.py").read_text().split('GOOD_CU = """\\\n')[1].split('"""')[0]
    src = tmp_path / "k.cu"
    src.write_text(good)
    first = build_cuda(src, "sm_90a", tmp_path / "builds", nvcc, hardware.tool_version(nvcc), False)
    manifest = Path(first.artifact).parent / "manifest.json"
    assert json.loads(manifest.read_text())["command"] == first.command
    manifest.write_text('{"command": ["nvcc", "-O3"')
    again = build_cuda(src, "sm_90a", tmp_path / "builds", nvcc, hardware.tool_version(nvcc), False)
    assert (again.cache_hit, again.key) == (False, first.key)
    assert json.loads(manifest.read_text())["command"] == again.command


BROKEN_PY = """\
import torch
def setup(n, seed, device="cuda"):
    x = torch.empty(n, device=device)
    return {"inputs": {"x": x, "y": torch.empty_like(x)}, "outputs": ["y"]}
def run_kernel(x, y):
    y.copy_(x)
"""


def test_lf_reruns_the_recorded_failures_with_their_seed(pytester: pytest.Pytester) -> None:
    """--lf after failed correctness items runs those items again, and only those, even when a session with
    another seed came in between (the failures' node ids carry their seeds: --lf takes the seed of the last
    session that failed)."""
    pytester.makepyfile(ref=SCALE_REF, k=BROKEN_PY)
    args = ["--kopt-baseline", "k.py", "--kopt-ref", "ref.py", "--kopt-dims", "n=64", "-p", "no:xdist"]
    _, first = session(pytester, *args, json_name="first.json")
    failed = sorted(i["nodeid"] for i in first["items"] if i["outcome"] == "failed")
    assert len(failed) == 5 and all("correctness[seed=" in n for n in failed)
    _, other = session(pytester, *args, "-k", "hardware", "--kopt-seed", "12345", json_name="other.json")
    assert [i["outcome"] for i in other["items"]] == ["passed"]
    result, again = session(pytester, *args, "--lf", json_name="again.json")
    assert sorted(i["nodeid"] for i in again["items"]) == failed, result.stdout.str()[-2000:]


def test_gate_table_drives_collection() -> None:
    """The table's rows are the items' gates, in order; only serial gates are GPU gates, and only the gates with
    cases have several items."""
    gates = default_table().gates
    assert [g.name for g in gates] == ["hardware", "preflight", "plan", "compile", "correctness", "sanitizer", "timing",
                                       "ncu", "roofline", "sass"]
    assert {g.name for g in gates if g.cases} == {"correctness", "sanitizer", "timing"}
    assert {g.name for g in gates if not g.per_branch} == {"ncu", "roofline"}
    for g in gates:
        assert all(n in [x.name for x in gates[:gates.index(g)]] for n in g.needs), g.name


def test_child_imports_nothing_from_gates_or_plugin() -> None:
    """What runs in a harness process stands alone: no module of pytest_kopt/child/ imports pytest_kopt.gates or
    pytest_kopt.plugin (or pytest)."""
    bad = []
    for path in (PACKAGE / "child").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                mod = ("." * node.level) + (node.module or "")
                names = [mod]
            for n in names:
                if any(part in n for part in ("gates", "plugin")) or n.split(".")[0] == "pytest":
                    bad.append(f"{path.name}: {n}")
    assert not bad, bad


def test_only_the_plugin_package_imports_pytest() -> None:
    """Gate logic is plain Python: pytest is imported in pytest_kopt/plugin/ alone."""
    users = []
    for path in PACKAGE.rglob("*.py"):
        if path.parent.name == "plugin":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import) and any(a.name.split(".")[0] in ("pytest", "_pytest") for a in node.names):
                users.append(str(path.relative_to(PACKAGE)))
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in ("pytest", "_pytest"):
                users.append(str(path.relative_to(PACKAGE)))
    assert not users, users


def test_the_plugin_imports_no_torch_numpy_or_triton() -> None:
    """Importing the plugin (what every pytest session does through the entry point) loads neither torch, triton,
    numpy, hypothesis nor matplotlib; the import's wall time is printed by benchmarks/import_time.py, not judged
    here."""
    code = ("import sys, pytest_kopt.plugin; "
            "print(sorted(m for m in ('torch', 'triton', 'numpy', 'hypothesis', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


WHEEL_CHECK = """\
import json, sys
from pathlib import Path
import pytest_kopt
from pytest_kopt import registry
from pytest_kopt.gates import roofline
from pytest_kopt.gates.ncu_csv import parse_ncu_csv

site = Path(pytest_kopt.__file__).resolve().parent
assert registry.REGISTRY_DIR == site / "registries", registry.REGISTRY_DIR
launch = parse_ncu_csv(Path(sys.argv[1]).read_text())[0]
metrics = registry.load(registry.METRICS)
doc = roofline.roofline(roofline.metric_table(launch, metrics), metrics, 0.01, {"flops": 0, "bytes_min": 1e6}, None)
print(json.dumps({"site": str(site), "budget": doc["axis_budget"], "delta_memory": doc["delta_memory"]}))
"""


def _cannot_build_without_isolation() -> str | None:
    """Why this Python cannot build the project's wheel with ``--no-build-isolation`` (no network for an isolated
    build), None when it can: setuptools before 70.1 needs the ``wheel`` package for ``bdist_wheel`` (a virtual
    environment's own setuptools 65.5 without it failed a newcomer's run with "invalid command 'bdist_wheel'")."""
    import importlib.metadata
    import importlib.util

    try:
        version = importlib.metadata.version("setuptools")
    except importlib.metadata.PackageNotFoundError:
        return "setuptools is not installed in this Python: pip install setuptools to build the wheel here"
    parts = [int(x) for x in re.findall(r"\d+", version)[:2]] + [0, 0]
    if tuple(parts[:2]) >= (70, 1) or importlib.util.find_spec("wheel") is not None:
        return None
    return (f"setuptools {version} without the 'wheel' package cannot build a wheel with --no-build-isolation: "
            "pip install wheel (or setuptools>=70.1) in this Python")


@pytest.mark.slow
def test_the_wheel_carries_the_registries(tmp_path: Path) -> None:
    """pip wheel ., installed without -e into a fresh virtual environment (the rest from this Python's
    site-packages): the registries are package data (pytest_kopt/registries/), read by the roofline on a
    recorded ncu export of an H200 and by a --kopt-run session's methods validation (a bad methods.json fails
    naming the registry's rule; a good one gets past validation)."""
    cannot = _cannot_build_without_isolation()
    if cannot:
        pytest.skip(cannot)
    wheels = tmp_path / "wheels"
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                            str(wheels), str(ROOT)], timeout=300, capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = wheels.glob("pytest_kopt-*.whl")
    env_dir = tmp_path / "venv"
    venv.create(env_dir, system_site_packages=True, with_pip=False)
    py = env_dir / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "-q", str(wheel)],
                   check=True, timeout=300, capture_output=True)
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    work = tmp_path / "work"
    work.mkdir()
    (work / "check.py").write_text(WHEEL_CHECK)
    out = subprocess.run([str(py), "check.py", str(ROOT / "tests" / "data" / "ncu" / "details.csv")], cwd=work,
                         capture_output=True, text=True, timeout=120, env=clean)
    assert out.returncode == 0, out.stderr[-2000:]
    doc = json.loads(out.stdout.splitlines()[-1])
    assert doc["site"].startswith(str(env_dir)) and sum(doc["budget"].values()) >= 1
    # a --kopt-run session whose methods.json the wheel's method registry validates
    from pytest_kopt.loop import state as loop

    (work / "ref.py").write_text(SCALE_REF)
    (work / "k.py").write_text(BROKEN_PY)
    run = loop.new_run_dir(work / "k.py")  # a run as --kopt-init seeds it (its state.json is validated)
    loop.init_state(run, work / "k.py", work / "ref.py", {"n": 64}, iterations=1, branches=1, ncu_num=5,
                    noise_pct=2.0, numerics_mode="reference", seeds=[1], env={"sm_arch": "sm_90a"})
    loop.open_iteration(run, 1, ncu_rep=None, roofline={"axis_budget": {"compute": 1, "memory": 1, "latency": 1}},
                        branches=1, ncu_top={})
    (run / "iterv1" / "branches" / "b1" / "kernel.py").write_text(BROKEN_PY)
    (run / "iterv1" / "methods.json").write_text(json.dumps({"methods": [{"id": "memory.no_such_method"}]}))
    bad = subprocess.run([str(py), "-m", "pytest", "--kopt-run", str(run), "-p", "no:cacheprovider"], cwd=work,
                         capture_output=True, text=True, timeout=300, env=clean)
    assert bad.returncode == 4, bad.stdout[-2000:] + bad.stderr[-2000:]
    # the message names the registry where this install keeps it (site-packages for a wheel), a file one can open
    named = re.search(r"memory\.no_such_method: not in (\S+method_registry\.json)", bad.stderr)
    assert named and Path(named.group(1)).is_file() and "site-packages" in named.group(1), bad.stderr[-2000:]
    (run / "iterv1" / "methods.json").write_text(json.dumps({"methods": [{"id": "memory.coalescing"}]}))
    good = subprocess.run([str(py), "-m", "pytest", "--kopt-run", str(run), "-p", "no:cacheprovider", "-k",
                           "hardware"], cwd=work, capture_output=True, text=True, timeout=300, env=clean)
    assert "methods.json is not valid" not in good.stderr, good.stderr[-2000:]
    assert good.returncode in (2, 3), good.stdout[-2000:]  # past validation: the close finds no timed branch
