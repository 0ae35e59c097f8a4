"""Kernel kinds: one module per kind of kernel file (CUDA, CUTLASS, Triton, pure Python), each behind the protocol
of :class:`pytest_kopt.kinds.base.Kind`: detect, preflight, plan, build, the harness's launcher, the SASS source.

Every difference between kinds lives here; the gates ask ``ctx.kind`` and compare no kind names. kopt's own kinds
are listed in :mod:`pytest_kopt.kinds.builtin` and registered through the ``pytest_kopt_kinds`` hook
(:mod:`pytest_kopt.plugin.hookspec`), where a plugin or a conftest adds its own. This package's ``__init__``
imports nothing, so :mod:`pytest_kopt.kinds.base` can be imported from anywhere.
"""
