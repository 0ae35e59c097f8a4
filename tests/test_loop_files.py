"""The loop's files as an agent or a candidate may leave them: bad types, bad bytes, stray and linked folders, an
option smuggled into a command. Each is refused as a usage error (exit 4) listing its problems, with the
--kopt-json report written, or reported; never an INTERNALERROR, never judged. Sessions run on the CPU (pure-Python
candidates), like tests/test_loop.py's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

from pytest_kopt import registry
from pytest_kopt.errors import ConfigError
from pytest_kopt.gates import hardware
from pytest_kopt.loop import session
from pytest_kopt.loop import state as loop

from test_loop_close import METHOD, Run

REDTEAM = Path(__file__).parent / "redteam"
ROOF = {"axis_budget": {"compute": 1, "memory": 1, "latency": 1}, "near_peak": False}


def cpu_run(folder: Path, branches: int = 2) -> tuple[Path, Path]:
    """A run seeded as --kopt-init seeds it (softmax reference, pure-Python baseline), iteration 1 open with
    b1 written (the honest kernel) and methods.json; returns (run, iterv1)."""
    shutil.copy(REDTEAM / "ref_softmax.py", folder / "ref.py")
    base = folder / "k.py"
    shutil.copy(REDTEAM / "honest_python.py", base)
    run = loop.new_run_dir(base)
    loop.init_state(run, base, folder / "ref.py", {"M": 4, "N": 16}, iterations=2, branches=branches, ncu_num=5,
                    noise_pct=2.0, numerics_mode="reference", seeds=[3], env={"sm_arch": "sm_90a"})
    it = Path(loop.open_iteration(run, 1, ncu_rep=None, roofline=ROOF, branches=branches, ncu_top={}))
    shutil.copy(REDTEAM / "honest_python.py", it / "branches" / "b1" / "kernel.py")
    (it / "methods.json").write_text(json.dumps({"methods": ["latency.occupancy_tuning"]}))
    return run, it


def edit_state(run: Path, change: Callable[[dict[str, Any]], None]) -> None:
    doc = json.loads((run / "state.json").read_text())
    change(doc)
    (run / "state.json").write_text(json.dumps(doc))


def problems_of(exc: pytest.ExceptionInfo[ConfigError]) -> list[str]:
    return [ln[2:] for ln in (exc.value.details or "").splitlines() if ln.startswith("- ")]


@pytest.mark.parametrize(("change", "field", "said"), [
    (lambda s: s.update(validation_seeds="12"), "validation_seeds", "is not of type 'array'"),
    (lambda s: s.update(validation_seeds=[1, -2]), "validation_seeds.1", "less than the minimum of 0"),
    (lambda s: s.update(open_iter="1"), "open_iter", "is not of type 'integer', 'null'"),
    (lambda s: s.update(open_iter=0), "open_iter", "less than the minimum of 1"),
    (lambda s: s.update(branches="2"), "branches", "is not of type 'integer'"),
    (lambda s: s.update(dims=[4, 16]), "dims", "is not of type 'object'"),
    (lambda s: s.update(dims={"M; rm": 4}), "dims", "does not match"),
    (lambda s: s.pop("ref_file"), "", "'ref_file' is a required property"),
    (lambda s: s.update(numerics_mode="lax"), "numerics_mode", "is not one of"),
    (lambda s: s.update(noise_threshold_pct=float("inf")), "", "Infinity is not a JSON number"),
    (lambda s: s.update(baseline_file="-pNAME"), "baseline_file", "does not match"),
    (lambda s: s.update(history=[{"iter": 1}]), "history.0", "'champion' is a required property"),
])
def test_a_state_field_of_the_wrong_type_or_missing_is_listed(tmp_path: Path, change: Callable[[dict], None],
                                                              field: str, said: str) -> None:
    """state.json is checked against registries/loop_schema.json before a field is used (before: validation_seeds
    "12" ran seeds 1 and 2, a string open_iter or a missing ref_file was an INTERNALERROR)."""
    run, _ = cpu_run(tmp_path)
    edit_state(run, change)
    with pytest.raises(ConfigError) as exc:
        session.run_overrides(run)
    assert exc.value.exit_code == 4 and exc.value.path == str(run / "state.json")
    prefix = f"state.json: {field}: " if field else "state.json: "
    assert any(p.startswith(prefix) and said in p for p in problems_of(exc)), problems_of(exc)


@pytest.mark.parametrize(("change", "said"), [
    (lambda s: s.update(open_iter=2), "open_iter is 2, but"),
    (lambda s: s.update(open_iter=3), "open_iter is 3, beyond iterations_total 2"),
    (lambda s: s.update(run_dir="/elsewhere/run_1"), "run_dir is /elsewhere/run_1, not this run directory"),
    (lambda s: s.update(best_file="/etc/passwd.py"), "best_file is /etc/passwd.py, neither the baseline's copy"),
])
def test_state_paths_that_do_not_fit_the_run_are_refused(tmp_path: Path, change: Callable[[dict], None],
                                                         said: str) -> None:
    run, _ = cpu_run(tmp_path)
    edit_state(run, change)
    with pytest.raises(ConfigError) as exc:
        session.run_overrides(run)
    assert any(said in p for p in problems_of(exc)), problems_of(exc)


def test_a_loop_file_error_is_exit_4_with_the_report_not_an_internal_error(pytester: pytest.Pytester) -> None:
    """Non-UTF-8 bytes in methods.json and a malformed open_iter: before, UnicodeDecodeError and TypeError escaped
    pytest_configure (INTERNALERROR, exit 3: 'hardware' by the loop's convention) and no --kopt-json report was
    written. Now: exit 4 and the report's error lists the problem, the loop section says what to do."""
    run, it = cpu_run(pytester.path)
    (it / "methods.json").write_bytes(b'{"methods": ["\xff\xfe"]}')
    result = pytester.runpytest_subprocess("--kopt-run", str(run), "-p", "no:cacheprovider", "--kopt-json", "a.json")
    assert result.ret == 4 and "INTERNALERROR" not in result.stderr.str() + result.stdout.str()
    doc = json.loads((pytester.path / "a.json").read_text())
    assert doc["exit_code"] == 4 and doc["error"]["path"] == str(it / "methods.json")
    assert doc["error"]["gate"] == "methods" and doc["loop"]["stage"] == "methods"
    assert doc["error"]["problems"] == ["methods.json: byte 14 is not UTF-8 (b'\\xff')"]
    assert doc["loop"]["next"]["action"] == "fix_and_rerun" and doc["loop"]["exit_code"] == 4
    assert doc["loop"]["next"]["runs_here"] is None  # not known: the session stopped before it looked at the machine
    edit_state(run, lambda s: s.update(open_iter={"i": 1}))
    result = pytester.runpytest_subprocess("--kopt-run", str(run), "-p", "no:cacheprovider", "--kopt-json", "b.json")
    assert result.ret == 4 and "INTERNALERROR" not in result.stderr.str() + result.stdout.str()
    doc = json.loads((pytester.path / "b.json").read_text())
    assert doc["error"]["problems"] == ["state.json: open_iter: {'i': 1} is not of type 'integer', 'null'"]
    # the same command again, writing the same report, with this Python (not whatever python3 is on PATH)
    again = str(pytester.path / "b.json")
    assert doc["loop"]["next"]["command"] == [sys.executable, "-m", "pytest", f"--kopt-run={run}", f"--kopt-json={again}"]
    assert doc["loop"]["next"]["report"] == again
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(doc, registry.load("report_schema.json"))


@pytest.mark.parametrize(("doc", "said"), [
    ({"methods": [{"id": METHOD, "override_reason": 5}]}, "methods.0.override_reason: 5 is not of type"),
    ({"methods": [{"id": METHOD, "acknowledge_failure": "yes"}]}, "methods.0.acknowledge_failure: 'yes' is not"),
    ({"methods": [{"id": ""}]}, "methods.0.id: '' should be non-empty"),
])
def test_methods_json_entries_of_the_wrong_type_are_listed(tmp_path: Path, doc: dict, said: str) -> None:
    run, it = cpu_run(tmp_path)
    (it / "methods.json").write_text(json.dumps(doc))
    with pytest.raises(ConfigError) as exc:
        session.run_overrides(run)
    assert any(said in p for p in problems_of(exc)), problems_of(exc)


def test_a_branch_folder_linked_outside_the_run_is_refused_and_nothing_is_written_there(
        pytester: pytest.Pytester) -> None:
    """Before, branches/b3 -> a folder outside the run (in a 2-branch run) was collected as a branch: its plan.json
    and correctness records were written outside the run directory. Now the session stops at configure, exit 4,
    naming the link, where it leads and the fix."""
    run, it = cpu_run(pytester.path)
    outside = pytester.path / "outside"
    outside.mkdir()
    shutil.copy(REDTEAM / "honest_python.py", outside / "kernel.py")
    (it / "branches" / "b3").symlink_to(outside)
    result = pytester.runpytest_subprocess("--kopt-run", str(run), "-p", "no:cacheprovider", "--kopt-json", "r.json")
    assert result.ret == 4
    assert sorted(p.name for p in outside.iterdir()) == ["kernel.py"]  # no plan.json, no correctness/
    doc = json.loads((pytester.path / "r.json").read_text())
    assert doc["error"]["problems"] == [
        f"{it / 'branches' / 'b3'} leads outside the run directory {run} (to {outside.resolve()})"]
    assert "no symbolic links" in doc["error"]["fix"]


@pytest.mark.parametrize("case", ["stray_name", "beyond_count", "linked_inside", "kernel_link", "unknown_method",
                                  "ablation_link", "both_kernels", "artifact_link", "ablation_artifact_link"])
def test_what_the_iteration_did_not_create_is_refused(tmp_path: Path, case: str) -> None:
    """Only b1..bK (K = state.json's branches) under branches/, only ablations/<method id>/ under ablations/, as
    plain folders and files of the run: before, b1_old and b7 were judged as branches."""
    run, it = cpu_run(tmp_path, branches=4)
    b = it / "branches"
    kernel = REDTEAM / "honest_python.py"
    if case == "stray_name":
        (b / "b1_old").mkdir()
        shutil.copy(kernel, b / "b1_old" / "kernel.py")
        said = f"{b / 'b1_old'} is not a branch folder of iterv1 (its branches are b1..b4"
    elif case == "beyond_count":
        (b / "b7").mkdir()
        shutil.copy(kernel, b / "b7" / "kernel.py")
        said = f"{b / 'b7'} is not a branch folder of iterv1 (its branches are b1..b4"
    elif case == "linked_inside":
        shutil.rmtree(b / "b2")
        (b / "b2").symlink_to(b / "b1")
        said = f"{b / 'b2'} is a symbolic link (to {(b / 'b1').resolve()})"
    elif case == "kernel_link":
        (b / "b2" / "kernel.py").symlink_to(tmp_path / "k.py")
        said = f"{b / 'b2' / 'kernel.py'} leads outside the run directory"
    elif case == "unknown_method":
        (it / "ablations" / "memory.made_up").mkdir()
        shutil.copy(kernel, it / "ablations" / "memory.made_up" / "kernel.py")
        said = f"{it / 'ablations' / 'memory.made_up'} names no method of method_registry.json or methods.json"
    elif case == "ablation_link":
        (it / "ablations" / METHOD).symlink_to(b / "b1")
        said = f"{it / 'ablations' / METHOD} is a symbolic link"
    elif case == "artifact_link":  # the gates would write b2's correctness records where it leads
        (tmp_path / "elsewhere").mkdir()
        (b / "b2" / "correctness").symlink_to(tmp_path / "elsewhere")
        said = f"{b / 'b2' / 'correctness'} is a symbolic link (to {tmp_path / 'elsewhere'}); a branch or ablation"
    elif case == "ablation_artifact_link":
        folder = it / "ablations" / METHOD
        (folder / "sass").mkdir(parents=True)
        shutil.copy(kernel, folder / "kernel.py")
        (folder / "sass" / "k.sass").symlink_to(b / "b1" / "kernel.py")
        said = f"{folder / 'sass' / 'k.sass'} is a symbolic link"
        (b / "b1" / ".#kernel.py").symlink_to("user@host.123")  # an editor's lock: hidden, never judged, left alone
    else:
        (b / "b2" / "kernel.cu").write_text("// b2\n")
        shutil.copy(kernel, b / "b2" / "kernel.py")
        said = f"{b / 'b2'} holds both kernel.cu and kernel.py"
    (b / "common.cuh").write_text("// a header the branches share: a file, left alone\n")
    with pytest.raises(ConfigError) as exc:
        session.run_overrides(run)
    assert any(p.startswith(said) for p in problems_of(exc)), problems_of(exc)
    assert len(problems_of(exc)) == 1 and exc.value.exit_code == 4 and "b1..bK" in (exc.value.fix or "")


def test_an_empty_branch_folder_is_reported_as_not_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """b2 left empty in a 3-branch run: the close judges b1 and b3 and says b2 was not written, in its result and
    in branch_results.json (before: dropped without a word, and b3 took index 2)."""
    r = Run(tmp_path, branches=3)
    r.fake_profile(monkeypatch)
    b1, b3 = r.kernel("branches/b1", 10.0), r.kernel("branches/b3", 9.0)
    r.judged(b1, b3, r.kernel(f"ablations/{METHOD}", 12.0, base="b3"))
    out = r.close()
    assert out["exit_code"] == 0 and out["not_written"] == ["b2"]
    assert [(b["branch"], b["index"]) for b in out["branches"]] == [("b1", 1), ("b3", 3)]
    assert json.loads((r.it / "branch_results.json").read_text())["not_written"] == ["b2"]


def test_a_loop_file_spoiled_during_the_session_is_exit_4_and_leaves_the_iteration_open(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The files are read again at the session's end: a methods.json rewritten as UTF-16 while the branches ran
    is a step result of exit 4 with its problems (before: UnicodeDecodeError out of pytest_sessionfinish)."""
    r = Run(tmp_path)
    r.fake_profile(monkeypatch)
    r.judged(r.kernel("branches/b1", 10.0))
    (r.it / "methods.json").write_bytes(json.dumps({"methods": [METHOD]}).encode("utf-16"))
    out = r.close()
    assert out["exit_code"] == 4 and out["error"]["path"] == str(r.it / "methods.json")
    assert out["error"]["problems"] == ["methods.json: byte 0 is not UTF-8 (b'\\xff')"]
    state = loop.load_state(r.run)
    assert (state["open_iter"], state["run_status"], state["history"]) == (1, "iterating", [])


def test_a_rerun_on_a_machine_without_generation_is_not_to_run_here(pytester: pytest.Pytester) -> None:
    """A --kopt-run whose methods.json is spoiled while it runs ends with exit 4 at the session's end, fix_and_rerun;
    on a machine that does not allow generation (this one: no GPU) the fixed command would stop the run (SKILL.md
    step 0), so next says so: runs_here False, requires naming the machine and why not this one (before:
    runs_here True, and following it stopped the run)."""
    if hardware.probe_gpus()["gpus"]:
        pytest.skip("a GPU is visible here: this test is for a machine that does not allow generation")
    run, it = cpu_run(pytester.path)
    pytester.makeconftest(f"""
import json, pathlib
def pytest_collection_finish(session):
    pathlib.Path({str(it / "methods.json")!r}).write_bytes(json.dumps({{"methods": ["x"]}}).encode("utf-16"))
""")
    result = pytester.runpytest_subprocess("--kopt-run", str(run), "-p", "no:cacheprovider", "--kopt-json", "r.json")
    doc = json.loads((pytester.path / "r.json").read_text())
    assert result.ret == 4 and doc["loop"]["exit_code"] == 4, result.stdout.str()
    nxt = doc["loop"]["next"]
    assert nxt["action"] == "fix_and_rerun" and nxt["runs_here"] is False
    assert nxt["requires"].startswith("a machine with an NVIDIA GPU, nvcc and ncu that can read its counters: this one "
                                      "does not allow generation (")
    assert nxt["requires"].endswith("; a finish written into methods.json runs here")
    assert loop.load_state(run)["run_status"] == "iterating"  # the run is left as it was


def test_next_command_carries_no_value_that_could_be_read_as_an_option(pytester: pytest.Pytester) -> None:
    """A stopped run's next.command was built from state.json's strings as separate argv elements: a
    baseline_file of -pkopt_evil made the command import kopt_evil.py as a pytest plugin. Now such a state is
    refused (baseline_file must be an absolute .cu/.py path), the report's command is not built from it, and
    every value of a command is one --kopt-x=VALUE element."""
    run, _ = cpu_run(pytester.path)
    loop.stop_run(run, "no GPU", "hardware", 3)
    pytester.makepyfile(kopt_evil="open('PWNED', 'w').close()\n")
    edit_state(run, lambda s: s.update(baseline_file="-pkopt_evil"))
    with pytest.raises(ConfigError, match="baseline_file: '-pkopt_evil' does not match"):
        loop.next_step(run)
    result = pytester.runpytest_subprocess("--kopt-run", str(run), "-p", "no:cacheprovider", "--kopt-json", "r.json")
    doc = json.loads((pytester.path / "r.json").read_text())
    assert result.ret == 4 and doc["error"]["problems"][0].startswith("state.json: baseline_file:")
    command = doc["loop"]["next"]["command"]
    assert not any(a.startswith("-p") for a in command), command
    subprocess.run([sys.executable, *command[1:], "--co", "-q"], cwd=pytester.path, capture_output=True,
                   timeout=120, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert not (pytester.path / "PWNED").exists()
    # the commands of a sound run: the flags, then each value in one --kopt-x=VALUE element
    from pytest_kopt.loop import view
    from pytest_kopt.loop.layout import RunLayout
    from pytest_kopt.loop.runstate import State

    edit_state(run, lambda s: s.update(baseline_file=str(pytester.path / "k.py")))
    (pytester.path / "open").mkdir()
    open_run, _ = cpu_run(pytester.path / "open")
    start_over, close = loop.next_step(run)["command"], loop.next_step(open_run)["command"]
    assert start_over[3] == "--kopt-init" and close[3] == f"--kopt-run={open_run}"
    state = State.load(open_run)
    for cmd in (start_over, close, view.run_command(RunLayout(open_run), open_run / "r.json", state, finalize=True)):
        values = [a for a in cmd[3:] if a not in ("--kopt-init", "--kopt-finalize", "-n", "4")]
        assert values and all(a.startswith("--kopt-") and "=" in a for a in values), cmd


def test_the_run_layout_is_the_one_place_that_knows_the_paths(tmp_path: Path) -> None:
    from pytest_kopt.loop.layout import Place, RunLayout

    layout = RunLayout(tmp_path / "run")
    it = layout.iteration(2)
    k = it.branch_dir(3) / "kernel.cu"
    a = it.ablation_dir(METHOD) / "kernel.py"
    assert k == tmp_path / "run" / "iterv2" / "branches" / "b3" / "kernel.cu"
    assert layout.place(k) == Place("branch", 2, "b3") and layout.branch_of(k) == "b3"
    assert layout.place(a) == Place("ablation", 2, METHOD) and layout.is_ablation_kernel(a)
    assert not layout.is_branch_kernel(a) and layout.artifact_folder(a) == a.parent
    for other in (it.dir / "branches" / "b1_old" / "kernel.cu", it.dir / "kernel.cu", tmp_path / "b1" / "kernel.cu",
                  it.branch_dir(1) / "main.cu", layout.root / "iterv0" / "branches" / "b1" / "kernel.cu"):
        assert layout.place(other) is None and layout.artifact_folder(other) is None, other
    assert (it.attribution.name, it.sass_check.name, it.decision_ablations.name, layout.stop.name) == (
        "attribution.json", "sass_check.json", "decision_ablations.json", "stop.json")


def test_the_loop_records_read_and_write_themselves_and_refuse_a_bad_file(tmp_path: Path) -> None:
    from pytest_kopt.loop.records import Attribution, BranchResults, Decision, SassCheck, Stop

    records = [Stop.now("all branches failed a strict gate", "branch_explore", 2),
               Attribution(4.0, 2.0, {METHOD: {"ms_without": 5.0, "attribution_ms": 1.0, "attribution_pct": 25.0,
                                               "contributed": True}}),
               SassCheck({METHOD: "pass"}, {METHOD: {"status": "pass"}}),
               BranchResults(1, [{"branch": "b1", "index": 1, "kernel": "/r/b1/kernel.cu", "passed": True,
                                  "median_ms": 4.0}], "b1", not_written=["b2"]),
               Decision("interleaved", "GPU-0", 0, ["GPU-0", "GPU-1"], 10.0, 4, True, {"branches/b1": 4.0},
                        {"branches/b1": [3.9, 4.1]}, {}, {"branches/b1": "/r/b1/kernel.cu"}, {}, {}, None)]
    spoil = {"stop": {"exit_code": 1}, "attribution": {"champion_ms": "4"}, "sass_check": {"methods": {METHOD: "ok"}},
             "branch_results": {"champion": "b1_old"}, "decision": {"retimed_ms": {"branches/b1": None}}}
    for rec in records:
        path = rec.save(tmp_path / f"{rec.KIND}.json")
        assert type(rec).load(path) == rec
        path.write_text(json.dumps({**rec.to_json(), **spoil[rec.KIND]}))
        with pytest.raises(ConfigError, match=f"is not a valid {rec.KIND}.json"):
            type(rec).load(path)
    assert "awaiting_ablations" not in BranchResults(1, [], None).to_json()  # left out when None


def test_an_unknown_state_key_survives_every_merge(tmp_path: Path) -> None:
    from pytest_kopt.loop.runstate import State

    run, _ = cpu_run(tmp_path)
    edit_state(run, lambda s: s.update(agent_note="keep me"))
    state = State.update(run, best_metric_ms=3.0)
    assert state.extra == {"agent_note": "keep me"} and loop.load_state(run)["agent_note"] == "keep me"


def test_a_nan_in_a_record_is_written_as_null_so_the_state_stays_readable(tmp_path: Path) -> None:
    """The strict reader refuses NaN (JSON has none); what the loop writes from a gate's figures (a bench.json
    kept in the ablation step, a NaN attribution) must not make its own state unreadable."""
    from pytest_kopt.loop.runstate import State

    run, _ = cpu_run(tmp_path)
    State.update(run, baseline_ms=float("nan"), agent_note={"robust_cv": float("inf")})
    doc = json.loads((run / "state.json").read_text())
    assert doc["baseline_ms"] is None and doc["agent_note"] == {"robust_cv": None}
    assert State.load(run).baseline_ms is None


def test_an_iteration_folder_planted_as_a_link_is_not_opened(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """iterv2 made a link to a folder outside the run before the close opens it (a candidate's process can write
    there): the close would have written iterv2's evidence and branch folders outside the run."""
    r = Run(tmp_path)
    r.fake_profile(monkeypatch)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (r.run / "iterv2").symlink_to(outside)
    r.judged(r.kernel("branches/b1", 10.0), r.kernel(f"ablations/{METHOD}", 12.0, base="b1"))
    out = r.close()
    assert out["exit_code"] == 4 and out["error"]["problems"] == [
        f"{r.run / 'iterv2'} leads outside the run directory {r.run} (to {outside.resolve()})"]
    assert list(outside.iterdir()) == []


def test_a_step_that_cannot_read_its_state_asks_for_a_rerun_that_writes_the_sessions_report(tmp_path: Path) -> None:
    """state.json made unreadable while a step ran: no step's report path is known, so the step's next is the same
    --kopt-run with this Python, and the plugin adds the session's own --kopt-json path (rerun_writing); a next
    that already writes a report keeps it."""
    from pytest_kopt.errors import ConfigError
    from pytest_kopt.loop import session, state as st

    run, _ = cpu_run(tmp_path)
    (run / "state.json").write_text("{")
    nxt = session._next_or_fix(run, ConfigError("state.json: not JSON", path=str(run / "state.json")))
    assert nxt["action"] == "fix_and_rerun" and nxt["report"] is None
    assert nxt["command"] == [sys.executable, "-m", "pytest", f"--kopt-run={run}"]
    mine = tmp_path / "step.json"
    again = st.rerun_writing(nxt, mine)
    assert again["command"] == [*nxt["command"], f"--kopt-json={mine}"] and again["report"] == str(mine)
    assert again["runs_here"] is True  # the file fixed, the same command here
    assert st.rerun_writing(again, tmp_path / "other.json") == again  # its report already named
    closing = {"action": "write_and_close", "command": ["x"], "report": None}
    # only a rerun is made to write the session's report
    assert st.rerun_writing(closing, mine) == {**closing, "runs_here": True}
