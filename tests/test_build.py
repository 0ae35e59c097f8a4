"""Tests for pytest_kopt.kinds.nvcc and pytest_kopt.gates.build: nvcc builds into the content-addressed cache,
compile errors, header tracking.

The nvcc tests compile for sm_90a (no GPU is needed to build); the module is skipped when nvcc is missing.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Callable

import pytest

from pytest_kopt.errors import CompileError, HardwareError
from pytest_kopt.gates.build import BuildResult
from pytest_kopt.gates.contract import local_headers
from pytest_kopt.gates.hardware import find_tool, tool_version
from pytest_kopt.kinds.nvcc import build_cuda, format_nvcc_errors, nvcc_command

NVCC = find_tool("nvcc")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(NVCC is None, reason="nvcc not found (PATH, $CUDA_HOME/bin, /usr/local/cuda*/bin)"),
]
ARCH = "sm_90a"

KERNEL = """\
#include "h.cuh"

__global__ void scale_k(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = SCALE * x[i];
}

extern "C" void solve(const float* x, float* y, int n) {
    scale_k<<<(n + 255) / 256, 256>>>(x, y, n);
}
"""


def _build(source: Path, cache: Path, **kw) -> BuildResult:
    return build_cuda(source, ARCH, cache, NVCC, tool_version(NVCC) if NVCC else None, False, **kw)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """One real build (h.cuh with SCALE 2.0f), then a second call on the same source, then a header edit."""
    src_dir = tmp_path_factory.mktemp("src")
    cache = tmp_path_factory.mktemp("cache")
    source = src_dir / "scale.cu"
    source.write_text(KERNEL)
    header = src_dir / "h.cuh"
    header.write_text("#pragma once\n#define SCALE 2.0f\n")
    first = _build(source, cache)
    second = _build(source, cache)
    header.write_text("#pragma once\n#define SCALE 3.0f\n")
    edited = _build(source, cache)
    return {"source": source, "header": header, "cache": cache, "first": first, "second": second, "edited": edited}


def test_first_build_writes_library_and_manifest(built):
    r, cache = built["first"], built["cache"]
    assert r.cache_hit is False
    assert re.fullmatch(r"[0-9a-f]{24}", r.key)
    assert r.artifact == str(cache / r.key / "kernel.so")
    assert Path(r.artifact).is_file()
    assert Path(r.artifact).read_bytes()[:4] == b"\x7fELF"
    assert not list((cache / r.key).glob("kernel.so*.tmp"))  # the build's own temporary output, renamed
    assert r.seconds > 0.0
    assert r.command[0] == NVCC
    assert "-gencode=arch=compute_90a,code=sm_90a" in r.command
    assert str(built["source"]) in r.command
    assert str(cache / r.key / "kopt_shim.cu") in r.command
    manifest = json.loads((cache / r.key / "manifest.json").read_text())
    assert manifest["command"] == r.command
    assert manifest["headers"] == [str(built["header"].resolve())]
    assert manifest["parts"]["arch"] == ARCH


def test_library_sass_follows_the_header(built):
    cuobjdump = find_tool("cuobjdump")
    if cuobjdump is None:
        pytest.skip("cuobjdump not found (no CUDA toolkit bin/ and no triton wheel)")
    from pytest_kopt.gates.sass import dump_sass
    (first,) = dump_sass(cuobjdump, [built["first"].artifact])
    (edited,) = dump_sass(cuobjdump, [built["edited"].artifact])
    assert first.name == edited.name == "_Z7scale_kPKfPfi"
    assert first.arch == edited.arch == "sm_90a"
    # SCALE 2.0f * x compiles to x + x; after the header edit, 3.0f * x is a multiply
    assert (first.opcodes.get("FADD"), first.opcodes.get("FMUL")) == (1, None)
    assert (edited.opcodes.get("FADD"), edited.opcodes.get("FMUL")) == (None, 1)
    assert first.opcodes["LDG.E"] == first.opcodes["STG.E"] == 1


def test_second_call_is_a_cache_hit(built):
    first, second = built["first"], built["second"]
    assert second.cache_hit is True
    assert second.key == first.key
    assert second.artifact == first.artifact
    assert second.seconds == 0.0
    assert second.command == first.command


def test_header_edit_changes_key_and_rebuilds(built):
    first, edited = built["first"], built["edited"]
    assert edited.key != first.key
    assert edited.cache_hit is False
    assert Path(edited.artifact).is_file()
    assert Path(first.artifact).is_file()  # the old build stays in the cache
    assert sorted(p.name for p in built["cache"].iterdir()) == sorted([first.key, edited.key])


BAD = """\
extern "C" void solve(const float* x, float* y, int n) {
    int a = 0;
    int b = a +;
    y[0] = x[0] + b;
}
"""


def test_syntax_error_raises_compile_error_with_line(tmp_path):
    source = tmp_path / "bad.cu"
    source.write_text(BAD)
    with pytest.raises(CompileError) as info:
        _build(source, tmp_path / "cache", display="kernels/bad.cu")
    err = info.value
    assert err.gate == "compile"
    assert err.path == "kernels/bad.cu"
    assert err.line == 3
    assert "kernels/bad.cu:3: error: expected an expression" in err.details
    assert f"{source}(3)" not in err.details
    assert err.message.startswith("nvcc failed (exit ")
    # the fix says where nvcc's output is (a JSON report has nothing "above"), and that file holds all of it
    log = next((tmp_path / "cache").glob("*/nvcc_error.log"))
    assert err.fix == f"fix the errors nvcc reported (this item's details; all its output: {log})"
    assert "error: expected an expression" in log.read_text() and log.read_text().startswith("$ ")
    assert err.render().startswith("[compile] COMPILE_ERROR: kernels/bad.cu:3: nvcc failed")
    assert list((tmp_path / "cache").glob("*/kernel.so")) == []


def test_error_in_a_header_is_not_put_on_the_source_line(tmp_path):
    (tmp_path / "h.cuh").write_text("#pragma once\n\nint broken = ;\n")
    source = tmp_path / "k.cu"
    source.write_text('#include "h.cuh"\nextern "C" void solve(float* y, int n) { y[0] = n; }\n')
    with pytest.raises(CompileError) as info:
        _build(source, tmp_path / "cache", display="k.cu")
    err = info.value
    assert f"{tmp_path / 'h.cuh'}:3: error: expected an expression" in err.details
    assert err.path == "k.cu"
    assert err.line is None


def test_timeout_raises_compile_error(tmp_path):
    source = tmp_path / "k.cu"
    source.write_text('extern "C" void solve(float* y, int n) { y[0] = n; }\n')
    with pytest.raises(CompileError, match=r"nvcc ran past 0 s") as info:
        _build(source, tmp_path / "cache", timeout_s=0.01, display="k.cu")
    assert info.value.path == "k.cu"
    assert "--kopt-timeout" in info.value.fix


def test_missing_nvcc_raises_hardware_error(tmp_path):
    source = tmp_path / "k.cu"
    source.write_text(KERNEL)
    with pytest.raises(HardwareError) as info:
        build_cuda(source, ARCH, tmp_path / "cache", None, None, False)
    assert info.value.gate == "compile"
    assert "nvcc not found" in info.value.message
    assert info.value.fix
    assert not (tmp_path / "cache").exists()


def test_nvcc_that_cannot_run_raises_hardware_error(tmp_path):
    fake = tmp_path / "nvcc"
    fake.write_text("not executable")
    source = tmp_path / "k.cu"
    source.write_text('extern "C" void solve(float* y, int n) { y[0] = n; }\n')
    with pytest.raises(HardwareError) as info:
        build_cuda(source, ARCH, tmp_path / "cache", str(fake), None, False)
    assert info.value.gate == "compile"
    assert "nvcc could not run" in info.value.message
    assert info.value.fix


# ---- pure helpers (no nvcc run) ----

def test_format_nvcc_errors_rewrites_the_source_only():
    source = Path("/work/run/kernel.cu")
    log = ("/work/run/kernel.cu(12): error: identifier \"foo\" is undefined\n"
           "      foo(1);\n"
           "      ^\n"
           "\n"
           "/work/run/kernel.cu(30): warning #177-D: variable \"t\" was declared but never referenced\n"
           "/usr/include/h.cuh(4): error: expected a \";\"\n"
           "kernel.cu(7): error: relative path form\n"
           "2 errors detected in the compilation of \"/work/run/kernel.cu\".\n")
    assert format_nvcc_errors(log, source, "kernels/kernel.cu") == (
        "kernels/kernel.cu:12: error: identifier \"foo\" is undefined\n"
        "      foo(1);\n"
        "      ^\n"
        "\n"
        "kernels/kernel.cu:30: warning #177-D: variable \"t\" was declared but never referenced\n"
        "/usr/include/h.cuh:4: error: expected a \";\"\n"
        "kernels/kernel.cu:7: error: relative path form\n"
        "2 errors detected in the compilation of \"/work/run/kernel.cu\".\n")


def test_format_nvcc_errors_leaves_other_text_alone():
    log = "ptxas info    : Used 10 registers\nnvcc fatal   : Unsupported gpu architecture 'compute_99'\n"
    assert format_nvcc_errors(log, Path("k.cu"), "k.cu") == log


def test_local_headers_recursion(tmp_path):
    (tmp_path / "inc").mkdir()
    (tmp_path / "extra").mkdir()
    (tmp_path / "k.cu").write_text('#include "a.cuh"\n#include <cuda_runtime.h>\n  #  include "inc/b.cuh"\n'
                                   '// not followed: #include "missing.cuh"\n')
    (tmp_path / "a.cuh").write_text('#pragma once\n#include "inc/b.cuh"\n')
    # b.cuh includes c.cuh relative to its own folder, and a.cuh back again (a cycle)
    (tmp_path / "inc" / "b.cuh").write_text('#include "c.cuh"\n#include "../a.cuh"\n#include "e.cuh"\n')
    (tmp_path / "inc" / "c.cuh").write_text("#define C 1\n")
    (tmp_path / "extra" / "e.cuh").write_text('#include "f.cuh"\n')
    (tmp_path / "extra" / "f.cuh").write_text("\n")
    assert local_headers(tmp_path / "k.cu") == sorted([
        (tmp_path / "a.cuh").resolve(), (tmp_path / "inc" / "b.cuh").resolve(), (tmp_path / "inc" / "c.cuh").resolve()])
    assert local_headers(tmp_path / "k.cu", include_dirs=(tmp_path / "extra",)) == sorted([
        (tmp_path / "a.cuh").resolve(), (tmp_path / "inc" / "b.cuh").resolve(), (tmp_path / "inc" / "c.cuh").resolve(),
        (tmp_path / "extra" / "e.cuh").resolve(), (tmp_path / "extra" / "f.cuh").resolve()])


def test_local_headers_none_and_missing_source(tmp_path):
    (tmp_path / "k.cu").write_text("#include <cstdio>\nint main() {}\n")
    assert local_headers(tmp_path / "k.cu") == []
    assert local_headers(tmp_path / "nope.cu") == []


def test_nvcc_command_flags():
    cmd = nvcc_command("nvcc", Path("/s/k.cu"), Path("/c/shim.cu"), Path("/c/o.so"), "sm_90a", (Path("/inc"),), False)
    assert cmd == ["nvcc", "-O3", "-lineinfo", "-std=c++17", "-shared", "-Xcompiler", "-fPIC",
                   "-gencode=arch=compute_90a,code=sm_90a", "-o", "/c/o.so", "/s/k.cu", "/c/shim.cu", "-I", "/inc"]
    cut = nvcc_command("nvcc", Path("k.cu"), Path("shim.cu"), Path("o.so"), "sm_80", (), True)
    assert cut[:3] == ["nvcc", "--expt-relaxed-constexpr", "--expt-extended-lambda"]
    assert "-gencode=arch=compute_80,code=sm_80" in cut


@pytest.mark.parametrize("how", ["nvcc's compiler died", "nvcc itself killed"])
def test_an_interrupted_build_is_not_the_kernels_error(tmp_path: Path, how: str) -> None:
    """Ctrl-C reaches nvcc's process group (a build started ahead runs in a thread of the pytest process, which
    lives on): the build fails as INTERRUPTED, which ensure_built never remembers in compile_error.json, so the next
    session builds again instead of reporting "failed before"."""
    from pytest_kopt.gates.build import INTERRUPTED

    source = tmp_path / "k.cu"
    source.write_text(KERNEL)
    fake = tmp_path / "nvcc"
    # the killed nvcc restores SIGINT's default first: a shell started in the background (nohup, `cmd &`) inherits
    # SIGINT ignored, and `kill -INT $$` from sh would then exit 0
    fake.write_text("#!/bin/sh\necho \"nvcc error   : 'gcc' died due to signal 2\" >&2; exit 2\n"
                    if how == "nvcc's compiler died" else
                    f"#!{sys.executable}\nimport os, signal\nsignal.signal(signal.SIGINT, signal.SIG_DFL)\n"
                    "os.kill(os.getpid(), signal.SIGINT)\n")
    fake.chmod(0o755)
    with pytest.raises(CompileError) as info:
        build_cuda(source, ARCH, tmp_path / "cache", str(fake), None, False)
    assert info.value.status == INTERRUPTED and "interrupted" in info.value.message, info.value.message


def test_a_triton_build_key_follows_the_precision(tmp_path: Path) -> None:
    """--kopt-precision changes a Triton build's key (fp16 inputs specialize its kernels to other cubins), and a
    session without it keeps the key it had before the precision was a part."""
    from pytest_kopt.kinds.triton import triton_key

    kernel = tmp_path / "k.py"
    kernel.write_text("import triton\n")
    args = (kernel, "sm_90a", {"N": 1024}, "cuda", "3.6.0")
    plain, parts = triton_key(*args)
    assert "precision" not in parts
    assert triton_key(*args, None)[0] == plain
    fp16, bf16 = triton_key(*args, "fp16")[0], triton_key(*args, "bf16")[0]
    assert len({plain, fp16, bf16}) == 3


def test_a_triton_build_mark_follows_the_precision_only_where_given() -> None:
    """The remembered compile failure's mark: the dims alone without --kopt-precision (as before it counted), the
    dims and the precision with it."""
    from types import SimpleNamespace

    from pytest_kopt.kinds.triton import TritonKind

    def inputs(precision):
        return TritonKind().build_inputs(SimpleNamespace(build_dims={"N": 8},
                                                         settings=SimpleNamespace(precision=precision)))

    assert inputs(None) == ({"N": 8},) and inputs("fp16") == ({"N": 8}, "fp16")


def _jit_stand_in(made: list[dict]) -> Callable[[dict], dict]:
    """A Triton build's harness on a GPU, stood in: the JIT's compile of the session's shape, one cubin in a
    hashed folder of the request's TRITON_CACHE_DIR; each request is appended to ``made``."""

    def run_child(req: dict) -> dict:
        made.append(req)
        out = Path(req["env"]["TRITON_CACHE_DIR"]) / "AAAA"
        out.mkdir(parents=True, exist_ok=True)
        (out / "k_kernel.cubin").write_bytes(b"session shape")
        return {"mode": "jit"}

    return run_child


def test_a_triton_builds_cubins_are_its_own_not_the_specializations_compiled_there_later(tmp_path: Path) -> None:
    """The build folder is the kernel's TRITON_CACHE_DIR: its correctness requests JIT-compile other shapes'
    specializations there after the build (the softmax example's boundary cases left 4 cubins beside the build's
    one on an H100, 2026-12-07, and the sass item dumped and judged all four). A cache hit gives the cubins the
    build made, as its manifest lists them."""
    from pytest_kopt.kinds.triton import build_triton

    kernel = tmp_path / "k.py"
    kernel.write_text("import triton\n")
    made: list[dict] = []
    run_child = _jit_stand_in(made)
    args = (kernel, tmp_path / "ref.py", {"N": 1024}, 1, ARCH, tmp_path / "cache", "cuda", "3.6.0", run_child)
    first = build_triton(*args)
    assert not first.cache_hit and [Path(c).name for c in first.cubins] == ["k_kernel.cubin"]
    later = Path(first.artifact) / "BBBB"  # a boundary case's specialization, JIT-compiled by a correctness request
    later.mkdir()
    (later / "k_kernel.cubin").write_bytes(b"N=37")
    again = build_triton(*args)
    assert again.cache_hit and again.cubins == first.cubins and len(made) == 1
    (Path(first.cubins[0])).unlink()  # the build's own cubin gone: built again, not read from what is left
    third = build_triton(*args)
    assert not third.cache_hit and len(made) == 2 and third.cubins == first.cubins  # the leftover is not listed


@pytest.mark.parametrize("listed", [["../../../decoy.cubin"], ["/etc/hostname"], [7], "AAAA/k_kernel.cubin", [],
                                    ["AAAA/k_kernel.ptx"]])
def test_a_triton_manifest_that_lists_other_files_is_built_again(tmp_path: Path, listed: object) -> None:
    """The manifest lies in the build cache, which the kernel's processes can write to: an entry outside the build's
    folder, not a cubin, or not a string (or no list) makes the build run again, never a crash or a foreign file
    read as the build's SASS."""
    from pytest_kopt.kinds.triton import build_triton

    kernel = tmp_path / "k.py"
    kernel.write_text("import triton\n")
    (tmp_path / "decoy.cubin").write_bytes(b"decoy")
    made: list[dict] = []
    run_child = _jit_stand_in(made)
    args = (kernel, tmp_path / "ref.py", {"N": 1024}, 1, ARCH, tmp_path / "cache", "cuda", "3.6.0", run_child)
    first = build_triton(*args)
    manifest = Path(first.artifact).parent / "manifest.json"
    doc = json.loads(manifest.read_text())
    doc["cubins"] = listed
    manifest.write_text(json.dumps(doc))
    again = build_triton(*args)
    assert not again.cache_hit and len(made) == 2 and again.cubins == first.cubins
