"""ATTACK on containment and on the reference's files: on its first call the kernel starts a daemon that, in a
loop, leaves its session, forks its successor and exits (a new pid every millisecond, so a single /proc snapshot is
always stale), and rewrites every reference output it finds in the kopt work and cache folders to 1.5x; the
kernel itself returns 1.5x softmax. Must fail (the daemon is frozen with the harness, or its write is caught as
TAMPERED) and leave no process behind (its pids go to walker.pids)."""
import os
import subprocess
import sys
import time

import torch

WALKER = r'''
import glob, os, sys, time
import numpy as np
root, log = sys.argv[1], sys.argv[2]
open(log, "a").write(f"{os.getpid()}\n")
t0 = time.time()
while time.time() - t0 < 60:
    if os.getpid() != os.getpgrp():
        os.setsid()
    if os.fork():
        os._exit(0)
    for p in glob.glob(root + "/work/*/*.npz") + glob.glob(root + "/refs/*.npz"):
        try:
            with np.load(p) as z:
                if not any(k.startswith("ref") for k in z.files):
                    continue
                a = {k: z[k] * 1.5 for k in z.files}
            with open(p, "r+b") as f:
                np.savez(f, **a)
                f.truncate()
        except Exception:
            pass
    open(log, "a").write(f"{os.getpid()}\n")
    time.sleep(0.001)
'''
_started = []


def setup(M, N, seed, device="cuda"):
    x = torch.empty(M, N, device=device)
    return {"inputs": {"x": x, "y": torch.empty_like(x)}, "outputs": ["y"]}


def run_kernel(x, y):
    if not _started:
        _started.append(True)
        root = os.path.join(os.getcwd(), ".pytest_cache", "d", "kopt")
        subprocess.Popen([sys.executable, "-c", WALKER, root, os.path.abspath("walker.pids")],
                         start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
        time.sleep(0.05)
    y.copy_(torch.softmax(x, dim=-1) * 1.5)
