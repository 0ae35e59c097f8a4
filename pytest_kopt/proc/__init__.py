"""Harness processes: starting them (fresh or warm), pausing them between requests, killing their whole tree.

Plain Python; nothing here imports torch or touches CUDA. :mod:`pytest_kopt.child` is what runs inside them.
"""
