"""The defaults of pytest-kopt's options and of the loop, defined once (SKILL.md's inputs and thresholds).

Settings, the option help texts and the loop read these names; this module imports nothing from the package, so
any module may import it.
"""

from __future__ import annotations

#: SKILL.md: improvement and attribution are judged against a 2% noise threshold.
NOISE_PCT = 2.0
#: SKILL.md: the iteration count N is a maximum, 3 by default.
ITERATIONS = 3
#: SKILL.md: K branch kernels per iteration, 4 by default.
BRANCHES = 4
#: SKILL.md: the top ncu metrics kept per axis (``ncu_num``), 5 by default.
NCU_NUM = 5
#: SKILL.md's ``--numerics-mode``: ``reference`` keeps the reference's atol/rtol contract.
NUMERICS_MODE = "reference"
NUMERICS_MODES = ("reference", "strict", "approximate")
#: The target arch when no GPU is visible: the H200/H100 target with the arch-specific features (wgmma,
#: setmaxnreg).
ARCH = "sm_90a"
#: SKILL.md's default validation seeds (five).
SEEDS = (7, 19, 41, 73, 101)
#: xdist workers of the ``--kopt-run`` command the loop hands the agent (``next.command``): a close judges the
#: branches side by side, one GPU lock between them.
CLOSE_WORKERS = 4
#: SKILL.md's ``--compile-jobs``: ``auto`` caps nvcc builds at half the CPUs and :data:`COMPILE_JOBS_MAX`, within the
#: available memory less :data:`COMPILE_MEMORY_KEPT_GIB`, at :data:`COMPILE_GIB_CUDA` a CUDA build and
#: :data:`COMPILE_GIB_CUTLASS` a CUTLASS one (SKILL.md's compilation policy).
COMPILE_JOBS = "auto"
COMPILE_JOBS_MAX = 4
COMPILE_GIB_CUDA = 2.0
COMPILE_GIB_CUTLASS = 4.0
COMPILE_MEMORY_KEPT_GIB = 2.0
