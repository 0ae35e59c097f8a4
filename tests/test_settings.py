"""Tests for pytest_kopt.settings: the dims, seeds and arch parsers and build_settings' validation."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import pytest

from pytest_kopt import settings
from pytest_kopt.errors import EXIT_CONFIG, ConfigError
from pytest_kopt.gates.shapes import listed_shapes
from pytest_kopt.settings import (
    DEFAULT_GATE_TIMEOUT_S,
    DEFAULT_NCU_TIMEOUT_S,
    DEFAULT_SEEDS,
    Settings,
    parse_arch,
    parse_dims,
    parse_seeds,
)

#: as the plugin calls it: the reference's own shapes read with the gates' reader
build_settings = functools.partial(settings.build_settings, listed=listed_shapes)


def _config_error(option: str, func, *args) -> ConfigError:
    """Call ``func(*args)``, expect a ConfigError that names ``option`` and carries a fix, and return it."""
    with pytest.raises(ConfigError) as info:
        func(*args)
    err = info.value
    assert option in err.message, err.message
    assert err.fix and err.fix.strip(), "every ConfigError needs a fix"
    assert err.exit_code == EXIT_CONFIG
    return err


# ---- parse_dims ----

def test_dims_key_value_ints():
    dims = parse_dims("M=4096,N=4096,K=4096")
    assert dims == {"M": 4096, "N": 4096, "K": 4096}
    assert all(type(v) is int for v in dims.values())
    assert list(dims) == ["M", "N", "K"]


def test_dims_json_object():
    dims = parse_dims('{"M": 1024, "N": 512, "eps": 1e-5}')
    assert dims == {"M": 1024, "N": 512, "eps": 1e-5}
    assert type(dims["M"]) is int
    assert type(dims["eps"]) is float


def test_dims_json_string_values_are_parsed_as_numbers():
    assert parse_dims('{"M": "0x100", "eps": "2.5"}') == {"M": 256, "eps": 2.5}


@pytest.mark.parametrize("text, value, kind", [
    ("eps=1e-5", 1e-5, float),
    ("eps=0.5", 0.5, float),
    ("eps=-2.25", -2.25, float),
    ("eps=3.", 3.0, float),
    ("eps=1E3", 1000.0, float),
    ("eps=0x10", 16, int),
    ("eps=0XfF", 255, int),
    ("eps=0b101", 5, int),
    ("eps=-7", -7, int),
    ("eps=1_000", 1000, int),
])
def test_dims_number_forms(text, value, kind):
    dims = parse_dims(text)
    assert dims == {"eps": value}
    assert type(dims["eps"]) is kind


def test_dims_whitespace_is_ignored():
    assert parse_dims("  M = 4096 ,\tN=8 , ,K =  2  ") == {"M": 4096, "N": 8, "K": 2}


@pytest.mark.parametrize("text", ["", "   ", ",", " , , "])
def test_dims_empty_text_gives_no_dims(text):
    assert parse_dims(text) == {}


def test_dims_duplicate_key_value():
    err = _config_error("--kopt-dims", parse_dims, "M=1, N=2, M =3")
    assert "'M' given twice" in err.message


def test_dims_duplicate_in_json():
    err = _config_error("--kopt-dims", parse_dims, '{"M": 1, "M": 2}')
    assert "'M' given twice" in err.message


def test_dims_missing_equals():
    err = _config_error("--kopt-dims", parse_dims, "M=4096,N")
    assert "'N' has no '='" in err.message


@pytest.mark.parametrize("text, shown", [
    ("1M=4", "'1M'"),
    ("M-N=4", "'M-N'"),
    ("=4", "''"),
    ("a.b=1", "'a.b'"),
])
def test_dims_bad_names(text, shown):
    err = _config_error("--kopt-dims", parse_dims, text)
    assert f"{shown} is not a valid dim name" in err.message


def test_dims_bad_name_in_json():
    err = _config_error("--kopt-dims", parse_dims, '{"2x": 4}')
    assert "'2x' is not a valid dim name" in err.message


@pytest.mark.parametrize("text, shown", [
    ("M=abc", "'abc'"),
    ("M=", "''"),
    ("M=4096x", "'4096x'"),
])
def test_dims_non_numeric(text, shown):
    err = _config_error("--kopt-dims", parse_dims, text)
    assert f"--kopt-dims: dim M: {shown} is not a number" == err.message


@pytest.mark.parametrize("text", ['{"M": true}', '{"M": false}'])
def test_dims_json_bool_is_rejected(text):
    err = _config_error("--kopt-dims", parse_dims, text)
    assert "is not a number" in err.message


@pytest.mark.parametrize("text", ['{"M": null}', '{"M": {"a": 1}}', '{"M": [1, "a"]}'])
def test_dims_json_non_number_values(text):
    err = _config_error("--kopt-dims", parse_dims, text)
    assert "dim M:" in err.message


def test_dims_bad_json():
    err = _config_error("--kopt-dims", parse_dims, '{"M": 4096,')
    assert "not valid JSON" in err.message


def test_dims_json_array_is_not_json_form():
    # Only text starting with "{" is read as JSON; an array falls through to NAME=VALUE parsing and fails there
    err = _config_error("--kopt-dims", parse_dims, "[1, 2]")
    assert "'[1' has no '='" in err.message


def test_dims_source_is_named_in_errors():
    err = _config_error("kopt_dims (ini)", parse_dims, "M=x", "kopt_dims (ini)")
    assert err.message.startswith("kopt_dims (ini): ")


# ---- parse_seeds ----

def test_seeds_basic():
    assert parse_seeds("7,19,41") == (7, 19, 41)


def test_seeds_whitespace_and_empty_parts():
    assert parse_seeds(" 3 , 0,, 5 ,") == (3, 0, 5)


def test_seeds_keep_order():
    assert parse_seeds("9,1,5") == (9, 1, 5)


def test_seeds_upper_bound():
    assert parse_seeds(str(2**63 - 1)) == (2**63 - 1,)
    err = _config_error("--kopt-seeds", parse_seeds, str(2**63))
    assert "out of range" in err.message


@pytest.mark.parametrize("text, fragment", [
    ("", "no seed given"),
    (" , ", "no seed given"),
    ("-1", "seed -1 is out of range"),
    ("7,x", "'x' is not an integer seed"),
    ("1.5", "'1.5' is not an integer seed"),
    ("7,19,7", "seed 7 given twice"),
])
def test_seeds_errors(text, fragment):
    err = _config_error("--kopt-seeds", parse_seeds, text)
    assert fragment in err.message


# ---- parse_arch ----

@pytest.mark.parametrize("text, arch", [
    ("sm_90a", "sm_90a"),
    ("90a", "sm_90a"),
    ("sm_80", "sm_80"),
    ("80", "sm_80"),
    ("SM_90A", "sm_90a"),
    (" sm_100a ", "sm_100a"),
    ("120f", "sm_120f"),
])
def test_arch_valid(text, arch):
    assert parse_arch(text) == arch


@pytest.mark.parametrize("text", ["", "sm_9", "9", "sm_90b", "compute_90a", "sm90a", "sm_1000", "a", "hopper",
                                  "sm_90aa"])
def test_arch_invalid(text):
    err = _config_error("--kopt-arch", parse_arch, text)
    assert f"{text!r} is not an arch" in err.message


# ---- build_settings ----

def _files(tmp_path: Path) -> tuple[Path, Path]:
    kernel = tmp_path / "k.cu"
    kernel.write_text('extern "C" void solve(const float* x, float* y, int n) {}\n')
    ref = tmp_path / "ref.py"
    ref.write_text("def reference(**kw):\n    pass\n")
    return kernel, ref


def _getter(**values):
    return lambda name: values.get(name)


def test_build_settings_without_baseline_is_inactive(tmp_path):
    s = build_settings(_getter(), tmp_path)
    assert s == Settings()
    assert s.active is False


def test_build_settings_ignores_empty_strings(tmp_path):
    s = build_settings(_getter(baseline="", ref="", dims=""), tmp_path)
    assert s.active is False


@pytest.mark.parametrize("values", [{"ref": "ref.py"}, {"dims": "M=4"}])
def test_build_settings_ref_or_dims_without_baseline(tmp_path, values):
    _files(tmp_path)
    err = _config_error("--kopt-baseline", build_settings, _getter(**values), tmp_path)
    assert "--kopt-ref/--kopt-dims given without --kopt-baseline" == err.message


def test_build_settings_missing_ref(tmp_path):
    _files(tmp_path)
    err = _config_error("--kopt-ref", build_settings, _getter(baseline="k.cu"), tmp_path)
    assert err.message == "--kopt-ref is missing"


def test_build_settings_nonexistent_baseline_names_option_and_folder(tmp_path):
    _files(tmp_path)
    err = _config_error("--kopt-baseline", build_settings, _getter(baseline="nope.cu", ref="ref.py"), tmp_path)
    assert "'nope.cu' does not exist" in err.message
    assert f"(looked in {tmp_path})" in err.message


def test_build_settings_nonexistent_ref_names_option_and_folder(tmp_path):
    _files(tmp_path)
    err = _config_error("--kopt-ref", build_settings, _getter(baseline="k.cu", ref="sub/r.py"), tmp_path)
    assert "'sub/r.py' does not exist" in err.message
    assert str(tmp_path) in err.message


def test_build_settings_directory_is_not_a_file(tmp_path):
    _files(tmp_path)
    (tmp_path / "d.cu").mkdir()
    err = _config_error("--kopt-baseline", build_settings, _getter(baseline="d.cu", ref="ref.py"), tmp_path)
    assert "is a folder, not a file" in err.message


def test_build_settings_wrong_baseline_suffix(tmp_path):
    _files(tmp_path)
    (tmp_path / "k.cpp").write_text("")
    err = _config_error("--kopt-baseline", build_settings, _getter(baseline="k.cpp", ref="ref.py"), tmp_path)
    assert "must end in .cu or .py" in err.message


def test_build_settings_wrong_ref_suffix(tmp_path):
    _files(tmp_path)
    err = _config_error("--kopt-ref", build_settings, _getter(baseline="k.cu", ref="k.cu"), tmp_path)
    assert "'k.cu' must end in .py" in err.message


def test_build_settings_defaults_and_relative_paths(tmp_path):
    kernel, ref = _files(tmp_path)
    s = build_settings(_getter(baseline="k.cu", ref="./ref.py", dims="n=1024"), tmp_path)
    assert s.active is True
    assert s.baseline == kernel.resolve()
    assert s.ref == ref.resolve()
    assert s.baseline.is_absolute() and s.ref.is_absolute()
    assert s.dims == {"n": 1024}
    assert s.seeds == (7, 19, 41, 73, 101) == DEFAULT_SEEDS
    assert s.gate_timeout_s == DEFAULT_GATE_TIMEOUT_S == 60.0
    assert s.ncu_timeout_s == DEFAULT_NCU_TIMEOUT_S == 300.0
    assert s.atol is None and s.rtol is None and s.arch is None and s.json_path is None
    assert s.outdir == (tmp_path / ".kopt").resolve()


def test_build_settings_relative_paths_use_base_not_cwd(tmp_path, monkeypatch):
    base = tmp_path / "proj"
    base.mkdir()
    kernel, ref = _files(base)
    monkeypatch.chdir(tmp_path)
    s = build_settings(_getter(baseline="k.cu", ref="ref.py", outdir="out", json="r.json"), base)
    assert s.baseline == kernel.resolve()
    assert s.ref == ref.resolve()
    assert s.outdir == (base / "out").resolve()
    assert s.json_path == str(base / "r.json")


def test_build_settings_absolute_paths_and_stdout_json(tmp_path):
    kernel, ref = _files(tmp_path)
    other = tmp_path / "elsewhere"
    other.mkdir()
    s = build_settings(_getter(baseline=str(kernel), ref=str(ref), json="-", outdir=str(tmp_path / "o")), other)
    assert s.baseline == kernel.resolve()
    assert s.json_path == "-"
    assert s.outdir == (tmp_path / "o").resolve()


def test_build_settings_all_values(tmp_path):
    _files(tmp_path)
    s = build_settings(_getter(baseline="k.cu", ref="ref.py", dims='{"n": 8, "eps": 1e-6}', seeds="1,2",
                               atol="1e-3", rtol="0", arch="90a", timeout="12.5", ncu_timeout="30"), tmp_path)
    assert s.dims == {"n": 8, "eps": 1e-6}
    assert s.seeds == (1, 2)
    assert s.atol == 1e-3
    assert s.rtol == 0.0
    assert s.arch == "sm_90a"
    assert s.gate_timeout_s == 12.5
    assert s.ncu_timeout_s == 30.0


def test_settings_is_frozen(tmp_path):
    s = Settings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.seeds = (1,)  # type: ignore[misc]


@pytest.mark.parametrize("key, value, option, fragment", [
    ("dims", "n=x", "--kopt-dims", "is not a number"),
    ("seeds", "1,1", "--kopt-seeds", "given twice"),
    ("atol", "abc", "--kopt-atol", "'abc' is not a number"),
    ("atol", "-1", "--kopt-atol", "'-1' must be >= 0"),
    ("rtol", "nan", "--kopt-rtol", "'nan' must be >= 0"),
    ("arch", "sm_9", "--kopt-arch", "is not an arch"),
    ("timeout", "0", "--kopt-timeout", "'0' must be > 0"),
    ("timeout", "-5", "--kopt-timeout", "must be > 0"),
    ("ncu_timeout", "0", "--kopt-ncu-timeout", "'0' must be > 0"),
    ("ncu_timeout", "soon", "--kopt-ncu-timeout", "is not a number"),
    ("timing", "kineto", "--kopt-timing", "unknown method 'kineto'"),
    ("rotating_memory", "0", "--kopt-rotating-memory", "'0' must be > 0"),
    ("rotating_memory", "0.95", "--kopt-rotating-memory", "more than 0.9"),
])
def test_build_settings_bad_values_name_the_option(tmp_path, key, value, option, fragment):
    _files(tmp_path)
    err = _config_error(option, build_settings, _getter(baseline="k.cu", ref="ref.py", **{key: value}), tmp_path)
    assert fragment in err.message


def test_timing_options_reach_settings(tmp_path):
    """--kopt-timing, --kopt-rotating-memory and --kopt-fresh-process with their defaults."""
    _files(tmp_path)
    plain = build_settings(_getter(baseline="k.cu", ref="ref.py"), tmp_path)
    assert (plain.timing_method, plain.rotating_memory, plain.fresh_process) == ("cupti", 0.25, False)
    s = build_settings(_getter(baseline="k.cu", ref="ref.py", timing="graph", rotating_memory="0.5",
                               fresh_process=True), tmp_path)
    assert (s.timing_method, s.rotating_memory, s.fresh_process) == ("graph", 0.5, True)


def test_pr_gate_needs_a_threshold_and_a_candidate(tmp_path):
    """pr_gate (the baseline timed in each candidate's rounds) is on only with --kopt-fail-slower and a candidate."""
    _files(tmp_path)
    (tmp_path / "k2.cu").write_text((tmp_path / "k.cu").read_text())
    assert build_settings(_getter(baseline="k.cu", ref="ref.py", fail_slower="3"), tmp_path).pr_gate is False
    both = build_settings(_getter(baseline="k.cu", ref="ref.py", fail_slower="3", candidate=["k2.cu"]), tmp_path)
    assert both.pr_gate is True
    assert build_settings(_getter(baseline="k.cu", ref="ref.py", candidate=["k2.cu"]), tmp_path).pr_gate is False


def test_a_path_with_a_control_character_is_refused_naming_it(tmp_path):
    """A newline in a folder's name passed every check until state.json's path patterns refused it, as an
    internal error ("report this as a pytest-kopt bug"); it is a configuration error naming the option."""
    odd = tmp_path / "new\nline"
    odd.mkdir()
    _files(odd)
    err = _config_error("--kopt-baseline", build_settings, _getter(baseline="k.cu", ref="ref.py"), odd)
    assert "has a control character ('\\n')" in err.message and "new\\nline" in err.message


def test_build_settings_takes_the_references_shapes_without_dims(tmp_path):
    """Without --kopt-dims the shapes are those ref.py lists (through the reader the plugin hands in: the settings
    import nothing of the gates), its first the session's dims; --kopt-dims replaces them."""
    kernel, ref = _files(tmp_path)
    ref.write_text('dims = [{"M": 64, "N": 8}, {"M": 128, "N": 8}, {"M": 64, "N": 8}]\n'
                   "def reference(**kw):\n    pass\n")
    s = build_settings(_getter(baseline="k.cu", ref="ref.py"), tmp_path)
    assert s.shapes == ({"M": 64, "N": 8}, {"M": 128, "N": 8}) and s.dims == {"M": 64, "N": 8}
    s = build_settings(_getter(baseline="k.cu", ref="ref.py", dims="M=32,N=4"), tmp_path)
    assert s.shapes == ({"M": 32, "N": 4},) and s.dims == {"M": 32, "N": 4}
    seen = []
    s = settings.build_settings(_getter(baseline="k.cu", ref="ref.py"), tmp_path,
                                listed=lambda path: seen.append(path) or ([{"K": 3}], False))
    assert seen == [ref] and s.dims == {"K": 3}


@pytest.mark.parametrize("text", ["M=99999999999999999999x2", "M=" + "1" * 5000 + "x2", '{"M": ' + "1" * 5000 + "}",
                                  "M=9223372036854775808", '{"M": [2, 9223372036854775808]}'])
def test_a_dim_beyond_64_bits_is_refused_naming_it(text):
    """A size no launcher can pass (before: accepted in a tuple, or ValueError past Python's digit limit)."""
    err = _config_error("--kopt-dims", parse_dims, text)
    assert err.fix == "give a size below 2**63"
    assert parse_dims("M=9223372036854775807x2") == {"M": [9223372036854775807, 2]}
