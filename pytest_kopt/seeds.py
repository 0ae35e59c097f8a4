"""Session seeds: one number that replays a session's correctness inputs.

A session seed (drawn from the OS, or given with ``--kopt-seed``) derives the validation seeds; each validation seed
derives its case's second seed (:mod:`pytest_kopt.gates.request`). Plain Python, no torch.
"""

from __future__ import annotations

import hashlib
import os

#: Number of validation seeds derived from a session seed (SKILL.md's default list has five).
SEED_COUNT = 5


def derive_seeds(session_seed: int, count: int) -> tuple[int, ...]:
    """``count`` validation seeds (each < 2**31) derived from one session seed with SHA-256, so one number
    replays a whole session."""
    out = []
    i = 0
    while len(out) < count:
        h = hashlib.sha256(f"kopt:{session_seed}:{i}".encode()).digest()
        s = int.from_bytes(h[:4], "little") & 0x7FFFFFFF
        if s not in out:
            out.append(s)
        i += 1
    return tuple(out)


def fresh_session_seed() -> int:
    """A new session seed drawn from the OS (0 <= seed < 2**32)."""
    return int.from_bytes(os.urandom(4), "little")


__all__ = ["SEED_COUNT", "derive_seeds", "fresh_session_seed"]
