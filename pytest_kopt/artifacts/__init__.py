"""The artifacts gates and the loop write and read: one atomic JSON writer, tolerant readers, typed records.

:mod:`.io` writes every file atomically and reads tolerantly (a missing or corrupt file reads as None). Each record
module owns one document, its file name and its fields, as pyperf's ``Run``/``Benchmark`` own theirs: it reads the
document and is the one place it is built and written (:mod:`.bench` ``bench.json``, :mod:`.ncu` ``ncu_top.json``,
:mod:`.roofline` ``roofline.json``, :mod:`.env` ``env.json``, :mod:`.correctness` ``correctness/<case>.json``).
"""

from __future__ import annotations

from .bench import BENCH, Basis, Bench, FirstAttempt, Head, TimedRun, Timing
from .correctness import CORRECTNESS, EDGES, CorrectnessRecord, write_edges
from .env import ENV, Env
from .io import read_dict, read_json, write_json, write_text
from .ncu import NCU_TOP, NcuTop
from .roofline import ROOFLINE, Achieved, Floor, Roofline

__all__ = ["BENCH", "CORRECTNESS", "EDGES", "ENV", "NCU_TOP", "ROOFLINE", "Achieved", "Basis", "Bench", "CorrectnessRecord",
           "Env", "FirstAttempt", "Floor", "Head", "NcuTop", "Roofline", "TimedRun", "Timing", "read_dict",
           "read_json", "write_edges", "write_json", "write_text"]
