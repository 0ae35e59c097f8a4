"""The gates: plain functions over plain data, no pytest (the table, :mod:`pytest_kopt.gates.table`, drives them).

Each gate module holds its parent-side logic; what runs in the harness process is in :mod:`pytest_kopt.child`.
Gates talk through artifacts on disk (build cache, the kernel's artifact folder), so they work across xdist
workers. Heavy imports (numpy, torch, triton) happen inside the functions that need them.
"""
