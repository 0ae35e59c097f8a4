"""Several hosts for real, on loopback: an sshd on 127.0.0.1 (throwaway host and user keys), a session whose worker
is an execnet ssh gateway (``--tx ssh=...`` with ``--rsyncdir``), the CPU gates run there and the artifacts land in
the controller's ``--kopt-outdir`` (a filesystem both hosts share). Skipped, with the reason, where no sshd can be
started or the ssh user's python cannot import pytest_kopt."""

from __future__ import annotations

import getpass
import json
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

SSHD = shutil.which("sshd") or ("/usr/sbin/sshd" if Path("/usr/sbin/sshd").exists() else None)
pytestmark = pytest.mark.skipif(SSHD is None or shutil.which("ssh") is None,
                                reason="no sshd/ssh here (.ci/run installs openssh-server)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def loopback_ssh(tmp_path: Path):
    """(ssh option string for execnet, python path) of an sshd on 127.0.0.1 that lets this user in with a key."""
    keys = tmp_path / "keys"
    keys.mkdir()
    for name in ("host", "user"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys / name)], check=True)
    port = free_port()
    config = keys / "sshd_config"
    config.write_text(f"Port {port}\nListenAddress 127.0.0.1\nHostKey {keys / 'host'}\n"
                      f"AuthorizedKeysFile {keys / 'user.pub'}\nPasswordAuthentication no\n"
                      "PermitRootLogin prohibit-password\nStrictModes no\nUsePAM no\n"
                      f"PidFile {keys / 'sshd.pid'}\n")
    Path("/run/sshd").mkdir(exist_ok=True) if Path("/run").is_dir() and getpass.getuser() == "root" else None
    proc = subprocess.Popen([SSHD, "-D", "-f", str(config), "-E", str(keys / "log")])
    opts = (f"-p {port} -i {keys / 'user'} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
            "-o BatchMode=yes")
    target = f"{getpass.getuser()}@127.0.0.1"
    try:
        for _ in range(50):
            probe = subprocess.run(["ssh", *opts.split(), target, f"{sys.executable} -c 'import pytest_kopt'"],
                                   capture_output=True, text=True, timeout=30)
            if probe.returncode == 0:
                break
            time.sleep(0.2)
        else:
            log = (keys / "log").read_text() if (keys / "log").exists() else ""
            pytest.skip(f"ssh to 127.0.0.1 with a throwaway key did not work: {probe.stderr.strip()[-300:]} "
                        f"{log[-300:]}")
        yield f"ssh={opts} {target}//python={sys.executable}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_a_session_over_ssh_runs_its_gates_there_and_keeps_the_artifacts(pytester: pytest.Pytester,
                                                                         loopback_ssh: str) -> None:
    """The worker is an ssh gateway: the CPU gates pass on it (hardware detected there), and the correctness
    record and plan.json land under the controller's --kopt-outdir, where the JSON report's outdir says (before,
    they went to the worker's rsync folder, and the report pointed elsewhere)."""
    work = pytester.path / "proj"
    work.mkdir()
    (work / "k.py").write_text('import torch\ndef setup(n, seed, device="cuda"):\n'
                               '    return {"inputs": {"x": torch.empty(n, device=device)}, "outputs": ["y"]}\n'
                               'def run_kernel(x):\n    return 2 * x\n')
    (work / "ref.py").write_text("def reference(x, **_):\n    return 2 * x\n")
    out = pytester.path / "shared-out"
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-d", "--tx", loopback_ssh, "--rsyncdir", str(work),
        "--kopt-baseline", str(work / "k.py"), "--kopt-ref", str(work / "ref.py"), "--kopt-dims", "n=64",
        "--kopt-seeds", "1", "--kopt-outdir", str(out), "--kopt-json", str(pytester.path / "r.json"), timeout=300)
    doc = json.loads((pytester.path / "r.json").read_text())
    status = {i["nodeid"].split("::")[1]: i["status"] for i in doc["items"]}
    assert status["correctness[seed=1]"] == "PASSED" and status["preflight"] == "PASSED", result.stdout.str()[-2000:]
    assert doc["outdir"] == str(out) and result.ret == 0
    records = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.json"))
    assert "proj/k.py/correctness/seed=1.json" in records and "proj/k.py/plan.json" in records, records
