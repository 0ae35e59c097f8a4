"""kopt's own hooks: a conftest adds a gate with a record of its own and a kernel kind, without a line of
pytest_kopt changed, and both go through collection, blocking and the JSON report like kopt's own."""

from __future__ import annotations

import json

import jsonschema
import pytest

from pytest_kopt import registry
from pytest_kopt.errors import ConfigError
from pytest_kopt.gates.builtin import builtin_gates
from pytest_kopt.gates.table import Gate, GateTable

CONFTEST = '''
import pytest

from pytest_kopt.artifacts import read_dict, write_json
from pytest_kopt.errors import Blocked
from pytest_kopt.gates.context import Outcome
from pytest_kopt.gates.table import Gate
from pytest_kopt.kinds.python import PythonKind


class PowerRecord:
    """power.json: the gate's own record (one reader, one writer)."""

    NAME = "power.json"

    @classmethod
    def write(cls, folder, seeds, joules):
        return write_json(folder / cls.NAME, {"seeds": seeds, "joules": joules})

    @classmethod
    def load(cls, folder):
        return read_dict(folder / cls.NAME)


def gate_power(ctx, case):
    """A stand-in for an energy gate: it counts the correctness records this session wrote for the kernel."""
    seeds = sorted(p.stem for p in (ctx.outdir / "correctness").glob("*.json"))
    if not seeds:
        raise Blocked("correctness", "no correctness record to read")
    path = PowerRecord.write(ctx.outdir, seeds, 0.0)
    return Outcome({"power_seeds": len(seeds)}, f"{len(seeds)} seeds read", (str(path),))


class ShoutKind(PythonKind):
    """A pure-Python kernel that says so on its first line; it has no SASS and reports its own name."""

    name = "shout"

    def detect(self, path):
        return path.suffix == ".py" and path.read_text().startswith("# kopt-kind: shout")


def pytest_kopt_gates(config):
    return [Gate("power", gate_power, needs=("correctness",))]


def pytest_kopt_kinds(config):
    return [ShoutKind()]
'''
REF = '''
atol = 1e-5
rtol = 1e-5
def reference(x, y, **_):
    y.copy_(2 * x)
'''
GOOD = '''# kopt-kind: shout
import torch
def setup(n, seed, device="cuda"):
    x = torch.empty(n, device=device)
    return {"inputs": {"x": x, "y": torch.empty_like(x)}, "outputs": ["y"]}
def run_kernel(x, y):
    y.copy_(x + x)
'''
WRONG = GOOD.replace("x + x", "x + 1")


def test_a_conftest_adds_a_gate_and_a_kind(pytester: pytest.Pytester) -> None:
    """The conftest's gate runs after its prerequisite, writes its own record and its figures reach the JSON
    report; it is blocked by a failed prerequisite like kopt's gates; the conftest's kind claims its files and
    answers for them (its name in the preflight's figures, compile and sass not applicable); the report validates
    against kopt's schema."""
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(ref=REF, good=GOOD, wrong=WRONG)
    result = pytester.runpytest_subprocess("--kopt-baseline", "good.py", "--kopt-candidate", "wrong.py", "--kopt-ref",
                                           "ref.py", "--kopt-dims", "n=64", "--kopt-seeds", "3,5", "--kopt-json",
                                           "r.json", "-p", "no:cacheprovider", timeout=600)
    doc = json.loads((pytester.path / "r.json").read_text())
    items = {i["nodeid"]: i for i in doc["items"]}
    good = [i["gate"] for i in doc["items"] if i["nodeid"].startswith("good.py")]
    assert good.index("power") == good.index("correctness") + 2, good  # two seeds, then the conftest's gate
    power = items["good.py::power"]
    assert power["outcome"] == "passed" and power["figures"]["power_seeds"] == 2, power
    record = json.loads((pytester.path / ".kopt" / "good.py" / "power.json").read_text())
    assert record["seeds"] == ["seed=3", "seed=5"]
    blocked = items["wrong.py::power"]
    assert blocked["outcome"] == "skipped" and blocked["blocked_by"] == "correctness", blocked
    assert items["wrong.py::correctness[seed=3]"]["status"] == "INCORRECT_NUMERICAL"
    assert items["good.py::preflight"]["figures"]["kind"] == "shout"
    assert items["good.py::sass"]["status"] == "NOT_APPLICABLE"
    assert items["good.py::compile"]["status"] == "NOT_APPLICABLE"
    verdicts = {k["name"]: k for k in doc["kernels"]}
    assert verdicts["good.py"]["status"] == "PASSED" and verdicts["wrong.py"]["failed_gate"] == "correctness"
    schema = json.loads(registry.path(registry.REPORT_SCHEMA).read_text())
    assert list(jsonschema.Draft202012Validator(schema).iter_errors(doc)) == []
    assert result.ret == 2


def test_a_plugin_gate_is_placed_after_its_prerequisites() -> None:
    """After the last of its needs, or after the gate it names; a name taken twice or a prerequisite that is no
    gate is refused with the fix."""
    mine = builtin_gates()
    table = GateTable.build(mine, [Gate("power", lambda c, k: None, needs=("timing",))])
    assert table.names[table.names.index("timing") + 1] == "power"
    table = GateTable.build(mine, [Gate("late", lambda c, k: None, after="sass")])
    assert table.names[-1] == "late"
    table = GateTable.build(mine, [Gate("free", lambda c, k: None)])
    assert table.names[-1] == "free" and table.rank("free") == len(mine)
    with pytest.raises(ConfigError, match="two gates are named 'timing'"):
        GateTable.build(mine, [Gate("timing", lambda c, k: None)])
    with pytest.raises(ConfigError, match="'nope', which is no gate"):
        GateTable.build(mine, [Gate("x", lambda c, k: None, needs=("nope",))])


def test_two_kinds_of_one_name_stop_the_session(pytester: pytest.Pytester) -> None:
    """A conftest kind named like kopt's own is a usage error naming both."""
    pytester.makeconftest("from pytest_kopt.kinds.python import PythonKind\n"
                          "class Mine(PythonKind):\n    pass\n"
                          "def pytest_kopt_kinds(config):\n    return [Mine()]\n")
    pytester.makepyfile(ref=REF, good=GOOD)
    result = pytester.runpytest_subprocess("--kopt-baseline", "good.py", "--kopt-ref", "ref.py", "--kopt-dims", "n=8",
                                           "-p", "no:cacheprovider", timeout=120)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*two kernel kinds are named 'python'*"])
