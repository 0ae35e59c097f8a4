"""The --kopt-json report against registries/report_schema.json: a real H200 report, a report made here on the
CPU, negative cases, and the schema's status enum against every status string in pytest_kopt's source."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is a test extra")

import pytest_kopt
from pytest_kopt.gates.builtin import default_table
from pytest_kopt.settings import SANITIZER_TOOLS

ROOT = Path(__file__).resolve().parent.parent
SCHEMA_PATH = ROOT / "registries" / "report_schema.json"
H200_REPORT = Path(__file__).resolve().parent / "data" / "h200_softmax_report.json"
#: The CUTLASS SGEMM example at 4096^3, every gate, from this session's H200 run (warm processes, interleaved
#: reference timing).
H200_CUTLASS_REPORT = Path(__file__).resolve().parent / "data" / "h200_gemm_cutlass_report.json"
#: the PR gate on the H200 (2026-11-29): pr/gemm_tiled.cu vs main/naive.cu at 4096^3, timed in the same rounds
H200_PR_REPORT = Path(__file__).resolve().parent / "data" / "h200_pr_report.json"
PACKAGE = Path(pytest_kopt.__file__).resolve().parent

CANDIDATE = """\
import torch


def setup(n, seed, device="cuda"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g).to(device)
    y = torch.empty(n, device=device)
    return {"inputs": {"x": x, "y": y}, "outputs": ["y"]}


def run_kernel(x, y):
    y.copy_(2 * x)
"""
REFERENCE = """\
def reference(x, y, **_):
    y.copy_(2 * x)
"""

#: Where pytest_kopt's source names an item status. The first two are the ``status="X"`` / ``status = "X"``
#: forms (KoptError subclasses, raise sites); the rest catch the other spellings in use: the correctness guards
#: (``fail("X", ...)`` in verdict.py, ``"key": ("X", ...)`` in gates.correctness.GUARD_STATUS) and the plugin's own
#: ``("kopt_status", "X")`` properties.
STATUS_PATTERNS = (
    re.compile(r'\bstatus="([A-Z_]+)"'),
    re.compile(r'\bstatus = "([A-Z_]+)"'),
    re.compile(r'\bfail\("([A-Z_]+)"'),
    re.compile(r'"[a-z_]+": \("([A-Z_]+)", '),
    re.compile(r'\("kopt_status", "([A-Z_]+)"\)'),
)


@pytest.fixture(scope="module")
def schema() -> dict:
    return json.loads(SCHEMA_PATH.read_text())


@pytest.fixture(scope="module")
def validator(schema: dict) -> "jsonschema.Draft202012Validator":
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.fixture(scope="module")
def h200_report() -> dict:
    return json.loads(H200_REPORT.read_text(), parse_constant=_reject_constant)


def _reject_constant(name: str) -> None:
    """json.dumps writes NaN/Infinity, which is not JSON (jq and most parsers refuse it): the report must not."""
    raise AssertionError(f"report contains {name}, which is not valid JSON")


def errors_of(validator: jsonschema.Draft202012Validator, doc: dict) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]


def source_statuses() -> dict[str, list[str]]:
    """Each status string found in the package's .py files, with where it was found."""
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            for pattern in STATUS_PATTERNS:
                for m in pattern.finditer(line):
                    found.setdefault(m.group(1), []).append(f"{path.name}:{lineno}")
    return found


def test_schema_is_valid_draft_2020_12(schema: dict) -> None:
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)


def test_h200_report_validates(validator: jsonschema.Draft202012Validator, h200_report: dict) -> None:
    """The real report of examples/softmax_triton on an NVIDIA H200 (every gate passed)."""
    assert errors_of(validator, h200_report) == []
    assert h200_report["env"]["gpu"]["name"] == "NVIDIA H200"
    assert {i["gate"] for i in h200_report["items"]} >= {"hardware", "correctness", "timing", "ncu", "sass"}


def test_h200_cutlass_report_validates(validator: jsonschema.Draft202012Validator) -> None:
    """The CUTLASS SGEMM example's real H200 report: valid, every gate passed, with the figures the README quotes."""
    doc = json.loads(H200_CUTLASS_REPORT.read_text(), parse_constant=_reject_constant)
    assert errors_of(validator, doc) == []
    status = {i["gate"]: i["status"] for i in doc["items"]}
    assert set(status.values()) == {"PASSED"} and {"timing", "ncu", "roofline", "sass"} <= set(status)
    timing = next(i for i in doc["items"] if i["gate"] == "timing")["figures"]
    assert round(timing["median_ms"], 2) == 3.46 and timing["stability"] == "stable"


def test_cpu_report_validates(pytester: pytest.Pytester, validator: jsonschema.Draft202012Validator) -> None:
    """A report written here by the plugin itself (pure-Python candidate: compile/sass not applicable, GPU gates
    skip without a GPU, correctness runs on the CPU)."""
    pytester.makepyfile(k=CANDIDATE, ref=REFERENCE)
    result = pytester.runpytest_subprocess("--kopt-baseline", "k.py", "--kopt-ref", "ref.py", "--kopt-dims", "n=64",
                                           "--kopt-seeds", "3", "--kopt-json", "r.json", "-p", "no:cacheprovider",
                                           timeout=600)
    assert result.ret == 0, result.stdout.str()
    doc = json.loads((pytester.path / "r.json").read_text(), parse_constant=_reject_constant)
    assert errors_of(validator, doc) == []
    assert doc["exit_code"] == 0 and doc["seeds"] == [3] and doc["dims"] == {"n": 64}
    items = {i["nodeid"].split("::", 1)[1]: i for i in doc["items"]}
    assert items["preflight"]["status"] == "PASSED"
    assert items["correctness[seed=3]"]["status"] == "PASSED"
    assert items["compile"]["status"] == "NOT_APPLICABLE"
    # the kernel's verdict: its output was checked on the CPU; it was not timed (no GPU)
    (verdict,) = doc["kernels"]
    assert verdict["name"] == "k.py" and verdict["status"] == "PASSED" and verdict["failed_gate"] is None
    assert verdict["output_checked"] is True and verdict["timed"] is False and verdict["median_ms"] is None
    assert verdict["skipped_gates"] == ["timing", "ncu", "roofline"]  # what a GPU would add, no more
    assert verdict["not_applicable_gates"] == ["compile", "sass"]  # a Python candidate has nothing to build
    na = sum(i["status"] == "NOT_APPLICABLE" for i in doc["items"])
    assert na == 2 and verdict["passed"] + verdict["skipped"] + na == len(doc["items"]) and verdict["failed"] == 0
    assert doc["session_seed"] is None  # --kopt-seeds listed the seeds
    # without --kopt-seeds the seeds come from a session seed: the report carries it, for --kopt-seed to replay
    # a report's name near the 255-byte limit (r2 + 243 "r"s + .json: 250 bytes) is written; its temporary file's
    # name is cut (before: "File name too long" and no report)
    long = "r2" + "r" * 243 + ".json"
    result = pytester.runpytest_subprocess("--kopt-baseline", "k.py", "--kopt-ref", "ref.py", "--kopt-dims", "n=64",
                                           "-k", "preflight", "--kopt-json", long, "-p", "no:cacheprovider",
                                           timeout=600)
    doc = json.loads((pytester.path / long).read_text(), parse_constant=_reject_constant)
    assert errors_of(validator, doc) == [] and isinstance(doc["session_seed"], int)
    result.stdout.fnmatch_lines([f"kopt seed: {doc['session_seed']} (replay: --kopt-seed {doc['session_seed']})"])


def test_a_kernels_verdict_says_when_its_output_was_never_checked() -> None:
    """The report's ``kernels``: an agent reads from it that a kernel passed with its output unchecked (a .cu on a
    machine without a GPU: exit 0, status NOT_CHECKED, not PASSED), which kernel failed at which gate first (gate order, not report order), a
    timed kernel's median and speedup, and a kernel none of whose items ran (SKIPPED, not PASSED)."""
    from pytest_kopt.records import GateRecord, kernel_verdicts

    def rec(node: str, gate: str, outcome: str, status: str, **kw: object) -> GateRecord:
        return GateRecord(nodeid=f"{node}::{gate}", kernel=f"/w/{node}", gate=gate, case=None, outcome=outcome,
                          status=status, **kw)  # type: ignore[arg-type]

    records = [rec("a.cu", "compile", "passed", "PASSED"), rec("a.cu", "correctness", "skipped", "SKIPPED",
                                                                 blocked_by="hardware"),
               rec("b.cu", "timing", "failed", "UNSTABLE", exit_code=2),
               rec("b.cu", "correctness", "failed", "INCORRECT_NUMERICAL", exit_code=2),
               rec("c.cu", "correctness", "passed", "PASSED"),
               rec("c.cu", "timing", "passed", "PASSED", figures={"median_ms": 1.25, "speedup_vs_ref": 2.0}),
               rec("d.cu", "timing", "skipped", "SKIPPED", blocked_by="hardware"),
               rec("d.cu", "ncu", "skipped", "SKIPPED", blocked_by="hardware")]
    a, b, c, d = kernel_verdicts(records, default_table())
    assert (d["status"], d["passed"], d["skipped"], d["output_checked"]) == ("SKIPPED", 0, 2, False)
    assert (a["status"], a["output_checked"], a["skipped_gates"], a["timed"]) == ("NOT_CHECKED", False,
                                                                                  ["correctness"], False)
    assert (b["status"], b["failed_gate"], b["exit_code"], b["failed"]) == ("INCORRECT_NUMERICAL", "correctness", 2, 2)
    assert (c["output_checked"], c["timed"], c["median_ms"], c["speedup_vs_ref"]) == (True, True, 1.25, 2.0)


def test_the_reports_kernels_and_items_follow_the_session_not_the_workers() -> None:
    """Under xdist the reports arrive in the order the workers finish: the document still lists the baseline first,
    then the candidates as given, a kernel the session did not name after them, and each kernel's items in gate
    order (its seeds in the order they ran)."""
    from types import SimpleNamespace

    from pytest_kopt.plugin.ledger import Ledger
    from pytest_kopt.records import GateRecord

    def rec(node: str, gate: str, case: str | None = None) -> GateRecord:
        return GateRecord(nodeid=f"{node}::{gate}" + (f"[{case}]" if case else ""), kernel=f"/w/{node}", gate=gate,
                          case=case, outcome="passed", status="PASSED")

    ledger = Ledger(default_table())
    ledger.records = [rec("cand.cu", "hardware"), rec("other.cu", "compile"), rec("cand.cu", "timing"),
                      rec("base.cu", "compile"), rec("cand.cu", "correctness", "seed=2"),
                      rec("cand.cu", "correctness", "seed=1"), rec("base.cu", "hardware")]
    settings = SimpleNamespace(kernels=(Path("/w/base.cu"), Path("/w/cand.cu")), baseline=Path("/w/base.cu"),
                               session_seed=None,
                               ref=Path("/w/ref.py"), dims={}, shapes=(), seeds=(1, 2), outdir=Path("/w/.kopt"))
    doc = ledger.document(exit_code=0, settings=settings, env={}, comparisons=[], loop=None)
    assert [k["name"] for k in doc["kernels"]] == ["base.cu", "cand.cu", "other.cu"]
    assert [i["nodeid"] for i in doc["items"]] == [
        "base.cu::hardware", "base.cu::compile", "cand.cu::hardware", "cand.cu::correctness[seed=2]",
        "cand.cu::correctness[seed=1]", "cand.cu::timing", "other.cu::compile"]
    assert [r.nodeid for r in ledger.records][0] == "cand.cu::hardware"  # the ledger itself is left as reported


#: A valid entry of the report's ``kernels``.
VERDICT = {"name": "k.cu", "kernel": "/w/k.cu", "status": "PASSED", "failed_gate": None, "exit_code": None,
           "passed": 5, "failed": 0, "skipped": 8, "skipped_gates": ["correctness", "timing"],
           "output_checked": False, "timed": False, "median_ms": None, "speedup_vs_ref": None}


def _mutations() -> dict[str, tuple[str, object]]:
    """name -> (what to change, how): each makes a valid report invalid."""
    return {
        "misspelled item key": ("item", lambda it: it.update(durations_s=it.pop("duration_s"))),
        "extra item key": ("item", lambda it: it.update(figure={})),
        "unknown status": ("item", lambda it: it.update(status="WRONG_ANSWER")),
        "lower-case status": ("item", lambda it: it.update(status="passed")),
        "unknown gate": ("item", lambda it: it.update(gate="Bench mark")),
        "unknown outcome": ("item", lambda it: it.update(outcome="error")),
        "exit code 1 on an item": ("item", lambda it: it.update(exit_code=1)),
        "negative duration": ("item", lambda it: it.update(duration_s=-0.5)),
        "nodeid without ::": ("item", lambda it: it.update(nodeid="softmax.py-hardware")),
        "non-scalar figure": ("item", lambda it: it["figures"].update(peaks={"dram": 4.8})),
        "list figure": ("item", lambda it: it["figures"].update(suspect=["host gap"])),
        "passed item with failure status": ("item", lambda it: it.update(status="INCORRECT_NUMERICAL")),
        "wrong schema_version": ("doc", lambda d: d.update(schema_version=2)),
        "wrong tool": ("doc", lambda d: d.update(tool="pytest-kopt2")),
        "missing items": ("doc", lambda d: d.pop("items")),
        "object dim": ("doc", lambda d: d["dims"].update(M={"v": 4096})),
        "float seed": ("doc", lambda d: d.update(seeds=[1.5])),
        "env without gpus": ("doc", lambda d: d["env"].pop("gpus")),
        "string exit code": ("doc", lambda d: d.update(exit_code="0")),
        "kernel verdict with an extra key": ("doc", lambda d: d.update(kernels=[{**VERDICT, "verdict": "ok"}])),
        "kernel verdict without output_checked": ("doc", lambda d: d.update(
            kernels=[{k: v for k, v in VERDICT.items() if k != "output_checked"}])),
    }


@pytest.mark.parametrize("name", list(_mutations()))
def test_schema_rejects(validator: jsonschema.Draft202012Validator, h200_report: dict, name: str) -> None:
    where, mutate = _mutations()[name]
    doc = copy.deepcopy(h200_report)
    mutate(doc["items"][0] if where == "item" else doc)  # type: ignore[operator]
    assert errors_of(validator, doc), f"{name}: accepted"


def test_schema_allows_extra_top_level_keys(validator: jsonschema.Draft202012Validator, h200_report: dict) -> None:
    """Forward compatibility: a newer plugin may add top-level keys (items stay closed)."""
    doc = copy.deepcopy(h200_report)
    doc["a_later_key"] = 12345
    assert errors_of(validator, doc) == []


def test_schema_accepts_a_failed_item(validator: jsonschema.Draft202012Validator, h200_report: dict) -> None:
    """The shape of a gate failure: status from the KoptError, its exit code, message, no figures."""
    doc = copy.deepcopy(h200_report)
    doc["items"][3].update(outcome="failed", status="INCORRECT_NUMERICAL", exit_code=2, summary=None,
                           message="seed=7 (normal inputs): output differs from the reference", figures={})
    doc["exit_code"] = 2
    assert errors_of(validator, doc) == []


def test_every_source_status_is_in_the_schema(schema: dict) -> None:
    """A status added to pytest_kopt must be added to the schema's enum too."""
    enum = set(schema["$defs"]["status"]["anyOf"][0]["enum"])
    found = source_statuses()
    assert {"PASSED", "SKIPPED", "NOT_APPLICABLE", "ERROR", "CONFIG_ERROR", "TIMEOUT", "SUSPECT"} <= set(found), \
        f"the status patterns no longer match the source: found {sorted(found)}"
    missing = {s: where for s, where in found.items() if s not in enum}
    assert not missing, f"statuses used in pytest_kopt but not in {SCHEMA_PATH.name}: {missing}"
    sanitizer = {f"SANITIZER_{t.upper()}" for t in SANITIZER_TOOLS}  # gates/sanitizer.py: status=f"SANITIZER_{tool.upper()}"
    assert sanitizer <= enum, sorted(sanitizer - enum)


def test_schema_statuses_all_exist_in_source(schema: dict) -> None:
    """No stale entries: each enum status is a string literal somewhere in pytest_kopt (or SANITIZER_<tool>)."""
    text = "\n".join(p.read_text() for p in PACKAGE.rglob("*.py"))
    sanitizer = {f"SANITIZER_{t.upper()}" for t in SANITIZER_TOOLS}
    stale = [s for s in schema["$defs"]["status"]["anyOf"][0]["enum"] if s not in sanitizer and f'"{s}"' not in text]
    assert not stale, f"schema statuses not used in pytest_kopt: {stale}"


def test_gate_enum_matches_gates(schema: dict) -> None:
    assert schema["$defs"]["gate"]["anyOf"][0]["enum"] == default_table().names


def test_h200_pr_gate_report_validates(validator: jsonschema.Draft202012Validator) -> None:
    """The PR gate's real H200 report (tiled vs naive SGEMM 4096^3): valid, FASTER with the interleaved CI the
    README quotes, and the verdict agrees with the timing medians of the two kernels."""
    doc = json.loads(H200_PR_REPORT.read_text(), parse_constant=_reject_constant)
    assert errors_of(validator, doc) == []
    (cmp,) = doc["comparisons"]
    assert cmp["verdict"] == "FASTER" and cmp["interleaved"] is True and not cmp["fails"]
    assert [round(x, 3) for x in (cmp["speedup"], *cmp["ci95"])] == [5.718, 5.712, 5.747]
    med = {i["nodeid"].split("/")[0]: i["figures"]["median_ms"] for i in doc["items"] if i["gate"] == "timing"}
    assert 5.5 < med["main"] / med["pr"] < 6.0, med


def test_schema_accepts_kernel_verdicts(validator: jsonschema.Draft202012Validator, h200_report: dict) -> None:
    """A report with the ``kernels`` section validates (the recorded H200 report predates it)."""
    doc = {**h200_report, "kernels": [VERDICT, {**VERDICT, "name": "b.cu", "status": "INCORRECT_NUMERICAL",
                                                 "failed_gate": "correctness", "exit_code": 2, "failed": 1}]}
    assert errors_of(validator, doc) == []
