"""The sass gate's "does no work" rule (EMPTY_KERNEL) judges the kernels a ``.cu`` defines itself, not a library's
kernels compiled in from an included header: CUB compiles ``cub::...::detail::EmptyKernel<void>`` into every file
that includes it and never launches it (issue #41). The parsing is checked on text; the gate on real nvcc builds."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from pytest_kopt.gates import hardware
from pytest_kopt.gates.kernel_names import base_name, global_functions, own_kernels, qualified_name
from pytest_kopt.kinds.cuda import CudaKind, CutlassKind

needs_nvcc = pytest.mark.skipif(hardware.find_tool("nvcc") is None, reason="nvcc not found")

#: cuobjdump's names of a CUB build's two functions (nvcc 13.0, sm_90a): CUB's own, then the file's.
CUB_EMPTY = "_ZN3cub17CUB_300001_SM_9006detail11EmptyKernelIvEEvv"
OWN = "_Z9block_sumPKfPfi"


@pytest.mark.parametrize(("name", "qualified", "base"), [
    ("_Z9block_sumPKfPfi", "block_sum", "block_sum"),
    (CUB_EMPTY, "cub::CUB_300001_SM_900::detail::EmptyKernel", "EmptyKernel"),
    ("_Z1kILi256EEvPf", "k", "k"),  # template <int B> void k<256>(float*): the return type comes first
    ("_ZN2ns3barEv", "ns::bar", "bar"),
    ("_ZN12_GLOBAL__N_13fooEPf", "_anon_::foo", "foo"),
    ("plain_c_kernel", "plain_c_kernel", "plain_c_kernel"),  # extern "C": not mangled
    ("_Zbroken", "_Zbroken", "_Zbroken"),  # the demangler refuses it: the name stays whole
])
def test_sass_names_are_read_back_to_the_source_name(name: str, qualified: str, base: str) -> None:
    assert (qualified_name(name), base_name(name)) == (qualified, base)


def test_global_functions_are_read_through_attributes_templates_and_comments() -> None:
    source = """
    // __global__ void in_a_comment(int) {}
    /* __global__ void in_a_block_comment(int) {} */
    template <int B> __global__ void __launch_bounds__(256, 2) tiled(float* x) {}
    extern "C" __global__ void declared_c(float* x);
    static __global__ __cluster_dims__(2, 1, 1) void clustered(
        const float* __restrict__ a) {}
    __global__ void __attribute__((noinline)) attributed(int) {}
    const char* s = "__global__ void in_a_string(int)";
    __device__ float helper(float x) { return x; }
    """
    assert global_functions(source) == {"tiled", "declared_c", "clustered", "attributed"}


def test_own_kernels_leave_a_headers_kernel_out(tmp_path: Path) -> None:
    cu = tmp_path / "k.cu"
    cu.write_text('#include "local.cuh"\n__global__ void block_sum(const float* x, float* y, int n) {}\n')
    header = tmp_path / "local.cuh"
    header.write_text("template <int B> __global__ void from_header(float* y) {}\n")
    names = [CUB_EMPTY, OWN, "_Z11from_headerILi4EEvPf", "_Zbroken"]
    # a name the demangler cannot read stays the candidate's: no tool missing switches the rule off
    assert own_kernels([cu, header], names) == [OWN, "_Z11from_headerILi4EEvPf", "_Zbroken"]
    # no __global__ kopt can read (a macro writes them): every function stays the candidate's
    macro = tmp_path / "m.cu"
    macro.write_text("#define KERNEL(n) __global__ void n(float* y)\nKERNEL(k) {}\n")
    assert global_functions(macro.read_text()) == {"n"}
    empty = tmp_path / "e.cu"
    empty.write_text('extern "C" void solve(const float* x, float* y, int n) {}\n')
    assert own_kernels([empty], names) is None


def test_cutlass_kernel_templates_stay_the_candidates(tmp_path: Path) -> None:
    """A CUTLASS .cu instantiates CUTLASS's kernel templates with its own kernel: one compiled out by CUTLASS's arch
    guards is the candidate's work lost, so the CUTLASS kind keeps them (and still leaves CUB's out); the CUDA kind
    does not."""
    cu = tmp_path / "g.cu"
    cu.write_text("#include <cutlass/gemm/device/gemm.h>\n__global__ void epilogue(float* y) {}\n")
    ctx = SimpleNamespace(kernel=cu)
    cutlass_kernel = "_ZN7cutlass13device_kernelIiEEvv"  # void cutlass::device_kernel<int>()
    names = [CUB_EMPTY, cutlass_kernel, "_Z8epiloguePf"]
    assert CutlassKind().own_functions(ctx, names) == [cutlass_kernel, "_Z8epiloguePf"]
    assert CudaKind().own_functions(ctx, names) == ["_Z8epiloguePf"]


# ------------------------------------------------------------------------------ the gate on real nvcc builds

CUB_CU = """\
#include <cub/cub.cuh>
// One partial sum per block of 512 floats, with CUB's block-wide load and reduction.
constexpr int THREADS = 128, ITEMS = 4;
__global__ void block_sum(const float* x, float* y, int n) {
    using Load = cub::BlockLoad<float, THREADS, ITEMS, cub::BLOCK_LOAD_DIRECT>;
    using Reduce = cub::BlockReduce<float, THREADS>;
    __shared__ typename Reduce::TempStorage scratch;
    float v[ITEMS];
    int base = blockIdx.x * THREADS * ITEMS;
    Load().Load(x + base, v, n - base, 0.0f);
    float s = 0.0f;
    for (int i = 0; i < ITEMS; ++i) s += v[i];
    float total = Reduce(scratch).Sum(s);
    if (threadIdx.x == 0) y[blockIdx.x] = total;
}
GUARDED
extern "C" void solve(const float* x, float* y, int n) {
    block_sum<<<(n + THREADS * ITEMS - 1) / (THREADS * ITEMS), THREADS>>>(x, y, n);
}
"""
GUARD = """\
__global__ void scale_new_arch(float* y, int n) {
#if __CUDA_ARCH__ >= 1000
    if (threadIdx.x < n) y[threadIdx.x] *= 2.0f;
#endif
}
"""
CUB_REF = """\
def shapes(n):
    return {"x": ((n,), "float32"), "y": ((n // 512,), "float32")}
def reference(x, y, **_):
    y.copy_(x.view(-1, 512).sum(1))
"""


def sass_item(pytester: pytest.Pytester, source: str) -> tuple[dict, int]:
    pytester.makefile(".cu", k=source)
    pytester.makepyfile(ref=CUB_REF)
    result = pytester.runpytest_subprocess("--kopt-baseline", "k.cu", "--kopt-ref", "ref.py", "--kopt-dims",
                                           "n=4096", "--kopt-arch", "sm_90a", "-k", "compile or sass",
                                           "--kopt-json", "r.json", "-p", "no:cacheprovider", timeout=600)
    doc = json.loads((pytester.path / "r.json").read_text())
    items = {i["nodeid"].split("::", 1)[1]: i for i in doc["items"]}
    assert items["compile"]["outcome"] == "passed", items["compile"]
    return items["sass"], result.ret


@needs_nvcc
def test_a_cu_that_includes_cub_passes_sass(pytester: pytest.Pytester) -> None:
    """CUB's EmptyKernel<void> (one EXIT, no store) is in the build beside the file's own block_sum; before, sass
    failed EMPTY_KERNEL on it. Now it passes, judging block_sum and naming CUB's kernel as a library's."""
    item, ret = sass_item(pytester, CUB_CU.replace("GUARDED\n", ""))
    assert (item["outcome"], item["status"]) == ("passed", "PASSED"), item
    # the instruction count and CUB's versioned namespace (CUB_300001_SM_900 with nvcc 13.0) vary with the toolkit
    assert re.fullmatch(r"sm_90a: _Z9block_sumPKfPfi \(\d+ insns\); 1 library kernel\(s\) compiled in from included "
                        r"headers, not checked: cub::\w+::detail::EmptyKernel", item["summary"]), item["summary"]
    assert item["figures"]["library_functions"] == 1 and item["figures"]["functions"] == 2
    assert ret == 0


@needs_nvcc
def test_an_arch_guarded_kernel_of_its_own_still_fails_beside_cub(pytester: pytest.Pytester) -> None:
    """The same file with a kernel of its own whose body is under ``#if __CUDA_ARCH__ >= 1000``: EMPTY_KERNEL names
    that kernel only, never CUB's."""
    item, ret = sass_item(pytester, CUB_CU.replace("GUARDED\n", GUARD))
    assert (item["outcome"], item["status"]) == ("failed", "EMPTY_KERNEL"), item
    assert item["message"].startswith("1 kernel function(s) write no global memory on sm_90a: _Z14scale_new_archPfi")
    assert "EmptyKernel" not in item["message"]
    assert ret == 2
