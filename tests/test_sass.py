"""Tests for pytest_kopt.gates.sass: parsing ``cuobjdump --dump-sass`` text, and dumping a real Triton cubin.

``data/tri.cubin`` is the ``add_k`` vector-add kernel Triton compiled on an H200 (sm_90a, BLOCK=1024, 4 warps).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_kopt.errors import EXIT_HARDWARE, HardwareError
from pytest_kopt.gates.hardware import find_tool
from pytest_kopt.gates.sass import SassFunction, dump_sass, parse_sass, save_sass

CUBIN = Path(__file__).parent / "data" / "tri.cubin"
CUOBJDUMP = find_tool("cuobjdump")
needs_cuobjdump = pytest.mark.skipif(CUOBJDUMP is None,
                                     reason="cuobjdump not found (no CUDA toolkit bin/ and no triton wheel)")

SYNTHETIC = """
Fatbin elf code:
================
arch = sm_80
code version = [1,7]

	code for sm_80
		Function : _Z4copyPKfPfi
	.headerflags	@"EF_CUDA_TEXMODE_UNIFIED EF_CUDA_64BIT_ADDRESS EF_CUDA_SM80 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM80)"
        /*0000*/                   IMAD.MOV.U32 R1, RZ, RZ, c[0x0][0x28] ;       /* 0x00000a00ff017624 */
                                                                                 /* 0x000fe400078e00ff */
        /*0010*/                   S2R R0, SR_TID.X ;                            /* 0x0000000000007919 */
                                                                                 /* 0x000e280000002100 */
        /*0020*/                   ISETP.GE.AND P0, PT, R0, c[0x0][0x170], PT ;  /* 0x00005c0000007a0c */
                                                                                 /* 0x001fda0003f06270 */
        /*0030*/               @P0 EXIT ;                                        /* 0x000000000000094d */
                                                                                 /* 0x000fea0003800000 */
        /*0040*/                   LDG.E R2, [R2.64] ;                           /* 0x0000000402027981 */
                                                                                 /* 0x000ea8000c1e1900 */
        /*0050*/                   STG.E [R4.64], R2 ;                           /* 0x0000000204007986 */
                                                                                 /* 0x004fe2000c101904 */
        /*0060*/                   EXIT ;                                        /* 0x000000000000794d */
                                                                                 /* 0x000fea0003800000 */
        /*0070*/                   BRA 0x70;                                     /* 0xfffffff000007947 */
                                                                                 /* 0x000fc0000383ffff */
		..........


		Function : loop_k
	.headerflags	@"EF_CUDA_TEXMODE_UNIFIED EF_CUDA_64BIT_ADDRESS EF_CUDA_SM80 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM80)"
        /*0000*/                   MOV R1, c[0x0][0x28] ;                        /* 0x00000a0000017a02 */
                                                                                 /* 0x000fc40000000f00 */
        /*0010*/                   FFMA R0, R2, R3, R0 ;                         /* 0x0000000302007223 */
                                                                                 /* 0x000fe20000000000 */
        /*0020*/              @!P0 BRA 0x10 ;                                    /* 0xffffffe000008947 */
                                                                                 /* 0x000fea000383ffff */
        /*0030*/             @!UP0 BRA 0x10 ;                                    /* 0xffffffd000008947 */
                                                                                 /* 0x000fea000383ffff */
        /*0040*/                   FFMA R0, R2, R3, R0 ;                         /* 0x0000000302007223 */
                                                                                 /* 0x000fe20000000000 */
        /*0050*/                   EXIT ;                                        /* 0x000000000000794d */
                                                                                 /* 0x000fea0003800000 */
		..........

"""


# ---- parse_sass on synthetic text ----

def test_parse_two_functions():
    functions = parse_sass(SYNTHETIC)
    assert [f.name for f in functions] == ["_Z4copyPKfPfi", "loop_k"]
    assert [f.arch for f in functions] == ["sm_80", "sm_80"]
    copy, loop = functions
    assert copy.opcodes == {"IMAD.MOV.U32": 1, "S2R": 1, "ISETP.GE.AND": 1, "EXIT": 2, "LDG.E": 1, "STG.E": 1,
                            "BRA": 1}
    assert copy.instructions == 8
    # predicated branches (@!P0, @!UP0) count under the opcode, not the predicate
    assert loop.opcodes == {"MOV": 1, "FFMA": 2, "BRA": 2, "EXIT": 1}
    assert loop.instructions == 6


def test_parse_function_text_is_its_own_section():
    copy, loop = parse_sass(SYNTHETIC)
    assert copy.text.lstrip().startswith("Function : _Z4copyPKfPfi")
    assert "STG.E [R4.64], R2" in copy.text
    assert "FFMA" not in copy.text
    assert loop.text.lstrip().startswith("Function : loop_k")
    assert "@!UP0 BRA 0x10" in loop.text
    assert "LDG" not in loop.text


def test_parse_arch_follows_the_latest_code_for_line():
    dump = ("\tcode for sm_90a\n\t\tFunction : a\n        /*0000*/  EXIT ;\n"
            "\tcode for sm_100a\n\t\tFunction : b\n        /*0000*/  NOP ;\n"
            "\t\tFunction : c\n        /*0000*/  @PT NOP ;\n")
    functions = parse_sass(dump)
    assert [(f.name, f.arch, f.opcodes) for f in functions] == [
        ("a", "sm_90a", {"EXIT": 1}), ("b", "sm_100a", {"NOP": 1}), ("c", "sm_100a", {"NOP": 1})]


def test_parse_hex_encoding_lines_are_not_instructions():
    dump = ("\t\tFunction : k\n"
            "        /*0000*/                   NOP ;   /* 0x0000000000007918 */\n"
            "                                           /* 0x000fc00000000000 */\n")
    (k,) = parse_sass(dump)
    assert k.opcodes == {"NOP": 1}
    assert k.arch == ""


@pytest.mark.parametrize("dump", ["", "\n\n", "Fatbin ptx code:\n================\narch = sm_90a\n"])
def test_parse_empty_dump(dump):
    assert parse_sass(dump) == []


# ---- dump_sass ----

def test_dump_sass_without_cuobjdump_raises():
    with pytest.raises(HardwareError) as info:
        dump_sass(None, [str(CUBIN)])
    err = info.value
    assert err.gate == "sass"
    assert err.exit_code == EXIT_HARDWARE
    assert "cuobjdump not found" in err.message
    assert err.fix


@needs_cuobjdump
def test_dump_sass_of_triton_cubin():
    functions = dump_sass(CUOBJDUMP, [str(CUBIN)])
    assert len(functions) == 1
    (f,) = functions
    assert f.name == "add_k"
    assert f.arch == "sm_90a"
    # 0x0000..0x0370 in 16-byte steps; each load/store moves 4 floats (128-bit), two per thread
    assert f.instructions == 56
    assert f.opcodes["LDG.E.128"] == 4
    assert f.opcodes["STG.E.128"] == 2
    assert f.opcodes["EXIT"] == 2
    assert f.opcodes["FADD"] == 8
    assert f.opcodes["NOP"] == 14
    assert f.opcodes["BRA"] == 1
    assert not any(op.startswith(("LDG.E.64", "LDG.E.32", "HMMA", "LDS", "STS")) for op in f.opcodes)
    assert "@!P0 LDG.E.128 R16, desc[UR4][R20.64]" in f.text


@needs_cuobjdump
def test_dump_sass_two_artifacts_concatenate(tmp_path):
    second = tmp_path / "again.cubin"
    second.write_bytes(CUBIN.read_bytes())
    functions = dump_sass(CUOBJDUMP, [str(CUBIN), str(second)])
    assert [f.name for f in functions] == ["add_k", "add_k"]


@needs_cuobjdump
def test_dump_sass_text_file_raises(tmp_path):
    bogus = tmp_path / "notes.cubin"
    bogus.write_text("this is not an ELF file\n")
    with pytest.raises(HardwareError) as info:
        dump_sass(CUOBJDUMP, [str(bogus)])
    err = info.value
    assert err.gate == "sass"
    assert f"on {bogus}" in err.message
    assert bogus.name in (err.details or "")  # cuobjdump's own complaint, naming the file
    assert err.fix


@needs_cuobjdump
def test_dump_sass_missing_file_raises(tmp_path):
    with pytest.raises(HardwareError, match="cuobjdump failed"):
        dump_sass(CUOBJDUMP, [str(tmp_path / "missing.cubin")])


@needs_cuobjdump
def test_dump_sass_of_nothing_is_no_function():
    """No kernel function in the artifacts is an empty list: the sass gate decides (NOT_APPLICABLE for a solve()
    without kernels of its own, a tool error for a Triton build)."""
    assert dump_sass(CUOBJDUMP, []) == []


def test_dump_sass_tool_path_that_cannot_run_raises(tmp_path):
    tool = tmp_path / "cuobjdump"
    tool.write_text("not executable")
    with pytest.raises(HardwareError) as info:
        dump_sass(str(tool), [str(CUBIN)])
    assert info.value.gate == "sass"
    assert "cuobjdump could not run" in info.value.message
    assert info.value.fix


# ---- save_sass ----

def test_save_sass_one_file_per_function(tmp_path):
    functions = [
        SassFunction(name="_Z4copyPKfPfi", arch="sm_80", text="A\n", opcodes={}),
        SassFunction(name="void gemm<128, 64>(float*)", arch="sm_80", text="B\n", opcodes={}),
        SassFunction(name="ns::k$1", arch="sm_80", text="C\n", opcodes={}),
        SassFunction(name="x" * 200, arch="sm_80", text="D\n", opcodes={}),
    ]
    folder = tmp_path / "run" / "sass"
    paths = save_sass(functions, folder)
    assert paths == [str(folder / "_Z4copyPKfPfi.sass"), str(folder / "void_gemm_128__64__float__.sass"),
                     str(folder / "ns__k_1.sass"), str(folder / ("x" * 150 + ".sass"))]
    assert [Path(p).read_text() for p in paths] == ["A\n", "B\n", "C\n", "D\n"]
    assert sorted(p.name for p in folder.iterdir()) == sorted(Path(p).name for p in paths)


@needs_cuobjdump
def test_save_sass_of_real_dump(tmp_path):
    paths = save_sass(dump_sass(CUOBJDUMP, [str(CUBIN)]), tmp_path)
    assert paths == [str(tmp_path / "add_k.sass")]
    text = Path(paths[0]).read_text()
    assert text.lstrip().startswith("Function : add_k")
    assert text.count("STG.E.128") == 2


def test_a_dump_started_ahead_is_waited_for_not_run_twice(tmp_path: Path) -> None:
    """The build thread dumps the SASS right after nvcc; a sass item that comes while it runs waits for it and
    reads it (before, it ran a second cuobjdump beside the first)."""
    import threading

    from pytest_kopt import scheduler
    from pytest_kopt.gates import sass
    from pytest_kopt.proc.pool import HarnessPool

    art = tmp_path / "kernel.so"
    art.write_bytes(b"lib")
    calls = tmp_path / "calls"
    tool = tmp_path / "cuobjdump"
    tool.write_text(f"#!/bin/sh\necho run >> {calls}\nsleep 0.5\nprintf '\\tcode for sm_90a\\n\\t\\tFunction : k\\n"
                    "        /*0000*/                   STG.E [R2.64], R5 ;\\n'\n")
    tool.chmod(0o755)
    key = scheduler._dump_key(str(tool), str(art))
    owner = scheduler.Scheduler(HarnessPool())
    ahead = threading.Thread(target=owner.prefetch_sass, args=(str(tool), str(art)))
    ahead.start()
    for _ in range(100):  # until the prefetch has registered its dump
        if key in owner._pending or key in owner._dumps:
            break
        threading.Event().wait(0.01)
    functions = sass.dump_sass(str(tool), [str(art)], ahead=owner)
    ahead.join()
    assert [f.name for f in functions] == ["k"] and functions[0].opcodes == {"STG.E": 1}
    assert calls.read_text().count("run") == 1


def _logging_cuobjdump(tmp_path: Path, log: Path) -> Path:
    """A stand-in cuobjdump that logs its start and end (``start <file>``, ``end <file>``) and prints one function
    named after the artifact's stem."""
    tool = tmp_path / "cuobjdump"
    tool.write_text(f"#!/bin/sh\nb=$(basename \"$2\" .cubin)\necho \"start $b\" >> {log}\nsleep 0.5\n"
                    f"echo \"end $b\" >> {log}\nprintf '\\tcode for sm_90a\\n\\t\\tFunction : %s\\n"
                    "        /*0000*/                   STG.E [R2.64], R5 ;\\n' \"$b\"\n")
    tool.chmod(0o755)
    return tool


def test_a_builds_cubins_are_dumped_ahead_side_by_side_and_read_by_the_sass_item(tmp_path: Path) -> None:
    """A Triton build's cubins (made in its harness, which no build thread dumps): the compile item starts one dump
    per cubin in the scheduler's threads, all at once; the sass item reads them without running cuobjdump again."""
    from types import SimpleNamespace

    from pytest_kopt import scheduler
    from pytest_kopt.kinds.builtin import default_kinds
    from pytest_kopt.proc.pool import HarnessPool

    log = tmp_path / "log"
    tool = _logging_cuobjdump(tmp_path, log)
    cubins = []
    for name in ("k_a", "k_b", "k_c"):
        cubins.append(tmp_path / f"{name}.cubin")
        cubins[-1].write_bytes(name.encode())
    res = SimpleNamespace(cubins=[str(c) for c in cubins], artifact=str(tmp_path), autotune={}, pinned=[])
    ctx = SimpleNamespace(tool=lambda name: str(tool), kind=default_kinds().by_name("triton"),
                          collected=frozenset({"compile", "sass"}))
    owner = scheduler.Scheduler(HarnessPool())
    try:
        assert owner.dump_sass_ahead(ctx, res) == 3
        assert owner.dump_sass_ahead(ctx, res) == 0  # made or under way: not started twice
        functions = dump_sass(str(tool), [str(c) for c in cubins], ahead=owner)
    finally:
        owner.shutdown()
    assert [f.name for f in functions] == ["k_a", "k_b", "k_c"]
    lines = log.read_text().split()
    events = [w for w in lines if w in ("start", "end")]
    assert events.count("start") == 3 and events.count("end") == 3  # one cuobjdump per cubin, none again
    assert events[:3] == ["start"] * 3  # side by side (DUMP_THREADS at once): every dump began before any ended


def test_no_dump_ahead_where_this_process_runs_no_sass_item(tmp_path: Path) -> None:
    """A worker that collected the kernel's compile item but not its sass item starts no dump."""
    from types import SimpleNamespace

    from pytest_kopt import scheduler
    from pytest_kopt.kinds.builtin import default_kinds
    from pytest_kopt.proc.pool import HarnessPool

    log = tmp_path / "log"
    tool = _logging_cuobjdump(tmp_path, log)
    cubin = tmp_path / "k.cubin"
    cubin.write_bytes(b"k")
    res = SimpleNamespace(cubins=[str(cubin)], artifact=str(tmp_path), autotune={}, pinned=[])
    ctx = SimpleNamespace(tool=lambda name: str(tool), kind=default_kinds().by_name("triton"),
                          collected=frozenset({"compile", "correctness"}))
    owner = scheduler.Scheduler(HarnessPool())
    try:
        assert owner.dump_sass_ahead(ctx, res) == 0
    finally:
        owner.shutdown()
    assert not log.exists()


def test_a_sass_item_takes_back_a_dump_still_waiting_for_a_thread(tmp_path: Path) -> None:
    """A dump started at the compile item that has not begun (every dump thread busy) is not waited for: the sass
    item takes it back, dumps the artifact itself at once, and the dump does not run again later."""
    import threading
    from types import SimpleNamespace

    from pytest_kopt import scheduler
    from pytest_kopt.kinds.builtin import default_kinds
    from pytest_kopt.proc.pool import HarnessPool

    log = tmp_path / "log"
    tool = _logging_cuobjdump(tmp_path, log)
    cubin = tmp_path / "k_late.cubin"
    cubin.write_bytes(b"k")
    owner = scheduler.Scheduler(HarnessPool())
    release = threading.Event()
    try:
        for _ in range(scheduler.DUMP_THREADS):  # every dump thread busy
            owner._dump_pool().submit(release.wait, 30)
        res = SimpleNamespace(cubins=[str(cubin)], artifact=str(tmp_path), autotune={}, pinned=[])
        ctx = SimpleNamespace(tool=lambda name: str(tool), kind=default_kinds().by_name("triton"),
                              collected=frozenset({"sass"}))
        assert owner.dump_sass_ahead(ctx, res) == 1
        functions = dump_sass(str(tool), [str(cubin)], timeout_s=20.0, ahead=owner)
    finally:
        release.set()
        owner.shutdown()
    assert [f.name for f in functions] == ["k_late"]
    assert log.read_text().split().count("start") == 1  # dumped once, by the item, not again by the thread
