"""Tests for pytest_kopt.gates.contract: the solve() signature parser and the ref.py / Triton / dims contracts."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from pytest_kopt.gates.contract import Param, check_dims, is_cutlass, parse_solve_signature
from pytest_kopt.gates.pycontract import check_reference, check_triton, read_python
from pytest_kopt.errors import EXIT_CONFIG, ContractError


def _src(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def _contract_error(func, *args, path: str, line: int | None) -> ContractError:
    """Call ``func(*args)``, expect a preflight ContractError at ``path:line`` with a fix, and return it."""
    with pytest.raises(ContractError) as info:
        func(*args)
    err = info.value
    assert err.gate == "preflight"
    assert err.path == path
    assert err.line == line
    assert err.fix and err.fix.strip()
    assert err.exit_code == EXIT_CONFIG
    return err


def P(name, ctype, dtype, ptr, const, line):  # noqa: N802 - short constructor for the expected tables
    return Param(name=name, ctype=ctype, dtype=dtype, is_pointer=ptr, is_const=const, line=line)


# ---- parse_solve_signature: accepted sources ----

GEMM = _src('''
    #include <cuda_runtime.h>
    #include <cuda_fp16.h>

    __global__ void gemm_kernel(const float* A, const float* B, float* C, int M, int N, int K) {
        int r = blockIdx.y * blockDim.y + threadIdx.y;
    }

    // Host entry: extern "C" void solve(int fake) is only a comment
    extern "C" void solve(const float* __restrict__ A, const float *B, float * C, int M, int N, int K) {
        dim3 block(16, 16);
        gemm_kernel<<<1, block>>>(A, B, C, M, N, K);
    }
''')


def test_solve_single_line_gemm():
    assert parse_solve_signature(GEMM, "gemm.cu") == [
        P("A", "float", "float32", True, True, 9),
        P("B", "float", "float32", True, True, 9),
        P("C", "float", "float32", True, False, 9),
        P("M", "int", "int32", False, False, 9),
        P("N", "int", "int32", False, False, 9),
        P("K", "int", "int32", False, False, 9),
    ]


def test_solve_roles():
    roles = [p.role for p in parse_solve_signature(GEMM)]
    assert roles == ["input", "input", "output", "scalar", "scalar", "scalar"]


MULTILINE = _src('''
    #include <cuda_bf16.h>
    /* A block comment with a fake
       extern "C" void solve(float* nothing)
    */
    extern "C"
    void solve(
        const __half* __restrict__ x,      // input, fp16
        const __nv_bfloat16 *w,            /* weights, bf16 */
        __nv_bfloat16* __restrict__ y,
        unsigned int rows,
        size_t cols,
        float eps,
        const int stride)
    {
        const char* s = "void solve(int no)";
    }
''')


def test_solve_multiline_types_and_lines():
    assert parse_solve_signature(MULTILINE, "k.cu") == [
        P("x", "__half", "float16", True, True, 7),
        P("w", "__nv_bfloat16", "bfloat16", True, True, 8),
        P("y", "__nv_bfloat16", "bfloat16", True, False, 9),
        P("rows", "unsigned int", "uint32", False, False, 10),
        P("cols", "size_t", "uint64", False, False, 11),
        P("eps", "float", "float32", False, False, 12),
        P("stride", "int", "int32", False, True, 13),
    ]


def test_solve_multiline_first_param_on_solve_line():
    src = 'extern "C" void solve(const float* a,\n\n                      float* b,\n  int n)\n{}\n'
    assert [(p.name, p.line) for p in parse_solve_signature(src)] == [("a", 1), ("b", 3), ("n", 4)]


def test_solve_in_extern_c_block():
    src = _src('''
        #include <cuda_runtime.h>
        extern "C" {
        // void solve(int decoy)
        void solve(const double* in, double* out, long long n) {
            (void)in;
        }
        }
    ''')
    assert parse_solve_signature(src) == [
        P("in", "double", "float64", True, True, 4),
        P("out", "double", "float64", True, False, 4),
        P("n", "long long", "int64", False, False, 4),
    ]


def test_solve_host_qualifier_and_east_const():
    src = 'extern "C" __host__ void solve(float const* a, float* const b, int64_t n) {}\n'
    params = parse_solve_signature(src)
    # `float const*` points at const data (input); `float* const` is a const pointer to writable data (output)
    assert params == [
        P("a", "float", "float32", True, True, 1),
        P("b", "float", "float32", True, False, 1),
        P("n", "int64_t", "int64", False, False, 1),
    ]


def test_solve_comment_and_string_decoys_before_real_one():
    src = _src('''
        // extern "C" void solve(const float* fake, float* fake2)
        const char* doc = "extern \\"C\\" void solve(int q)";
        /* void solve( */
        extern "C" void solve(const float* x, float* y, int n) {}
    ''')
    assert [p.name for p in parse_solve_signature(src)] == ["x", "y", "n"]
    assert {p.line for p in parse_solve_signature(src)} == {4}


@pytest.mark.parametrize("ctype, dtype", [
    ("half", "float16"), ("nv_bfloat16", "bfloat16"), ("uint8_t", "uint8"), ("signed char", "int8"),
    ("unsigned long long", "uint64"), ("short", "int16"), ("bool", "bool"), ("unsigned", "uint32"),
])
def test_solve_type_table(ctype, dtype):
    params = parse_solve_signature(f'extern "C" void solve({ctype}* out, int n) {{}}')
    assert params[0] == P("out", ctype, dtype, True, False, 1)


# ---- parse_solve_signature: errors ----

def test_no_solve_at_all():
    src = '__global__ void k(float* x) {}\n// void solve(float* x)\n'
    err = _contract_error(parse_solve_signature, src, "k.cu", path="k.cu", line=None)
    assert 'no host function `extern "C" void solve(...)` found' in err.message


def test_solve_without_extern_c():
    src = _src('''
        #include <cuda_runtime.h>

        __global__ void k(float* y) {}

        void solve(const float* x, float* y, int n) {
            k<<<1, 1>>>(y);
        }
    ''')
    err = _contract_error(parse_solve_signature, src, "k.cu", path="k.cu", line=5)
    assert 'not declared extern "C"' in err.message


def test_solve_extern_c_on_other_function_only():
    src = 'extern "C" __global__ void k(float* y) {}\n\nvoid solve(float* y, int n) {}\n'
    err = _contract_error(parse_solve_signature, src, "k.cu", path="k.cu", line=3)
    assert "mangled" in err.message


@pytest.mark.parametrize("body", ["", "void", " void "])
def test_solve_without_parameters(body):
    src = f'\nextern "C" void solve({body}) {{}}\n'
    err = _contract_error(parse_solve_signature, src, "k.cu", path="k.cu", line=2)
    assert "takes no parameters" in err.message


def test_pointer_to_pointer():
    src = 'extern "C" void solve(const float* x,\n                      float** y, int n) {}\n'
    err = _contract_error(parse_solve_signature, src, "k.cu", path="k.cu", line=2)
    assert "`float * * y` is a pointer to pointer" in err.message


@pytest.mark.parametrize("decl, ctype", [
    ("float4* y", "float4"),
    ("std::vector<float> v", "std::vector<float>"),
    ("void* p", "void"),
    ("my_t n", "my_t"),
])
def test_unsupported_type(decl, ctype):
    src = f'extern "C" void solve(const float* x,\n    float* out,\n    {decl}) {{}}\n'
    err = _contract_error(parse_solve_signature, src, "k.cu", path="k.cu", line=3)
    assert f"has unsupported type `{ctype}`" in err.message


@pytest.mark.parametrize("decl", ["float*", "const float* __restrict__", "int", "unsigned int", "long long",
                                  "unsigned char*", "const int"])
def test_unnamed_parameter(decl):
    src = f'extern "C" void solve(float* out,\n  {decl}) {{}}\n'
    err = _contract_error(parse_solve_signature, src, "k.cu", path="k.cu", line=2)
    assert "has no name" in err.message


@pytest.mark.parametrize("decl", ["float& r", "float x[4]", "int n = 4"])
def test_reference_array_default(decl):
    src = f'extern "C" void solve(float* out, {decl}) {{}}\n'
    err = _contract_error(parse_solve_signature, src, "k.cu", path="k.cu", line=1)
    assert "is a reference, array or has a default value" in err.message


def test_no_output_pointer():
    src = 'extern "C" void solve(\n    const float* x,\n    const float* y,\n    int n) {}\n'
    err = _contract_error(parse_solve_signature, src, "k.cu", path="k.cu", line=2)
    assert "no output buffer" in err.message


def test_duplicate_names_point_at_the_second_one():
    src = 'extern "C" void solve(\n    const float* x,\n    float* y,\n    int n,\n    int n) {}\n'
    err = _contract_error(parse_solve_signature, src, "k.cu", path="k.cu", line=5)
    assert "duplicate parameter names ['n']" in err.message


def test_default_path_is_kernel_placeholder():
    err = _contract_error(parse_solve_signature, "int main() {}", path="<kernel>", line=None)
    assert "found" in err.message


# ---- is_cutlass ----

@pytest.mark.parametrize("source, expected", [
    ("#include <cutlass/gemm/device/gemm.h>\n", True),
    ("#include <cute/tensor.hpp>\n", True),
    ('#include "cutlass/cutlass.h"\n', True),
    ('#  include "cute/atom/mma_atom.hpp"\n', True),
    ("// #include <cutlass/cutlass.h>\n#include <cuda_runtime.h>\n", False),
    ("/* #include <cute/tensor.hpp> */\n", False),
    ("#include <cutlass_like.h>\n", False),
    ("#include <cuda_fp16.h>\nextern \"C\" void solve(float* x) {}\n", False),
])
def test_is_cutlass(source, expected):
    assert is_cutlass(source) is expected


# ---- check_dims ----

def test_check_dims_ok_with_float_scalar_given_int():
    params = parse_solve_signature(MULTILINE, "k.cu")
    check_dims(params, {"rows": 4, "cols": 8, "eps": 1, "stride": 2, "unused": 3.5}, "k.cu")


def test_check_dims_missing_dim_names_parameter_and_line():
    params = parse_solve_signature(MULTILINE, "k.cu")
    err = _contract_error(check_dims, params, {"rows": 4, "eps": 1e-5, "stride": 1}, "k.cu", path="k.cu", line=11)
    assert err.message == "solve() scalar `size_t cols` has no value in --kopt-dims"
    assert err.fix == "add cols=<value> to --kopt-dims"


def test_check_dims_names_every_missing_dim_at_once():
    """One run gives the whole fix (a newcomer otherwise needs a run per missing scalar)."""
    params = parse_solve_signature(MULTILINE, "k.cu")
    err = _contract_error(check_dims, params, {"rows": 4}, "k.cu", path="k.cu", line=11)
    assert err.message == ("solve() scalars `size_t cols`, `float eps`, `int stride` have no value in --kopt-dims")
    assert err.fix == "add cols=<value>,eps=<value>,stride=<value> to --kopt-dims"


def test_check_dims_integer_parameter_with_float():
    params = parse_solve_signature(MULTILINE, "k.cu")
    err = _contract_error(check_dims, params, {"rows": 4.0, "cols": 8, "eps": 1e-5, "stride": 1}, "k.cu",
                          path="k.cu", line=10)
    assert err.message == "solve() scalar `unsigned int rows` is an integer but --kopt-dims gives 4.0"


# ---- check_reference ----

def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(_src(text))
    return p


def test_reference_ok(tmp_path):
    ref = _write(tmp_path, "ref.py", '''
        import numpy as np
        atol = 1e-3
        rtol = 0
        NAME = "gemm"

        def reference(**kwargs):
            kwargs["C"][...] = kwargs["A"] @ kwargs["B"]

        def workload_model(M, N, K):
            return {"flops": 2 * M * N * K, "bytes_min": 4 * (M * K + K * N + M * N)}
    ''')
    c = check_reference(ref)
    assert c.functions["reference"] == ([], True, 6)
    assert c.functions["workload_model"] == (["M", "N", "K"], False, 9)
    assert c.constants == {"atol": 1e-3, "rtol": 0, "NAME": "gemm"}
    assert c.uses_triton_jit is False


def test_reference_missing(tmp_path):
    ref = _write(tmp_path, "ref.py", "def ref(**kwargs):\n    pass\n")
    err = _contract_error(check_reference, ref, path=str(ref), line=None)
    assert err.message == "no function `reference` defined"


def test_reference_nested_definition_does_not_count(tmp_path):
    ref = _write(tmp_path, "ref.py", "class R:\n    def reference(self, **kw):\n        pass\n")
    _contract_error(check_reference, ref, path=str(ref), line=None)



@pytest.mark.parametrize("binding, expected", [
    ("reference = _matmul", ([], True, 5)),  # an alias of this file's def: its signature (**kw), its line
    ("reference = functools.partial(_matmul, alpha=1.0)", ([], True, 5)),
    ("reference = lambda A, B, C: _matmul(A=A, B=B, C=C)", (["A", "B", "C"], False, 5)),
    ("from _impl import matmul as reference", ([], True, 5)),  # another module's: unknown, taken as **kwargs
])
def test_reference_bound_without_def(tmp_path, binding, expected):
    """An entry point bound by assignment, lambda or import is defined, as it is when the file runs."""
    ref = _write(tmp_path, "ref.py", f"import functools\n\ndef _matmul(**kw):\n    pass\n{binding}\n")
    assert check_reference(ref).functions["reference"] == expected


def test_a_non_entry_point_binding_is_no_function(tmp_path):
    """Only the formats' entry points count: ``N = int(...)`` and ``from torch import nn`` define no functions, and
    ``reference = None`` is still no reference."""
    ref = _write(tmp_path, "ref.py", "import os\nfrom torch import nn\nN = int(os.environ['N'])\nreference = None\n")
    c = read_python(ref)
    assert c.functions == {} and c.constants["reference"] is None
    err = _contract_error(check_reference, ref, path=str(ref), line=4)
    assert err.message == "`reference = None` is not a function"


def test_triton_entry_points_imported_from_a_helper(tmp_path):
    """A Triton candidate whose setup and run_kernel live in a module beside it passes the contract; the lambda's
    parameters are checked against the dims as a def's are."""
    k = _write(tmp_path, "k.py", "import triton\nfrom _impl import setup, run_kernel\n")
    c = check_triton(k, {"N": 4096})
    assert c.functions["setup"] == ([], True, 2) and c.functions["run_kernel"] == ([], True, 2)
    assert c.entry_modules == ("_impl",) and {"setup", "run_kernel"} <= c.unknown_signature
    k2 = _write(tmp_path, "k2.py", "import triton\nsetup = lambda N, device='cuda': None\nrun_kernel = print\n")
    err = _contract_error(check_triton, k2, {"N": 4096}, path=str(k2), line=2)
    assert err.message.startswith("setup() has no parameter `seed`")

@pytest.mark.parametrize("line, shown", [
    ("atol = -1e-3", "atol = -0.001"),
    ("atol = 1e-3 * 2", "atol = <an expression, not a literal>"),
    ("atol = TOL", "atol = <an expression, not a literal>"),
    ("atol = True", "atol = True"),
    ('atol = "1e-3"', "atol = '1e-3'"),
    ("rtol = -1", "rtol = -1"),
    ("atol = 1e999", "atol = inf"),  # inf passes any error
    ("rtol = {'y': 1e999}", "rtol = {'y': inf}"),
])
def test_reference_bad_tolerance(tmp_path, line, shown):
    ref = _write(tmp_path, "ref.py", f"TOL = 1\n\n{line}\n\ndef reference(**kwargs):\n    pass\n")
    err = _contract_error(check_reference, ref, path=str(ref), line=3)
    assert err.message == f"{shown} is not a finite non-negative number literal"


def test_reference_syntax_error(tmp_path):
    ref = _write(tmp_path, "ref.py", "def reference(**kwargs):\n    pass\n\nx = (1,\n")
    err = _contract_error(check_reference, ref, path=str(ref), line=4)
    assert err.message.startswith("syntax error: ")


# ---- check_triton ----

TRITON = '''
    import triton
    import triton.language as tl

    @triton.jit
    def add_k(x, y, o, n, B: tl.constexpr):
        p = tl.program_id(0)

    def setup(N, seed, device="cuda"):
        o = None
        return {"inputs": {"o": o}, "outputs": ["o"]}

    def run_kernel(**inputs):
        add_k[(1,)](**inputs, B=1024)
'''


def test_triton_ok(tmp_path):
    k = _write(tmp_path, "k.py", TRITON)
    c = check_triton(k, {"N": 4096})
    assert c.uses_triton_jit is True
    assert c.functions["setup"] == (["N", "seed", "device"], False, 8)
    assert c.functions["run_kernel"] == ([], True, 12)
    assert c.required["setup"] == ["N", "seed"] and c.setup_literal == (["o"], ["o"], 10)


@pytest.mark.parametrize("old, new, missing", [
    ("def setup(", "def set_up(", "setup"),
    ("def run_kernel(", "def launch(", "run_kernel"),
])
def test_triton_missing_function(tmp_path, old, new, missing):
    k = _write(tmp_path, "k.py", TRITON.replace(old, new))
    err = _contract_error(check_triton, k, {"N": 1}, path=str(k), line=None)
    assert err.message == f"no function `{missing}` defined"


def test_triton_missing_jit(tmp_path):
    """A file that does not import triton at all is no Triton kernel (it may still be a pure-Python candidate)."""
    src = TRITON.replace("    @triton.jit\n", "").replace("import triton.language as tl", "tl = None")
    k = _write(tmp_path, "k.py", src.replace("import triton\n", "import torch\n"))
    err = _contract_error(check_triton, k, {"N": 1}, path=str(k), line=None)
    assert err.message == "no @triton.jit kernel found"
    assert check_triton(k, {"N": 1}, require_jit=False).uses_triton_jit is False


def test_triton_from_import_jit_is_accepted(tmp_path):
    k = _write(tmp_path, "k.py", TRITON.replace("@triton.jit", "@jit").replace("import triton\n",
                                                                               "from triton import jit\n"))
    assert check_triton(k, {"N": 1}).uses_triton_jit is True


@pytest.mark.parametrize("dims, missing", [({"N": 1, "M": 2}, "M"), ({"N": 1, "eps": 1e-5}, "eps")])
def test_triton_setup_lacks_a_dim(tmp_path, dims, missing):
    k = _write(tmp_path, "k.py", TRITON)
    err = _contract_error(check_triton, k, dims, path=str(k), line=8)
    assert err.message == f"setup() has no parameter `{missing}`"


def test_triton_setup_lacks_seed(tmp_path):
    k = _write(tmp_path, "k.py", TRITON.replace("def setup(N, seed, ", "def setup(N, "))
    err = _contract_error(check_triton, k, {"N": 1}, path=str(k), line=8)
    assert err.message == "setup() has no parameter `seed`"


def test_triton_setup_keyword_only_parameters_count(tmp_path):
    k = _write(tmp_path, "k.py", TRITON.replace("def setup(N, seed, ", "def setup(*, N, seed, "))
    check_triton(k, {"N": 1})


def test_triton_setup_with_kwargs_accepts_any_dim(tmp_path):
    k = _write(tmp_path, "k.py", TRITON.replace("def setup(N, seed, device=\"cuda\")", "def setup(**dims)"))
    c = check_triton(k, {"M": 1, "N": 2, "eps": 1e-5})
    assert c.functions["setup"] == ([], True, 8)


# ---- read_python ----

def test_read_python_async_and_non_literal_constants(tmp_path):
    p = _write(tmp_path, "m.py", '''
        import math
        A = [1, 2]
        B = math.pi
        x, y = 1, 2

        async def reference(*, out, **kw):
            pass
    ''')
    c = read_python(p)
    assert c.constants["A"] == [1, 2] and repr(c.constants["B"]) == "<an expression, not a literal>"
    assert c.functions == {"reference": (["out"], True, 6)}


@pytest.mark.parametrize(("src", "names"), [
    # a disabled older solve before the real one: the real signature wins
    ('#if 0\nextern "C" void solve(const float* A, float* C, int M) {}\n#else\n#endif\n'
     'extern "C" void solve(const float* A, const float* B, float* C, int M) {}\n', ["A", "B", "C", "M"]),
    # an extern "C" block that also holds a kernel with braces
    ('extern "C" {\n__global__ void k(float* x) { x[0] = 1; }\nvoid solve(const float* x, float* y, int n) { }\n}\n',
     ["x", "y", "n"]),
    ('#define API extern "C"\nAPI void solve(const float* x, float* y, int n) {}\n', ["x", "y", "n"]),
    ('extern "C" __attribute__((visibility("default"))) void solve(const float* x, float* y, int n) {}\n',
     ["x", "y", "n"]),
])
def test_solve_found_through_preprocessor_and_blocks(src, names):
    assert [p.name for p in parse_solve_signature(src, "k.cu")] == names


def test_global_solve_is_named_as_such():
    with pytest.raises(ContractError) as info:
        parse_solve_signature('extern "C" __global__ void solve(const float* x, float* y, int n) {}\n', "k.cu")
    assert info.value.message.startswith("solve() is a __global__ kernel") and info.value.line == 1


def test_unused_dims_are_the_ones_no_one_names(tmp_path):
    """A dim that neither solve() nor any function of the Python files names is reported (HW below); dims named
    only by a function's parameters count as used."""
    from pytest_kopt.gates.pycontract import read_python, unused_dims

    ref = tmp_path / "ref.py"
    ref.write_text("def reference(x, y, **_):\n    pass\n\ndef shapes(N, C, eps):\n    return {}\n")
    params = parse_solve_signature('extern "C" void solve(const float* x, float* y, int N, int C, float eps) {}',
                                   "k.cu")
    assert unused_dims({"N": 4, "C": 8, "eps": 1e-5, "HW": 16}, params, read_python(ref)) == ["HW"]
    assert unused_dims({"N": 4, "C": 8, "eps": 1e-5}, params, read_python(ref)) == []


def test_the_last_binding_of_an_entry_point_wins(tmp_path):
    """As when the file runs: a def rebound to None is no function; a def rebound to a lambda has the lambda's
    signature (its required parameters too); ``del`` removes it."""
    ref = _write(tmp_path, "ref.py", "def reference(x, y, **_):\n    pass\nreference = None\n")
    _contract_error(check_reference, ref, path=str(ref), line=3)
    ref2 = _write(tmp_path, "ref2.py", "def reference(x, y, **_):\n    pass\nreference = lambda x, y, N: 0\n")
    c = check_reference(ref2)
    assert c.functions["reference"] == (["x", "y", "N"], False, 3) and c.required["reference"] == ["x", "y", "N"]
    ref3 = _write(tmp_path, "ref3.py", "def reference(**kw):\n    pass\ndel reference\n")
    _contract_error(check_reference, ref3, path=str(ref3), line=None)


def test_a_lambda_or_an_import_counts_as_returning(tmp_path):
    """run_kernel must return an output setup() lists outside its inputs: a lambda returns its body, and an
    imported or wrapped run_kernel is left to the run."""
    head = ("import triton\n\ndef setup(N, seed, device='cuda'):\n"
            "    return {'inputs': {'x': None}, 'outputs': ['y']}\n")
    for binding in ("run_kernel = lambda x: {'y': x * 2}\n", "from _impl import run_kernel\n",
                    "import functools\nrun_kernel = functools.partial(print, sep='')\n"):
        k = _write(tmp_path, "k.py", head + binding)
        assert "run_kernel" in check_triton(k, {"N": 8}).returns_value


@pytest.mark.parametrize("line", ["from ._impl import setup, run_kernel", "from . import helpers"])
def test_a_relative_import_is_refused_with_the_fix(tmp_path, line):
    k = _write(tmp_path, "k.py", f"import triton\n{line}\n")
    err = _contract_error(check_triton, k, {"N": 8}, path=str(k), line=2)
    assert "relative import" in err.message and "from _impl import" in err.fix


def test_a_triton_candidate_whose_entry_points_come_from_a_module_beside_it_is_triton(tmp_path):
    from pytest_kopt.gates.pycontract import imports_triton

    _write(tmp_path, "_impl.py", "import triton\n\n@triton.jit\ndef k(x):\n    pass\n")
    _write(tmp_path, "_plain.py", "def setup(**kw):\n    pass\n")
    assert imports_triton(_write(tmp_path, "cand.py", "from _impl import setup, run_kernel\n"))
    assert not imports_triton(_write(tmp_path, "pure.py", "from _plain import setup, run_kernel\n"))
    # a cycle of imports ends
    _write(tmp_path, "a.py", "from b import setup\n")
    _write(tmp_path, "b.py", "from a import run_kernel\n")
    assert not imports_triton(tmp_path / "a.py")


def test_an_imported_setup_leaves_no_dim_unused(tmp_path):
    from pytest_kopt.gates.pycontract import unused_dims

    k = _write(tmp_path, "k.py", "import triton\nfrom _impl import setup, run_kernel\n")
    ref = _write(tmp_path, "ref.py", "def reference(x, y):\n    pass\n")
    assert unused_dims({"N": 8}, [], read_python(ref), read_python(k)) == []


def test_a_too_deeply_nested_file_is_a_contract_error(tmp_path):
    ref = _write(tmp_path, "ref.py", "reference = " + "-" * 200_000 + "1\n")
    err = _contract_error(check_reference, ref, path=str(ref), line=None)
    assert "too deeply nested" in err.message



def test_an_entry_point_bound_in_a_try_or_an_if_at_module_level_counts(tmp_path):
    """``try: from fast import reference`` / ``except ImportError: def reference(...)`` runs at import: the def,
    bound last in the file, is what the contract reads; a def inside a function or class still does not count."""
    ref = _write(tmp_path, "ref.py", """
        try:
            from fast_ops import reference
        except ImportError:
            def reference(x, y, **_):
                y.copy_(x)
        if True:
            atol = 1e-3
    """)
    c = check_reference(ref)
    assert c.functions["reference"] == (["x", "y"], True, 4)
    assert "atol" not in c.constants  # a constant is read from the top level alone
    nested = _write(tmp_path, "nested.py", "def make():\n    def reference(**kw):\n        pass\n")
    _contract_error(check_reference, nested, path=str(nested), line=None)


def test_a_relative_import_with_a_fallback_in_its_except_is_not_refused(tmp_path):
    ref = _write(tmp_path, "ref.py", """
        try:
            from .ops import reference
        except ImportError:
            from ops import reference
    """)
    c = check_reference(ref)
    assert c.relative_import is None and c.functions["reference"] == ([], True, 4)

