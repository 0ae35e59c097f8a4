"""The run's pinned inputs (pytest_kopt.loop.pins): --kopt-init copies the reference (and the modules beside it
that it imports) and the baseline into the run and records their SHA-256; --kopt-run judges against the copies
and refuses a copy, a neighbour or a registry that changed, or a ref_file pointed elsewhere."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from pytest_kopt import registry
from pytest_kopt.errors import ConfigError
from pytest_kopt.loop import schema, session
from pytest_kopt.loop import state as loop

from test_loop_files import REDTEAM, cpu_run, edit_state, problems_of

#: a reference that accepts a kernel which returns its input (and fails the honest softmax)
LAX = "def reference(x, y, **_):\n    y.copy_(x)\n"


def test_init_copies_the_reference_and_what_it_imports_read_only(tmp_path: Path) -> None:
    from pytest_kopt.loop.pins import imported_neighbours

    (tmp_path / "ref.py").write_text("import helper\nfrom pkg import sub\n\ndef reference(x, y, **_):\n"
                                     "    y.copy_(helper.f(x))\n")
    (tmp_path / "helper.py").write_text("import deep\n\ndef f(x):\n    return deep.g(x)\n")
    (tmp_path / "deep.py").write_text("def g(x):\n    return x\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "sub.py").write_text("X = 1\n")
    (tmp_path / "unrelated.py").write_text("raise SystemExit\n")
    (tmp_path / "k.cu").write_text("// baseline\n")
    assert sorted(p.relative_to(tmp_path).as_posix() for p in imported_neighbours(tmp_path / "ref.py")) == [
        "deep.py", "helper.py", "pkg/__init__.py", "pkg/sub.py"]
    run = loop.new_run_dir(tmp_path / "k.cu")
    state = loop.init_state(run, tmp_path / "k.cu", tmp_path / "ref.py", {"M": 64}, iterations=1, branches=1,
                            ncu_num=5, noise_pct=2.0, numerics_mode="reference", seeds=[1], env={})
    assert state["ref_file"] == str(run / "reference" / "ref.py") and state["ref_source"] == str(tmp_path / "ref.py")
    assert sorted(state["pinned_sha256"]) == ["baseline/k.cu", "reference/deep.py", "reference/helper.py",
                                              "reference/pkg/__init__.py", "reference/pkg/sub.py", "reference/ref.py"]
    assert sorted(state["registries_sha256"]) == ["loop_schema.json", "method_registry.json", "metric_registry.json",
                                                  "sass_signatures.json"]
    copy = run / "reference" / "ref.py"
    assert copy.read_bytes() == (tmp_path / "ref.py").read_bytes() and not (run / "reference" / "unrelated.py").exists()
    assert not os.stat(copy).st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)


def test_the_close_judges_against_the_runs_copy_not_the_edited_reference(pytester: pytest.Pytester) -> None:
    """ref.py edited into a lax reference after --kopt-init: before, --kopt-run read the user's file, so the
    kernel returning its input (b2) passed and the honest softmax (b1) failed. Now the run's copy decides."""
    run, it = cpu_run(pytester.path)
    shutil.copy(REDTEAM / "passthrough.py", it / "branches" / "b2" / "kernel.py")
    (pytester.path / "ref.py").write_text(LAX)
    result = pytester.runpytest_subprocess("--kopt-run", str(run), "-p", "no:cacheprovider", "--kopt-json", "r.json")
    doc = json.loads((pytester.path / "r.json").read_text())
    status = {Path(i["kernel"]).parent.name: i["status"] for i in doc["items"] if i["gate"] == "correctness"}
    assert status == {"b1": "PASSED", "b2": "INCORRECT_NUMERICAL"}, result.stdout.str()[-2000:]
    assert doc["ref"] == str(run / "reference" / "ref.py")


def test_a_ref_file_pointed_elsewhere_is_refused(pytester: pytest.Pytester) -> None:
    run, _ = cpu_run(pytester.path)
    (pytester.path / "lax.py").write_text(LAX)
    edit_state(run, lambda s: s.update(ref_file=str(pytester.path / "lax.py")))
    result = pytester.runpytest_subprocess("--kopt-run", str(run), "-p", "no:cacheprovider", "--kopt-json", "r.json")
    assert result.ret == 4
    doc = json.loads((pytester.path / "r.json").read_text())
    assert doc["error"]["problems"] == [f"state.json: ref_file is {pytester.path / 'lax.py'}, not the run's private "
                                        f"copy {run / 'reference' / 'ref.py'}"]


def loosen_the_loop_schema(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    """The registries as a copy whose loop_schema.json accepts any loop file, in place of the installed ones for
    this test; the schema caches are cleared before and after, so no other test validates against the copy."""
    loose = tmp_path / "registries"
    shutil.copytree(registry.REGISTRY_DIR, loose)
    doc = json.loads((loose / "loop_schema.json").read_text())
    doc["$defs"] = {k: {} for k in doc["$defs"]}
    (loose / "loop_schema.json").write_text(json.dumps(doc))

    def clear() -> None:
        registry.load.cache_clear()
        schema._validator.cache_clear()

    clear()
    request.addfinalizer(clear)
    monkeypatch.setattr(registry, "REGISTRY_DIR", loose)


@pytest.mark.parametrize("case", ["copy_edited", "copy_gone", "module_added", "baseline_edited", "registry",
                                  "loop_schema"])
def test_a_pinned_input_that_changed_is_refused_naming_the_file(tmp_path: Path, case: str,
                                                                monkeypatch: pytest.MonkeyPatch,
                                                                request: pytest.FixtureRequest) -> None:
    run, _ = cpu_run(tmp_path)
    copy = run / "reference" / "ref.py"
    if case == "copy_edited":
        os.chmod(copy, 0o644)
        copy.write_text(LAX)
        said = f"{copy}: changed since it was pinned"
    elif case == "copy_gone":
        os.chmod(copy, 0o644)
        copy.unlink()
        said = f"{copy}: pinned at --kopt-init, now gone"
    elif case == "module_added":
        (run / "reference" / "torch_helpers.py").write_text("X = 1\n")
        said = f"{run / 'reference' / 'torch_helpers.py'}: added to the run's private reference folder"
    elif case == "baseline_edited":
        base = run / "baseline" / "k.py"
        os.chmod(base, 0o644)
        base.write_text("# another baseline\n")
        said = f"{base}: changed since it was pinned"
    elif case == "registry":  # as if method_registry.json had changed since the run was seeded
        edit_state(run, lambda s: s["registries_sha256"].update({"method_registry.json": "0" * 64}))
        said = "method_registry.json: the registry changed since the run was seeded"
    else:  # the schema the loop's files are validated against, loosened after the run was seeded (in a copy)
        loosen_the_loop_schema(tmp_path, monkeypatch, request)
        said = "loop_schema.json: the registry changed since the run was seeded"
    with pytest.raises(ConfigError) as exc:
        session.run_overrides(run)
    assert any(p.startswith(said) or said in p for p in problems_of(exc)), problems_of(exc)
    assert "start a new run" in (exc.value.fix or "")


@pytest.mark.parametrize("malformed", [
    {"pinned_sha256": ["x"]}, {"registries_sha256": {"loop_schema.json": None, "x": ["y"]}}, {"open_iter": "1"}])
def test_a_loosened_loop_schema_is_refused_before_it_validates_state_json(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest, malformed: dict) -> None:
    """A loop_schema.json loosened after --kopt-init and a state.json of wrong types beside it: the close refused
    it with a traceback (AttributeError, exit 3: kopt's hardware code) because the loosened schema validated the
    state first. The schema's pin is checked on the raw state.json (the first and third cases keep the recorded
    hash: the pin decides); a state.json whose recorded hash is dropped (null, the second) is refused by the schema
    the run was seeded with."""
    run, _ = cpu_run(tmp_path)
    if "registries_sha256" not in malformed:
        edit_state(run, lambda s: s.update(malformed))
        loosen_the_loop_schema(tmp_path, monkeypatch, request)
        with pytest.raises(ConfigError) as exc:
            session.run_overrides(run)
        assert exc.value.exit_code == 4
        assert any("loop_schema.json: the registry changed since the run was seeded" in p for p in problems_of(exc))
    else:  # the recorded hash removed (null) with the schema as seeded: the schema refuses the state
        edit_state(run, lambda s: s["registries_sha256"].update(malformed["registries_sha256"]))
        with pytest.raises(ConfigError) as exc:
            session.run_overrides(run)
        assert exc.value.exit_code == 4 and "registries_sha256" in str(exc.value), str(exc.value)


def test_the_champion_copy_is_pinned_when_the_iteration_closes(tmp_path: Path) -> None:
    run, it = cpu_run(tmp_path)
    k1 = it / "branches" / "b1" / "kernel.py"
    champion = {"branch": "b1", "index": 1, "kernel": str(k1), "median_ms": 1.0, "passed": True}
    state = loop.close_iteration(run, 1, results=[champion], champion=champion, methods=[], attr={}, sass={},
                                 champion_roofline={}, champion_bench={"median_ms": 1.0})
    assert "iterv1/kernel.py" in state["pinned_sha256"] and state["best_file"] == str(it / "kernel.py")
