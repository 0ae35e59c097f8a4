"""What runs in a harness process: the candidate, the reference and the judge, timing and profiling.

The pytest process never imports torch or touches CUDA: a gate writes a request, runs it in a child process (so a
crash, a trap or a hang of the kernel takes down only that child) and reads back the result. Nothing in this
package imports :mod:`pytest_kopt.gates` or :mod:`pytest_kopt.plugin`.

The contract, in one place:

- Start: ``python -P -s -c <boot> '[extra sys.path]' REQUEST.json [--ctl FD]`` runs one request (a fresh
  process), ``... --serve FD`` a warm process that reads ``<seq> <request path>`` lines on stdin
  (:func:`pytest_kopt.child.protocol.serve`). ``FD`` is a private pipe: ``ready`` once torch is imported, then
  ``done <seq> <code> <sha256 of the result JSON>`` per request; the kernel's own output goes to the log, so it
  cannot fake an answer. ``... --fork-server FD`` is the fork server (:mod:`pytest_kopt.child.forkserver`): it
  imports torch once and forks warm processes that then run as ``--serve`` would.
- Request (JSON): ``mode`` (a key of :data:`pytest_kopt.child.protocol.MODES`), ``out`` (path prefix of the
  results), ``kind`` (the kernel kind's name, for messages), ``launcher`` (``solve``: a built library's ``solve``
  through ctypes; ``module``: a Python file's ``setup``/``run_kernel``), ``autotune`` (install the autotune policy
  before importing it: a Triton file), ``kernel``, ``library`` (the built ``.so``),
  ``params`` (``solve``'s parameters: name, dtype, role), ``ref``, ``dims``, ``seed``/``seed_b``, ``device``,
  ``plan`` (the input plan, :func:`pytest_kopt.gates.inputs.draw_plan`), ``atol``/``rtol`` (overrides or None),
  ``timing`` (the timing policy), and per mode ``spec``/``scalars`` (the candidate's buffers, for the
  reference), ``round`` (one round of an interleaved timing: ``key``, ``count``, ``final``, or ``warm``: the kernel's
  load and first call ahead of the first round), ``setup_npz``, and for the judge ``cand`` (what
  the candidate's process kept: IPC descriptors or an ``.npz``), ``poisons`` and ``ref_key``.
- Result: ``<out>.json`` with ``ok`` true and the mode's figures, or ``ok`` false with ``category``
  (``contract``, ``compile``, ``runtime``, ``needs_gpu``, or ``interpreter_gap``: Triton's interpreter cannot run
  what the kernel calls, :mod:`pytest_kopt.child.interpreter`), ``message``, ``fix`` (or None) and ``traceback``. A candidate's
  arrays, keyed ``<tag>__<buffer>`` (see :mod:`pytest_kopt.child.verdict`), stay on the GPU and are described in
  the result (``arrays``: :mod:`pytest_kopt.child.share`), or go to ``<out>.npz`` on the CPU; the judge, in the
  reference's process, reads them and answers with the verdict's figures only. The arrays a process exported
  live until its next request.
- After a failed request a warm process ends: a CUDA error can leave its context unusable.
"""

from __future__ import annotations


class HarnessError(Exception):
    """An error with a category the parent maps to a status: ``contract`` (ref/setup/shapes), ``compile``,
    ``runtime``, or ``changed`` (a file pinned at the session's start is not what it was); ``fix`` (optional) is the
    one sentence the parent shows as the fix; ``path`` and ``line`` (optional) the user's file and line to change,
    where no frame of the traceback is theirs (a shape kopt found wrong)."""

    def __init__(self, category: str, message: str, fix: str | None = None, path: str | None = None,
                 line: int | None = None) -> None:
        super().__init__(message)
        self.category = category
        self.fix = fix
        self.path = path
        self.line = line
