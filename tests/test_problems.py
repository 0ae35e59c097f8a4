"""KernelBench and GPU MODE problems as their users write them, judged by each harness's own procedure and rules,
and kopt's value regimes and shrinking on them: the pieces in process (the adapters, the dims, the task files, the
checkers, the shrinker's size reader), then whole sessions through the ``--kopt-json`` report on the CPU. Every
problem and candidate here is written for these tests."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from pytest_kopt.child import HarnessError
from pytest_kopt.child.formats import load_reference, regime_used
from pytest_kopt.child.gpumode import TaskFiles, match_tolerances, run_check, task_files
from pytest_kopt.child.inputs import Inputs, keep_structure
from pytest_kopt.child.kernelbench import derived
from pytest_kopt.child.loader import load_module
from pytest_kopt.errors import ConfigError
from pytest_kopt.gates.shapes import listed_shapes
from pytest_kopt.gates.shrink import literal_sizes
from pytest_kopt.settings import build_settings, parse_dims

torch = pytest.importorskip("torch")

SIZES = '''\
import torch
import torch.nn as nn

batch_size = 8
input_shape = (3, 4, 4)
in_features = input_shape[0] * input_shape[1] * input_shape[2]
hidden = in_features // 2
width, depth = 5, 2


class Model(nn.Module):
    def __init__(self, in_features, hidden):
        super().__init__()
        self.fc = nn.Linear(in_features, hidden)
        self.bn = nn.BatchNorm1d(hidden)

    def forward(self, x):
        return self.bn(self.fc(x.flatten(1)))


def get_inputs():
    return [torch.randn(batch_size, *input_shape)]


def get_init_inputs():
    return [in_features, hidden]
'''
#: the same layer kept as bare parameters (other names than Model's), drawn in the same order from the same seed
RENAMED = '''\
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features, hidden):
        super().__init__()
        fc = nn.Linear(in_features, hidden)
        self.weight, self.bias = fc.weight, fc.bias
        self.bn = nn.BatchNorm1d(hidden)

    def forward(self, x):
        return self.bn(x.flatten(1) @ self.weight.t() + self.bias)
'''


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def test_kernelbench_sizes_tuples_and_derived_globals_follow_the_dims(tmp_path: Path) -> None:
    """Dims named like the problem's globals set them, a tuple from a list; globals computed from them are computed
    again (in_features from input_shape, hidden from in_features), and a later request without dims gets the values
    at import back (a warm process serves several shapes). A number for a tuple is a contract error naming the
    form to write."""
    ref = load_reference(str(_write(tmp_path / "p1" / "problem.py", SIZES)), seed=3)
    made = ref.make_inputs(seed=1, input_shape=[2, 2, 2], batch_size=4)
    m = ref.module
    assert list(made["in0"].shape) == [4, 2, 2, 2]
    assert (m.input_shape, m.in_features, m.hidden, m.batch_size) == ((2, 2, 2), 8, 4, 4)
    out = ref.reference(in0=made["in0"], input_shape=[2, 2, 2], batch_size=4)
    assert list(out.shape) == [4, 4]
    ref.make_inputs(seed=1)
    assert (m.input_shape, m.in_features, m.hidden, m.batch_size) == ((3, 4, 4), 48, 24, 8)
    with pytest.raises(HarnessError) as err:
        ref.make_inputs(seed=1, input_shape=4)
    assert "input_shape is (3, 4, 4) in the problem, but the dims give 4" in str(err.value)
    assert err.value.fix == "give input_shape in the problem's form, e.g. --kopt-dims input_shape=3x4x4"


def test_derived_reads_only_what_depends_on_the_dims() -> None:
    """Only the assignments that read a given name, directly or through another recomputed one, are run again;
    one that binds a given name alone is left to the dim."""
    src = "a = 4\nb = a * 2\nc = 7\nd = b + c\ne = c\na2, f = 1, a\n"
    assert [n.lineno for n in derived(src, {"a"})] == [2, 4, 6]
    assert [n.lineno for n in derived(src, {"c"})] == [4, 5]
    assert derived(src, {"e"}) == []


def test_a_modelnew_with_other_names_is_built_from_the_same_seed(tmp_path: Path) -> None:
    """KernelBench's procedure: ModelNew built under the same seed as Model, from the same init inputs; its
    parameters named otherwise (weight, bias for fc.weight, fc.bias) hold the same values, so its output is
    Model's; the note names what was and was not copied (the BatchNorm's state was, by name)."""
    ref = load_reference(str(_write(tmp_path / "p2" / "problem.py", SIZES)), seed=11)
    new_mod = load_module(str(_write(tmp_path / "p2" / "new.py", RENAMED)), "kopt_candidate_t")
    x = ref.make_inputs(seed=5)["in0"]
    new, note = ref.model_new(new_mod.ModelNew, "new.py", "cpu")
    with torch.no_grad():
        assert torch.equal(new(x), ref.reference(in0=x))
    assert note.startswith("ModelNew was built from the same seed as Model, as KernelBench builds it; 5 of its 7 "
                           "parameters and buffers were copied from Model by name; its own: weight [24, 48], "
                           "bias [24]; Model's not in it: fc.weight, fc.bias"), note


def test_kernelbench_precision_casts_inputs_and_models_and_takes_its_tolerance(tmp_path: Path) -> None:
    """--kopt-precision bf16: float inputs and the model in bfloat16, KernelBench's 1e-2 for it (1e-4 for fp32),
    named as KernelBench's; an unknown precision is a contract error."""
    path = str(_write(tmp_path / "p3" / "problem.py", SIZES))
    fp32, bf16 = load_reference(path, seed=1), load_reference(path, seed=1, precision="bf16")
    assert (fp32.atol, fp32.rtol, fp32.tolerance_source) == (1e-4, 1e-4, "KernelBench's fp32 tolerance")
    assert (bf16.atol, bf16.rtol, bf16.tolerance_source) == (1e-2, 1e-2, "KernelBench's bf16 tolerance")
    x = bf16.make_inputs(seed=2)["in0"]
    assert x.dtype == torch.bfloat16 and bf16.reference(in0=x).dtype == torch.bfloat16
    with pytest.raises(HarnessError, match="precision 'fp8' is not one of KernelBench's"):
        load_reference(path, seed=1, precision="fp8")


UTILS = '''\
import torch


def match_reference(data, output, reference, rtol=1e-05, atol=1e-08):
    ok = torch.allclose(output, reference(data), rtol=rtol, atol=atol)
    return ok, "" if ok else "mismatch"


def make_match_reference(reference, **kwargs):
    def wrapped(data, output):
        return match_reference(data, output, reference=reference, **kwargs)
    return wrapped
'''
GM_REFERENCE = '''\
import torch
from utils import make_match_reference
from task import input_t


def generate_input(rows: int, cols: int, seed: int, mode: str = "plain") -> input_t:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g)
    return x + 3.0 if mode == "shifted" else x


def ref_kernel(data: input_t):
    return torch.cumsum(data, dim=1)


check_implementation = make_match_reference(ref_kernel{tolerances})
'''
GM_TASK = '''\
files:
  - {"name": "submission.py", "source": "@SUBMISSION@"}
  - {"name": "task.py", "source": "task.py"}
  - {"name": "utils.py", "source": "../common/utils.py"}
  - {"name": "reference.py", "source": "reference.py"}
  - {"name": "eval.py", "source": "../common/eval.py"}
tests:
  - {"rows": 4, "cols": 64, "seed": 1}
  - {"rows": 8, "cols": 33, "seed": 2, "mode": "shifted"}
benchmarks:
  - {"rows": 64, "cols": 1024, "seed": 3}
  - {"rows": 32, "cols": 2048, "seed": 4, "mode": "shifted"}
'''


def _gpumode_tree(root: Path, tolerances: str = ", rtol=1e-2, atol=1e-2") -> Path:
    """A GPU MODE problem in the repository's layout: problems/cumsum/{reference,task,submission}.py and task.yml,
    its utils.py (and an eval.py nothing imports) in problems/common/."""
    _write(root / "common" / "utils.py", UTILS)
    _write(root / "common" / "eval.py", "raise RuntimeError('the runner, never imported by kopt')\n")
    _write(root / "cumsum" / "task.py", "input_t = object\n")
    _write(root / "cumsum" / "task.yml", GM_TASK)
    return _write(root / "cumsum" / "reference.py", GM_REFERENCE.format(tolerances=tolerances))


def test_task_files_make_the_listed_modules_importable(tmp_path: Path) -> None:
    """task.yml's files: the listed .py files by their names, the submission and the reference itself left out;
    the finder serves them ahead of the path (utils.py from ../common), never a standard-library name, and the
    problem imports as the runner's copy would let it."""
    ref = _gpumode_tree(tmp_path / "problems")
    files = task_files(ref)
    common = (tmp_path / "problems" / "common").resolve()
    assert files == {"task": (ref.parent / "task.py").resolve(), "utils": common / "utils.py",
                     "eval": common / "eval.py"}
    assert "json" not in TaskFiles({"json": ref}).files
    for name in ("utils", "task"):
        sys.modules.pop(name, None)
    try:
        adapted = load_reference(str(ref), seed=1)
        assert adapted.module.make_match_reference.__module__ == "utils"
        assert sys.modules["utils"].__file__ == str((tmp_path / "problems/common/utils.py").resolve())
    finally:
        for name in ("utils", "task"):
            sys.modules.pop(name, None)
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, TaskFiles)]


def test_the_problems_own_tolerances_are_read_from_its_checker(tmp_path: Path) -> None:
    """make_match_reference(ref_kernel, rtol=1e-2, atol=1e-2): those; without arguments, match_reference's own
    defaults (1e-5, 1e-8); a closure over rtol/atol themselves; atol/rtol in reference.py before either; a checker of
    the problem's own (a def) is no element-wise match: None, and the adapter keeps it as the checker."""
    ref = _gpumode_tree(tmp_path / "a")
    try:
        adapted = load_reference(str(ref), seed=1)
        assert (adapted.atol, adapted.rtol, adapted.checker) == (1e-2, 1e-2, None)
        assert adapted.tolerance_source == "reference.py's check_implementation (match_reference)"
        plain = load_reference(str(_gpumode_tree(tmp_path / "b", tolerances="")), seed=1)
        assert (plain.atol, plain.rtol) == (1e-8, 1e-5)
    finally:
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, TaskFiles)]
        for name in ("utils", "task"):
            sys.modules.pop(name, None)
    module = type(sys)("m")
    module.ref_kernel = lambda data: data

    def closing(reference, rtol, atol):
        def check(data, output):
            return reference(data), rtol, atol
        return check

    assert match_tolerances(module, closing(module.ref_kernel, 3e-3, 4e-4)) == {"atol": 4e-4, "rtol": 3e-3}
    assert match_tolerances(module, closing(lambda d: d, 3e-3, 4e-4)) is None
    assert match_tolerances(module, lambda data, output: (True, "")) is None


def test_a_checkers_answer_is_read_in_each_of_gpu_modes_forms() -> None:
    """(bool, message) as GPU MODE's checkers return it; an older checker's message (empty when right); a bare
    bool; an exception inside the check is a failure that names it."""
    assert run_check(lambda d, o: (False, "off by one"), 1, 2) == (False, "off by one")
    assert run_check(lambda d, o: "", 1, 2) == (True, "")
    assert run_check(lambda d, o: "mismatch at 3", 1, 2) == (False, "mismatch at 3")
    assert run_check(lambda d, o: True, 1, 2) == (True, "")
    assert run_check(lambda d, o: 1 / 0, 1, 2) == (False, "raised ZeroDivisionError: division by zero")


def test_kopts_values_keep_the_problems_zeros_and_symmetry() -> None:
    """A redrawn input keeps what a kernel may rely on without computing it: exact zeros where the problem's are
    (a triangle, a zeroed output buffer), and symmetry where the problem's matrix is symmetric."""
    like = torch.tril(torch.arange(1.0, 10.0).reshape(3, 3))
    t = torch.randn(3, 3)
    keep_structure(torch, t, like)
    assert torch.equal(t == 0, like == 0) and bool((t[like != 0] != 0).all())
    sym = torch.tensor([[2.0, 1.0], [1.0, 3.0]])
    t = torch.randn(2, 2)
    keep_structure(torch, t, sym)
    assert torch.equal(t, t.t())


def test_the_regime_used_is_the_one_the_inputs_came_from() -> None:
    """A field problem: the plan's regime where its adapter allows kopt's, else its own generator's; kopt's format:
    make_inputs when it made every float input, else the plan's regime."""
    kb = type("KB", (), {"format": "kernelbench", "draws_regimes": True})()
    own = type("GM", (), {"format": "gpumode", "draws_regimes": False})()
    spec = [{"name": "x", "role": "input", "dtype": "float32", "source": "make_inputs"},
            {"name": "i", "role": "input", "dtype": "int64", "source": "setup"}]
    assert regime_used(kb, spec, {"regime": "normal"}) == "normal"
    assert regime_used(kb, spec, {"regime": "problem"}) == "problem"
    assert regime_used(own, spec, {"regime": "uniform"}) == "problem"
    assert regime_used(object(), spec, {"regime": "uniform"}) == "make_inputs"
    assert regime_used(object(), [{**spec[0], "source": "drawn"}], {"regime": "uniform"}) == "uniform"


def test_field_problem_inputs_are_redrawn_in_kopts_regimes_at_their_shapes(tmp_path: Path) -> None:
    """A KernelBench get_inputs of torch.rand (all >= 0): the problem regime keeps its values; normal draws at the
    same shape and dtype, with negative values; the same seed and plan give the same values in any process."""
    ref = load_reference(str(_write(tmp_path / "p4" / "problem.py", SIZES.replace("randn", "rand"))), seed=1)
    spec = [{"name": "in0", "role": "input", "shape": [8, 3, 4, 4], "stride": [48, 16, 4, 1], "dtype": "float32",
             "source": "make_inputs"}]
    own, drawn, again = (Inputs(torch, spec, {}, "cpu") for _ in range(3))
    own.fill({"regime": "problem"}, 7, ref, {}, {})
    drawn.fill({"regime": "normal", "scale": 1.0}, 7, ref, {}, {})
    again.fill({"regime": "normal", "scale": 1.0}, 7, ref, {}, {})
    assert bool((own.tensors["in0"] >= 0).all()) and bool((drawn.tensors["in0"] < 0).any())
    assert torch.equal(drawn.tensors["in0"], again.tensors["in0"])


def test_dims_take_tuple_sizes_and_strings() -> None:
    """A tuple size as 3x64x64 or a JSON list (a KernelBench input_shape), a string quoted or in JSON (a GPU MODE
    argument); anything else is still a number or an error naming the forms."""
    assert parse_dims('input_shape=3x64x64,case="dense",n=4') == {"input_shape": [3, 64, 64], "case": "dense", "n": 4}
    assert parse_dims('{"input_shape": [3, 4], "case": "rankdef", "M": "4096"}') == {
        "input_shape": [3, 4], "case": "rankdef", "M": 4096}
    with pytest.raises(ConfigError) as err:
        parse_dims("M=dense")
    assert err.value.fix == 'give a number (4096, 1e-5), a tuple of sizes (3x64x64) or a quoted string (case="dense")'


def test_task_rows_may_leave_an_optional_column_out(tmp_path: Path) -> None:
    """A task.yml whose rows leave out an optional generate_input argument (linalg's case): every row is a shape
    (before: the whole session refused, blaming --kopt-dims never given); ref.py's own dims list of different names
    is refused naming ref.py, and --kopt-dims naming itself."""
    ref = _gpumode_tree(tmp_path / "problems")
    kernel = _write(ref.parent / "submission.py", "def custom_kernel(data):\n    return data.cumsum(1)\n")
    opts = {"baseline": str(kernel), "ref": str(ref)}
    s = build_settings(lambda name: opts.get(name), tmp_path, listed=listed_shapes)
    assert s.shapes == ({"rows": 4, "cols": 64}, {"rows": 8, "cols": 33, "mode": "shifted"})
    _write(tmp_path / "k" / "ref.py", 'dims = [{"n": 4}, {"m": 8}]\ndef reference(x, **_):\n    return x\n')
    opts = {"baseline": str(kernel), "ref": str(tmp_path / "k" / "ref.py")}
    with pytest.raises(ConfigError, match=r"ref.py's dims = \[...\]: the shapes name different dims \(m vs n\)"):
        build_settings(lambda name: opts.get(name), tmp_path, listed=listed_shapes)


def test_a_bad_task_yml_is_a_clear_error_naming_it_and_a_good_one_is_read_once(tmp_path: Path) -> None:
    """task.yml as a hostile or careless problem writes it: not UTF-8 (before: UnicodeDecodeError, an internal
    error with no report), a row built of aliases that expand a billion-fold when shown (before: the error message
    expanded them until memory ran out), an int beyond 64 bits in ref.py's dims (before: OverflowError at
    collection). A good one is parsed once per version of the file, not once per item."""
    from pytest_kopt.gates import shapes

    ref = _gpumode_tree(tmp_path / "problems")
    task = ref.parent / "task.yml"
    good = task.read_bytes()
    task.write_bytes(b"tests:\n  - {rows: 4, cols: \xff\xfe}\n")
    with pytest.raises(ConfigError) as err:
        shapes.task_shapes(task, "tests")
    assert err.value.message.startswith(f"{task}: not UTF-8 text") and err.value.fix == "save task.yml as UTF-8"
    levels = ["a0: &a0 [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]"] + [
        f"a{i}: &a{i} [{', '.join(['*a%d' % (i - 1)] * 10)}]" for i in range(1, 9)]
    task.write_text("\n".join(levels) + "\ntests:\n  - {rows: 7, cols: 3, x: *a8}\n")
    with pytest.raises(ConfigError) as err:
        shapes.task_shapes(task, "tests")
    assert f"{task}: tests entry 1 (" in err.value.message and len(err.value.message) < 400
    task.write_bytes(good)
    shapes._task_shapes.cache_clear()
    first = shapes.task_shapes(task, "tests")
    first[0]["rows"] = -1  # a caller's change is its own
    assert shapes.task_shapes(task, "tests")[0]["rows"] != -1
    assert shapes._task_shapes.cache_info().misses == 1 and shapes._task_shapes.cache_info().hits == 1
    big = _write(tmp_path / "k" / "ref.py", f'dims = [{{"n": {"9" * 400}}}]\ndef reference(x, **_):\n    return x\n')
    with pytest.raises(ConfigError, match=r"ref.py:1: dims = .* is not a list of shapes"):
        shapes.ref_shapes(big, "dims")


def test_a_kernelbench_problems_literal_sizes_are_what_a_shrink_may_halve(tmp_path: Path) -> None:
    """Integer globals and tuples of them, tuple assignments included; computed globals and tolerances are no
    sizes a shrink may set."""
    path = _write(tmp_path / "p5" / "problem.py", SIZES + "atol = 1\nflag = True\n")
    assert literal_sizes(path) == {"batch_size": 8, "input_shape": [3, 4, 4], "width": 5, "depth": 2}


# ---- whole sessions on the CPU, read through the --kopt-json report ----

def session(pytester: pytest.Pytester, *args: str) -> tuple[pytest.RunResult, dict[str, dict]]:
    """A subprocess session; its JSON report's items by node id without the folders before the kernel's name."""
    result = pytester.runpytest_subprocess(*args, "--kopt-json", "r.json", "-p", "no:cacheprovider", timeout=600)
    path = pytester.path / "r.json"
    assert path.is_file(), result.stdout.str()[-3000:] + result.stderr.str()[-2000:]
    return result, {i["nodeid"].rsplit("/", 1)[-1]: i for i in json.loads(path.read_text())["items"]}


LEAKY = '''\
import torch
import torch.nn as nn

batch_size = 16
features = 64


class Model(nn.Module):
    def __init__(self, slope):
        super().__init__()
        self.slope = slope

    def forward(self, x):
        return torch.nn.functional.leaky_relu(x, self.slope)


def get_inputs():
    return [torch.rand(batch_size, features)]


def get_init_inputs():
    return [0.1]
'''
LEAKY_NEW = '''\
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, slope):
        super().__init__()
        self.slope = slope

    def forward(self, x):
        return {body}
'''


def test_kopts_regimes_catch_a_kernel_right_only_on_the_problems_values(pytester: pytest.Pytester) -> None:
    """A KernelBench LeakyReLU whose get_inputs draws torch.rand (all >= 0) and a ModelNew without the negative
    branch: on the problem's own inputs (seed 1) it passes, as it did on every seed before; on kopt's regimes at the
    same shape (seeds 2-4) it fails, and each item says which regime it ran. The honest ModelNew passes all four.
    The first failure is shrunk to the smallest failing case (1 x 1, small integers), reported in the message, the
    figures and correctness/shrunk-INCORRECT_NUMERICAL.json; the next failure points at it."""
    pytester.makepyfile(problem=LEAKY, honest=LEAKY_NEW.format(body="torch.where(x > 0, x, x * self.slope)"),
                        positive=LEAKY_NEW.format(body="x * 1.0"))
    result, items = session(pytester, "--kopt-baseline", "honest.py", "--kopt-candidate", "positive.py", "--kopt-ref",
                            "problem.py", "--kopt-seeds", "1,2,3,4", "-k", "correctness")
    regimes = ["problem", "normal", "uniform", "small_int"]
    for seed, regime in zip((1, 2, 3, 4), regimes):
        honest = items[f"honest.py::correctness[seed={seed}]"]
        assert (honest["status"], honest["figures"]["regime"]) == ("PASSED", regime), honest
        assert (honest["figures"]["atol"], honest["figures"]["rtol"]) == (1e-4, 1e-4)  # KernelBench's fp32
    assert "seed=1 (the problem's get_inputs()) on cpu" in items["honest.py::correctness[seed=1]"]["summary"]
    assert items["positive.py::correctness[seed=1]"]["status"] == "PASSED"
    first = items["positive.py::correctness[seed=2]"]
    assert first["status"] == "INCORRECT_NUMERICAL" and first["message"].startswith("seed=2 (normal inputs): output "
                                                                                    "differs from the reference")
    assert first["figures"]["shrunk"].startswith("features=1,batch_size=1"), first["figures"]
    assert first["figures"]["shrunk_status"] == "INCORRECT_NUMERICAL"
    assert f"shrunk to {first['figures']['shrunk']} (" in first["message"]
    assert "output out [1, 1]: 1/1 elements" in first["details"], first["details"]
    record = json.loads(next(pytester.path.glob(".kopt/**/positive.py/correctness/shrunk-INCORRECT_NUMERICAL.json"))
                        .read_text())["found"]
    assert record["dims"] == {"features": 1, "batch_size": 1} and record["from"] == "seed=2"
    assert record["attempts"] <= 24 and record["seconds"] <= 30
    for seed in (3, 4):
        later = items[f"positive.py::correctness[seed={seed}]"]
        assert later["status"] == "INCORRECT_NUMERICAL", later
        assert f"shrunk earlier from seed=2: {record['label']} fails alike" in later["message"]
    assert result.ret == 2


def test_kernelbench_by_its_own_procedure(pytester: pytest.Pytester) -> None:
    """A ModelNew whose parameters are named otherwise than Model's (built from the same seed, as KernelBench
    builds it) passes (before: CONTRACT_ERROR "missing: fc.weight ...; not in Model: weight, bias", exit 4); a tuple
    size and the sizes computed from it follow --kopt-dims input_shape=2x2x2 (before: not settable, then a plain
    RuntimeError); --kopt-precision fp16 casts the inputs and both models and takes KernelBench's 1e-2."""
    pytester.makepyfile(problem=SIZES, new=RENAMED)
    result, items = session(pytester, "--kopt-baseline", "new.py", "--kopt-ref", "problem.py", "--kopt-seeds", "1,2",
                            "--kopt-dims", "input_shape=2x2x2,batch_size=4", "-k", "correctness or plan")
    assert items["new.py::plan"]["summary"].startswith("in0 float32[4, 2, 2, 2] inp"), items["new.py::plan"]
    for seed in (1, 2):
        assert items[f"new.py::correctness[seed={seed}]"]["status"] == "PASSED", items
    assert result.ret == 0
    result, items = session(pytester, "--kopt-baseline", "new.py", "--kopt-ref", "problem.py", "--kopt-seeds", "1",
                            "--kopt-precision", "fp16", "-k", "correctness or plan")
    assert items["new.py::plan"]["summary"].startswith("in0 float16[8, 3, 4, 4] inp")
    item = items["new.py::correctness[seed=1]"]
    assert item["status"] == "PASSED" and "(atol=0.01, rtol=0.01)" in item["summary"], item
    assert result.ret == 0


GM_SUBMISSION = '''\
import torch
from task import input_t


def custom_kernel(data: input_t):
    return {body}
'''


def test_a_gpu_mode_problem_in_its_repository_layout(pytester: pytest.Pytester) -> None:
    """reference.py importing utils (listed in task.yml's files: from ../common) and task, rows with an optional
    string column, the problem's make_match_reference(rtol=1e-2, atol=1e-2): a submission 5e-3 off passes at the
    problem's own tolerance (kopt's 1e-3 would fail it), one summing the wrong axis fails on every row; the benchmark
    rows are timed as they are (the second keeps its own mode, the first none)."""
    root = pytester.path / "problems"
    ref = _gpumode_tree(root)
    _write(ref.parent / "submission.py", GM_SUBMISSION.format(body="torch.cumsum(data, dim=1) + 5e-3"))
    _write(ref.parent / "wrong.py", GM_SUBMISSION.format(body="torch.cumsum(data, dim=0)"))
    result, items = session(pytester, "--kopt-baseline", "problems/cumsum/submission.py", "--kopt-candidate",
                            "problems/cumsum/wrong.py", "--kopt-ref", "problems/cumsum/reference.py", "--kopt-seeds",
                            "1,2")
    for case in ("rows=4,cols=64,seed=1", "rows=4,cols=64,seed=2", "rows=8,cols=33,mode=shifted,seed=1",
                 "rows=8,cols=33,mode=shifted,seed=2"):
        good = items[f"submission.py::correctness[{case}]"]
        assert good["status"] == "PASSED" and (good["figures"]["atol"], good["figures"]["rtol"]) == (0.01, 0.01), good
        assert items[f"wrong.py::correctness[{case}]"]["status"] == "INCORRECT_NUMERICAL"
    timing = sorted(k for k in items if k.startswith("submission.py::timing"))
    assert timing == ["submission.py::timing[rows=32,cols=2048,mode=shifted]",
                      "submission.py::timing[rows=64,cols=1024]"], timing
    assert result.ret == 2


UNIT = '''\
import torch


def generate_input(rows: int, cols: int, seed: int):
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed))


def ref_kernel(data):
    return data / data.norm(dim=1, keepdim=True)


def check_implementation(data, output):
    """Any unit vector along each row, either sign: the answer is not unique."""
    norms = output.norm(dim=1)
    if not torch.allclose(norms, torch.ones_like(norms), atol=1e-4):
        return False, f"rows are not unit vectors (first norm {norms[0].item():.4f})"
    cos = (output * data).sum(1) / data.norm(dim=1)
    if not torch.allclose(cos.abs(), torch.ones_like(cos), atol=1e-4):
        return False, "rows are not along the input's direction"
    return True, ""
'''


def test_a_problem_checked_by_property_is_judged_by_its_own_check(pytester: pytest.Pytester) -> None:
    """A GPU MODE problem whose check_implementation checks a property (a unit vector along each row, either sign):
    a submission returning the other sign passes on every call (before: INCORRECT against ref_kernel's sign, then
    UNMEETABLE_TOLERANCE "loosen atol/rtol"); one 1% too long fails with the check's own message; both ran on the
    problem's own inputs, which its check may rely on."""
    pytester.makepyfile(reference=UNIT, flipped="def custom_kernel(data):\n    return -data / data.norm(dim=1, "
                                                "keepdim=True)\n",
                        longer="def custom_kernel(data):\n    return 1.01 * data / data.norm(dim=1, keepdim=True)\n")
    (pytester.path / "task.yml").write_text("tests:\n  - {rows: 4, cols: 16, seed: 1}\n")
    result, items = session(pytester, "--kopt-baseline", "flipped.py", "--kopt-candidate", "longer.py", "--kopt-ref",
                            "reference.py", "--kopt-seeds", "1,2", "-k", "correctness")
    for seed in (1, 2):
        item = items[f"flipped.py::correctness[seed={seed}]"]
        assert item["status"] == "PASSED" and item["figures"]["regime"] == "problem", item
        assert item["summary"].endswith("on cpu: the problem's check_implementation passed 4 calls"), item
    bad = items["longer.py::correctness[seed=1]"]
    assert bad["status"] == "INCORRECT_NUMERICAL", bad
    assert bad["message"].startswith("seed=1 (the problem's generate_input()): the problem's check_implementation "
                                     "rejected the output of the first call (input set A)"), bad["message"]
    assert "check_implementation: rows are not unit vectors (first norm 1.0100)" in bad["details"]
    assert result.ret == 2


def test_entry_points_of_another_name_get_advice_in_their_formats_terms(pytester: pytest.Pytester) -> None:
    """A GPU MODE submission whose function is kernel(data): preflight names it and says to rename it to
    custom_kernel(data) (before: kopt's setup()/run_kernel() advice); a reference.py with ref_kernel and a checker
    but no generate_input: told to define generate_input; a KernelBench candidate with class Model: told to rename
    it ModelNew."""
    pytester.makepyfile(reference=UNIT, solution="def kernel(data):\n    return data\n")
    (pytester.path / "task.yml").write_text("tests:\n  - {rows: 4, cols: 16, seed: 1}\n")
    result, items = session(pytester, "--kopt-baseline", "solution.py", "--kopt-ref", "reference.py", "-k",
                            "preflight")
    pre = items["solution.py::preflight"]
    assert pre["status"] == "CONTRACT_ERROR" and pre["fix"] == "rename kernel(data) to custom_kernel(data)", pre
    assert pre["message"].endswith("solution.py defines kernel(data), but no custom_kernel(data): a GPU MODE problem "
                                   "(reference.py) calls custom_kernel with the data generate_input() made and "
                                   "checks what it returns"), pre["message"]
    no_generator = UNIT.split("def generate_input")[0] + "def ref_kernel" + UNIT.split("def ref_kernel")[1]
    pytester.makepyfile(reference=no_generator)
    result, items = session(pytester, "--kopt-baseline", "solution.py", "--kopt-ref", "reference.py", "-k",
                            "preflight")
    pre = items["solution.py::preflight"]
    assert pre["status"] == "CONTRACT_ERROR" and pre["fix"] == "define def generate_input(**args, seed) in reference.py"
    assert "reference.py defines check_implementation, ref_kernel but no generate_input(**args, seed)" in pre["message"]
    pytester.makepyfile(problem=LEAKY, mine=LEAKY_NEW.format(body="x").replace("class ModelNew", "class Model"))
    result, items = session(pytester, "--kopt-baseline", "mine.py", "--kopt-ref", "problem.py", "-k", "preflight")
    pre = items["mine.py::preflight"]
    assert pre["status"] == "CONTRACT_ERROR" and pre["fix"].startswith("rename class Model to ModelNew"), pre
    assert result.ret == 4


@pytest.mark.parametrize(("scale", "status"), [(-1.0, "PASSED"), (1.01, "INCORRECT_NUMERICAL")])
def test_the_timed_check_call_of_a_problem_with_its_own_check(tmp_path: Path, scale: float, status: str) -> None:
    """The timing gate's check of a timed call (the judge's mode_check_timed), in process on the CPU: a problem
    with a check of its own is judged by it on the inputs the judge draws for that call, not against ref_kernel's
    answer (the other sign passes; 1% too long fails with the check's message)."""
    import numpy as np

    from pytest_kopt.child.correctness import mode_check_timed

    ref = _write(tmp_path / "unit" / "reference.py", UNIT)
    x = load_reference(str(ref)).make_inputs(seed=5, rows=4, cols=16)["data"]
    npz = tmp_path / "cand.npz"
    np.savez(npz, in__data=x.numpy(), cand1__out=(scale * x / x.norm(dim=1, keepdim=True)).numpy())
    spec = [{"name": "data", "role": "input", "shape": [4, 16], "stride": [16, 1], "dtype": "float32",
             "source": "make_inputs"}]
    got = mode_check_timed({"ref": str(ref), "seed": 1, "seed_b": 2, "check_seed": 5, "device": "cpu",
                            "dims": {"rows": 4, "cols": 16}, "plan": {"regime": "problem"}, "spec": spec,
                            "returned": ["*"], "cand": {"transport": "npz", "npz": str(npz)}})
    assert got["outputs"] == ["out"] and got["verdict"]["status"] == status, got
    assert got["verdict"]["figures"] == {"checked_by": "check_implementation", "calls": 1}
    if status != "PASSED":
        assert got["verdict"]["details"] == ["check_implementation: rows are not unit vectors (first norm 1.0100)"]


TRIL_IN_PLACE = '''\
import torch


def generate_input(size: int, seed: int):
    a = torch.randn(size, size, generator=torch.Generator().manual_seed(seed))
    return a, torch.empty(size, size)


def ref_kernel(data):
    a, out = data
    out.copy_(3 * torch.triu(a))
    return out
'''


@pytest.mark.parametrize(("a_changed", "status", "mutated"), [(False, "PASSED", []), (True, "PASSED", ["t0"])])
def test_the_timed_check_call_leaves_the_output_buffer_the_data_carries_to_the_kernel(
        tmp_path: Path, a_changed: bool, status: str, mutated: list[str]) -> None:
    """A GPU MODE ``data`` that carries its output buffer (``(a, out)``, which ref_kernel writes and returns): the
    timed check call's copy of ``out`` holds what the kernel wrote, which is no mutated input (it failed the
    example's timing as INPUT_MUTATED on an H100); a changed ``a`` still is one."""
    import numpy as np

    from pytest_kopt.child.correctness import mode_check_timed

    ref = _write(tmp_path / "tri" / "reference.py", TRIL_IN_PLACE)
    parts = load_reference(str(ref)).make_inputs(seed=5, size=8)
    a = parts["t0"]
    out = 3 * np.triu(a.numpy())
    np.savez(tmp_path / "cand.npz", in__t0=a.numpy() + (1.0 if a_changed else 0.0), in__t1=out, cand1__out=out)
    spec = [{"name": n, "role": "input", "shape": [8, 8], "stride": [8, 1], "dtype": "float32",
             "source": "make_inputs"} for n in ("t0", "t1")]
    got = mode_check_timed({"ref": str(ref), "seed": 1, "seed_b": 2, "check_seed": 5, "device": "cpu",
                            "dims": {"size": 8}, "plan": {"regime": "problem"}, "spec": spec, "returned": ["*"],
                            "cand": {"transport": "npz", "npz": str(tmp_path / "cand.npz")}})
    assert got["verdict"]["status"] == status, got
    assert [f.split(" ")[0] for f in got["guards"].get("input_mutated", [])] == mutated, got["guards"]


def test_the_bundled_kernelbench_example_with_its_documented_cpu_command(pytester: pytest.Pytester) -> None:
    """examples/kernelbench_linear as docs/examples.md runs it without a GPU (dims named like its globals; the GPU
    gates, which time a 64 x 64 problem on a GPU, left out): every other gate passes, five seeds through Triton's
    interpreter (on a GPU, through Triton) at KernelBench's fp32 tolerance, the problem's own inputs first and last,
    kopt's regimes between."""
    pytest.importorskip("triton")
    import shutil

    shutil.copytree(Path(__file__).resolve().parent.parent / "examples" / "kernelbench_linear",
                    pytester.path / "kernelbench_linear")
    result, items = session(pytester, "--kopt-baseline", "kernelbench_linear/model_new.py", "--kopt-ref",
                            "kernelbench_linear/problem.py", "--kopt-dims", "batch_size=64,in_features=64,"
                            "out_features=128", "--kopt-seed", "1", "-k", "not timing and not ncu and not roofline")
    seeds = [i for k, i in items.items() if "::correctness[" in k]
    assert [i["figures"]["regime"] for i in seeds] == ["problem", "normal", "uniform", "small_int", "problem"]
    assert all(i["status"] == "PASSED" and i["figures"]["atol"] == 1e-4 for i in seeds), seeds
    assert items["model_new.py::plan"]["summary"].startswith("in0 float32[64, 64] inp")
    assert result.ret == 0


def test_the_bundled_gpu_mode_example_is_one_clear_skip_without_a_gpu(pytester: pytest.Pytester) -> None:
    """examples/gpumode_tril with its documented command on a machine without a GPU: its generate_input asks for
    CUDA, so the plan and every later item skip, blocked by hardware, and the session exits 0."""
    import shutil

    from pytest_kopt.gates import hardware

    if hardware.probe_gpus()["gpus"]:
        pytest.skip("a GPU is here: the example runs (the H200 commands in the report)")
    shutil.copytree(Path(__file__).resolve().parent.parent / "examples" / "gpumode_tril",
                    pytester.path / "gpumode_tril")
    result, items = session(pytester, "--kopt-baseline", "gpumode_tril/submission.py", "--kopt-ref",
                            "gpumode_tril/reference.py")
    plan = items["submission.py::plan"]
    assert (plan["outcome"], plan["blocked_by"]) == ("skipped", "hardware") and "asks for CUDA" in plan["message"]
    assert not [i for i in items.values() if i["outcome"] == "failed"] and result.ret == 0
    # one short, whole reason for all 22 skips (no case's size or seed in it, nothing cut); torch's error and the
    # line of reference.py that asked for CUDA once, in the plan item's details
    skipped = [i for i in items.values() if i["outcome"] == "skipped"]
    assert len(skipped) == 22 and {i["message"] for i in skipped} == {
        'blocked by hardware: no GPU, and reference.py: generate_input() asks for CUDA (device="cuda" in the '
        "problem's code)"}
    assert [k for k, i in items.items() if i["details"]] == ["submission.py::plan"]
    assert 'reference.py", line' in plan["details"] and "RuntimeError" in plan["details"]
    text = result.stdout.str()
    assert "generate_input(size=" not in text and "…" not in text


def test_a_report_that_reshapes_a_field_problems_data_is_refused(tmp_path: Path) -> None:
    """The judge holds a candidate's reported buffers to what the problem's own generator makes (the adapters'
    shapes()): a spec that turns generate_input's [4, 16] into [16, 4] (same elements, another problem for the
    reference and the problem's check) is a contract error; the true one passes."""
    from pytest_kopt.child.inputs import check_spec

    ref = load_reference(str(_write(tmp_path / "u" / "reference.py", UNIT)))
    assert ref.shapes(rows=4, cols=16) == {"data": ([4, 16], "float32")}
    good = [{"name": "data", "role": "input", "shape": [4, 16], "stride": [16, 1], "dtype": "float32"}]
    check_spec(ref, good, {"rows": 4, "cols": 16}, "reference.py")
    with pytest.raises(HarnessError, match=r"'data' is float32\[16, 4\] but reference.py's shapes\(\) says "
                                           r"float32\[4, 16\]"):
        check_spec(ref, [{**good[0], "shape": [16, 4], "stride": [4, 1]}], {"rows": 4, "cols": 16}, "reference.py")


@pytest.mark.gpu
def test_a_property_checked_problem_is_timed_and_its_timed_call_checked_by_its_own_check(
        pytester: pytest.Pytester) -> None:
    """On a GPU: the unit-vector problem with its inputs made on the GPU, the other-sign submission: every seed
    passes the problem's own check, and the timing gate's check of a timed call (drawn by the judge) is the
    problem's check too (an element-wise one against ref_kernel fails it: the other sign)."""
    pytester.makepyfile(reference=UNIT.replace("torch.randn(rows, cols, generator=torch.Generator()",
                                               "torch.randn(rows, cols, device='cuda', generator=torch.Generator("
                                               "device='cuda')"),
                        flipped="def custom_kernel(data):\n    return -data / data.norm(dim=1, keepdim=True)\n")
    (pytester.path / "task.yml").write_text("tests:\n  - {rows: 64, cols: 256, seed: 1}\nbenchmarks:\n"
                                            "  - {rows: 8192, cols: 1024, seed: 2}\n"
                                            "  - {rows: 4096, cols: 4096, seed: 3}\n")
    result, items = session(pytester, "--kopt-baseline", "flipped.py", "--kopt-ref", "reference.py", "--kopt-seeds",
                            "1,2", "-k", "correctness or timing")
    for seed in (1, 2):
        assert items[f"flipped.py::correctness[seed={seed}]"]["status"] == "PASSED", items
    for shape in ("rows=8192,cols=1024", "rows=4096,cols=4096"):
        timing = items[f"flipped.py::timing[{shape}]"]
        assert timing["status"] == "PASSED", timing
    assert result.ret == 0


ROWSUM_REF = '''\
atol = 1e-4
rtol = 1e-4


def reference(x, **_):
    return x.sum(dim=1)
'''
#: off by 5e-4 of every output: within 10x the tolerance and 1e-3 of the scale, a "near miss" by the verdict's rule
ROWSUM_SCALED = '''\
import torch


def setup(M, N, seed, device="cuda"):
    return {"inputs": {"x": torch.empty(M, N, device=device)}, "outputs": ["y"]}


def run_kernel(x):
    return x.sum(dim=1) * 1.0005
'''


def test_a_near_miss_that_shrinks_to_size_one_is_called_the_kernels_error(pytester: pytest.Pytester) -> None:
    """A row sum scaled by 1.0005 reads as a near miss on its seed (the error is 5e-4 of the scale, what a long fp32
    sum can reach); shrunk to M=1, N=1, where no summation order differs, the details withdraw that hint."""
    pytester.makepyfile(k=ROWSUM_SCALED, ref=ROWSUM_REF)
    _, items = session(pytester, "--kopt-baseline", "k.py", "--kopt-ref", "ref.py", "--kopt-dims", "M=8,N=64",
                       "--kopt-seeds", "1", "-k", "correctness")
    (item,) = [i for i in items.values() if i["gate"] == "correctness" and i["case"] == "seed=1"]
    assert item["status"] == "INCORRECT_NUMERICAL", item
    assert item["figures"]["shrunk"].startswith("M=1,N=1"), item["figures"]
    assert "a near miss" in item["details"] and "not a near miss after all" in item["details"], item["details"]


def test_a_string_dim_never_takes_a_record_out_of_the_artifact_folder(pytester: pytest.Pytester) -> None:
    """A shape's string dims are the problem's to choose, and its label names the correctness record and a
    benchmark shape's folder: a value with path separators and dots stays one file name inside the kernel's folder
    (before: the records were written to a folder the value named, outside .kopt, and the session passed)."""
    escape = "q/../../../../../../../../" + str(pytester.path / "outside" / "pwned")
    pytester.makepyfile(
        ref=f"""
            import torch
            atol = 1e-6
            rtol = 1e-5
            dims = [{{"M": 4, "N": 8, "tag": "a"}}, {{"M": 4, "N": 8, "tag": {escape!r}}}]
            benchmarks = [{{"M": 4, "N": 8, "tag": {escape!r}}}]

            def shapes(M, N, **_):
                return {{"x": ((M, N), "float32"), "y": ((M, N), "float32")}}

            def reference(x, y, **_):
                y.copy_(torch.softmax(x.double(), dim=-1).float())
            """,
        kernel="""
            import torch

            def setup(M, N, seed, device="cuda", **_):
                x = torch.empty(M, N, device=device)
                return {"inputs": {"x": x, "y": torch.empty_like(x)}, "outputs": ["y"]}

            def run_kernel(x, y):
                y.copy_(torch.softmax(x, dim=-1))
            """)
    result, items = session(pytester, "--kopt-baseline", "kernel.py", "--kopt-ref", "ref.py", "--kopt-seeds", "3",
                            "-k", "correctness")
    statuses = [i["status"] for i in json.loads((pytester.path / "r.json").read_text())["items"]
                if i["gate"] == "correctness"]
    assert statuses == ["PASSED", "PASSED"] and result.ret == 0, items
    assert not (pytester.path / "outside").exists()
    records = sorted(p.name for p in pytester.path.glob(".kopt/kernel.py/correctness/*.json"))
    assert len(records) == 2 and records[0] == "M=4,N=8,tag=a,seed=3.json", records
    assert records[1].startswith("M=4,N=8,tag=q%2F..%2F..%2F") and "/" not in records[1], records
