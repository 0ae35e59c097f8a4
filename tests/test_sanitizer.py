"""compute-sanitizer log parsing (the GPU run of the gate is tests/test_redteam.py::test_sanitizer_gate_gpu)."""

from __future__ import annotations

from pytest_kopt.gates.sanitizer import sanitizer_summary

MEMCHECK_BAD = """\
========= COMPUTE-SANITIZER
========= Invalid __global__ read of size 4 bytes
=========     at k(const float *, float *, int)+0x70 in oob.cu:4
=========     by thread (231,0,0) in block (3,0,0)
=========     Address 0x7f3a8e200fa0 is out of bounds
=========
========= ERROR SUMMARY: 1 error
"""
RACECHECK_BAD = """\
========= COMPUTE-SANITIZER
========= Error: Race reported between Write access at k(const float *, float *, int)+0x90 in racy.cu:7
=========     and Read access at k(const float *, float *, int)+0xb0 in racy.cu:9 [1024 hazards]
=========
========= RACECHECK SUMMARY: 3 hazards displayed (2 errors, 1 warning)
"""


def test_memcheck_summary_counts_errors() -> None:
    assert sanitizer_summary(MEMCHECK_BAD) == {"errors": 1, "warnings": 0}
    assert sanitizer_summary("========= ERROR SUMMARY: 0 errors\n") == {"errors": 0, "warnings": 0}


def test_racecheck_summary_counts_errors_not_warnings() -> None:
    assert sanitizer_summary(RACECHECK_BAD) == {"errors": 2, "warnings": 1}
    clean = "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n"
    assert sanitizer_summary(clean) == {"errors": 0, "warnings": 0}


def test_summaries_of_several_processes_add_up() -> None:
    """--target-processes all: one summary per process the tool followed."""
    assert sanitizer_summary(MEMCHECK_BAD + "========= ERROR SUMMARY: 2 errors\n") == {"errors": 3, "warnings": 0}


def test_no_summary_is_none() -> None:
    """A tool that died before its summary is not a clean run."""
    assert sanitizer_summary("========= COMPUTE-SANITIZER\nSegmentation fault\n") is None
    assert sanitizer_summary("") is None
