"""The fork server (pytest_kopt.proc.forkserver, pytest_kopt.child.forkserver): warm harness processes forked from
one process that imported torch once, each still a process of its own kernel; and every way back to an ordinary
start."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_kopt.child.forkserver import refused
from pytest_kopt.errors import KernelRuntimeError
from pytest_kopt.proc import forkserver
from pytest_kopt.proc.forkserver import ForkedProcess, ForkServer
from pytest_kopt.proc.pool import HarnessPool

pytestmark = pytest.mark.skipif(not forkserver.supported(), reason="the fork server needs Linux with pidfd_open")


def ready(pool: HarnessPool, identity: str, tmp_path: Path, env: dict[str, str] | None = None) -> dict:
    return pool.run({"mode": "ready", "env": env or {}}, gate="plan", timeout_s=120, path="k.cu",
                    workdir=tmp_path, server=identity)


def srv_of(pool: HarnessPool, identity: str):
    return next(s for k, s in pool.live.items() if k[0] == identity)


def test_a_forked_process_serves_and_holds_only_its_own_descriptors(tmp_path: Path) -> None:
    """Each identity gets its own process, forked by the pool's server, leading its own process group, holding
    only stdin, its log and its control pipe (never the server's socket: a kernel cannot ask it for processes),
    named by its role; its start-up stamps count from its fork."""
    pool = HarnessPool()
    try:
        pool.prestart("check:/k.cu", {}, tmp_path)
        pool.prestart("candidate:/k.cu", {}, tmp_path)
        result = ready(pool, "check:/k.cu", tmp_path)
        ready(pool, "candidate:/k.cu", tmp_path)
        assert pool.forks is not None
        check, cand = srv_of(pool, "check:/k.cu").proc, srv_of(pool, "candidate:/k.cu").proc
        server = pool.forks.proc.pid
        try:
            server_fds = {f: os.readlink(f"/proc/{server}/fd/{f}") for f in os.listdir(f"/proc/{server}/fd")}
        except PermissionError:  # not dumpable, and this process lacks CAP_SYS_PTRACE: its files are root's
            assert os.stat(f"/proc/{server}/status").st_uid == 0 != os.getuid()
            server_fds = {}
        else:
            server_fds = {f: link for f, link in server_fds.items() if link.startswith("socket:")}
            assert server_fds  # the socket it takes requests on
        assert isinstance(check, ForkedProcess) and check.forked and cand.forked and check.pid != cand.pid
        for proc in (check, cand):
            stat = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            assert int(stat[1]) == server  # its parent: the server
            assert os.stat(f"/proc/{proc.pid}/status").st_uid == os.getuid()  # dumpable again, as a new Python is
            assert os.getpgid(proc.pid) == proc.pid and os.getsid(proc.pid) == proc.pid
            links = {int(f): os.readlink(f"/proc/{proc.pid}/fd/{f}") for f in os.listdir(f"/proc/{proc.pid}/fd")}
            assert {0, 1, 2, 3} <= set(links) and links[3].startswith("pipe:")
            assert links[1] == links[2] and links[1].endswith(".log")
            # a GPU's device files come with its CUDA context (made while idle); nothing of the server's, no socket
            assert not set(links.values()) & set(server_fds.values())
            assert not any(link.startswith("socket:") for link in links.values())
            if not Path("/dev/nvidiactl").exists():
                assert sorted(links) == [0, 1, 2, 3]
        assert Path(f"/proc/{check.pid}/comm").read_text().strip() == "kopt-harness"
        assert Path(f"/proc/{cand.pid}/comm").read_text().strip() == "kopt-timing"
        assert "--no-profiler" in check.args and "--no-profiler" not in cand.args
        assert 0 <= result["harness_s"]["imported"] < 5.0  # torch came with the fork
    finally:
        pool.shutdown()
    assert pool.forks is None
    assert check.returncode == 0 and cand.returncode == 0  # ended at its stdin's end, reaped through the server


def test_how_a_forked_process_ended_reaches_the_errors(tmp_path: Path) -> None:
    """A process killed while paused between requests is TAMPERED naming the signal (the exit code comes back
    through the server); a failed request ends its process with exit code 1, and the next request starts another."""
    pool = HarnessPool()
    try:
        ready(pool, "candidate:/k.cu", tmp_path)
        first = srv_of(pool, "candidate:/k.cu").proc
        os.kill(first.pid, signal.SIGCONT)
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=10)
        assert first.returncode == -signal.SIGKILL
        with pytest.raises(KernelRuntimeError, match="ended between requests \\(killed by signal 9\\)") as e:
            ready(pool, "candidate:/k.cu", tmp_path)
        assert e.value.status == "TAMPERED"
        with pytest.raises(KernelRuntimeError, match="no_such_mode"):
            pool.run({"mode": "no_such_mode"}, gate="plan", timeout_s=60, path="k.cu", workdir=tmp_path,
                     server="judge:/r.py")
        assert not any(k[0] == "judge:/r.py" for k in pool.live)
        assert ready(pool, "judge:/r.py", tmp_path)["ok"]
        assert srv_of(pool, "judge:/r.py").proc.forked
    finally:
        pool.shutdown()


def test_an_environment_read_at_import_gets_a_process_of_its_own(tmp_path: Path) -> None:
    """A variable torch or numpy may read at import (OMP_NUM_THREADS) cannot be set after a fork: that process is
    a new Python; CUDA's, Triton's and kopt's are set in the forked child."""
    assert refused({"A": "1", "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": "1"}, {"A": "1"}) == []
    assert refused({"OMP_NUM_THREADS": "1"}, {}) == ["OMP_NUM_THREADS"]
    assert refused({}, {"LD_PRELOAD": "x.so"}) == ["LD_PRELOAD"]
    assert refused({"TRITON_INTERPRET": "1"}, {}, after=("CUDA_",)) == ["TRITON_INTERPRET"]
    pool = HarnessPool()
    try:
        ready(pool, "judge:/r.py", tmp_path, env={"OMP_NUM_THREADS": "1"})
        ready(pool, "check:/k.py", tmp_path, env={"TRITON_INTERPRET": "1"})
        assert isinstance(srv_of(pool, "judge:/r.py").proc, subprocess.Popen)
        assert srv_of(pool, "check:/k.py").proc.forked
    finally:
        pool.shutdown()


def test_processes_started_during_an_item_are_forked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pytest sets PYTEST_CURRENT_TEST to each item's id in turn: a server started during one item still forks the
    processes started during the next (the harness's environment leaves the variable out)."""
    from pytest_kopt.proc.runner import child_env

    monkeypatch.setenv("PYTEST_CURRENT_TEST", "test_a.py::first (call)")
    assert "PYTEST_CURRENT_TEST" not in child_env({})
    pool = HarnessPool()
    try:
        ready(pool, "check:/k.cu", tmp_path)
        monkeypatch.setenv("PYTEST_CURRENT_TEST", "test_a.py::second (call)")
        ready(pool, "candidate:/k.cu", tmp_path)
        assert pool.forks is not None and refused(child_env({}), pool.forks.env) == []
        assert srv_of(pool, "check:/k.cu").proc.forked and srv_of(pool, "candidate:/k.cu").proc.forked
    finally:
        pool.shutdown()


def test_without_a_server_processes_start_the_ordinary_way(tmp_path: Path) -> None:
    """A server that died: a spawn it had not answered, and every later one, start as a new Python with the same
    descriptors, and serve. ``fork_server=False`` (``--kopt-no-fork-server``) never starts one."""
    server = ForkServer(tmp_path)
    r, w = os.pipe()
    log = os.open(tmp_path / "x.log", os.O_WRONLY | os.O_CREAT)
    ctl_r, ctl_w = os.pipe()
    proc = server.spawn(lambda ctl: ["--serve", str(ctl), "--no-profiler"], {}, r, log, ctl_w)
    for fd in (r, log, ctl_w):
        os.close(fd)
    server.proc.kill()  # still importing torch: the spawn is not answered
    try:
        assert isinstance(proc, ForkedProcess) and not proc.forked
        assert isinstance(proc.popen, subprocess.Popen)
        with os.fdopen(ctl_r, "rb") as ctl:
            assert ctl.readline() == b"ready\n"
        os.close(w)
        assert proc.wait(timeout=60) == 0
    finally:
        server.close()
    pool = HarnessPool()
    try:
        ready(pool, "judge:/r.py", tmp_path)
        assert pool.forks is not None
        pool.forks.proc.kill()
        pool.forks.proc.wait()
        ready(pool, "reference:/r.py", tmp_path)
        assert isinstance(srv_of(pool, "reference:/r.py").proc, subprocess.Popen)
        # the judge's process died with the server (PR_SET_PDEATHSIG): said so, never restarted quietly
        with pytest.raises(KernelRuntimeError, match="killed by signal 9; the fork server it came from ended first"):
            ready(pool, "judge:/r.py", tmp_path)
    finally:
        pool.shutdown()
    pool = HarnessPool(fork_server=False)
    try:
        ready(pool, "judge:/r.py", tmp_path)
        assert pool.forks is None and isinstance(srv_of(pool, "judge:/r.py").proc, subprocess.Popen)
    finally:
        pool.shutdown()


def test_a_process_that_dies_with_its_server_during_a_request_names_the_server(tmp_path: Path) -> None:
    """Another kernel kills the fork server while this kernel's request runs: the request's error says the server
    ended first and how to find who killed it, not only that this process died."""
    pool = HarnessPool()
    try:
        ready(pool, "check:/k.py", tmp_path)
        srv = srv_of(pool, "check:/k.py")
        assert srv.proc.forked

        def killed_meanwhile(name: str, timeout_s: float) -> tuple[str, str]:
            assert pool.forks is not None
            pool.forks.proc.kill()
            pool.forks.proc.wait()
            srv.proc.wait(timeout=10)  # PR_SET_PDEATHSIG: it dies with the server
            return "", "died"

        srv.request = killed_meanwhile
        with pytest.raises(KernelRuntimeError) as info:
            ready(pool, "check:/k.py", tmp_path)
        assert "the fork server it came from ended first (exit -9)" in info.value.message
        assert "--kopt-no-fork-server" in info.value.fix
    finally:
        pool.shutdown()


def test_a_stopped_server_is_given_up_at_once(tmp_path: Path) -> None:
    """A process of this user SIGSTOPs the fork server: the next spawn is not left waiting for its answer (180 s
    before its first answer, 30 s after); the process starts the ordinary way and serves."""
    pool = HarnessPool()
    try:
        ready(pool, "check:/k.py", tmp_path)
        assert pool.forks is not None and pool.forks.answered
        os.kill(pool.forks.proc.pid, signal.SIGSTOP)
        ready(pool, "judge:/r.py", tmp_path)
        assert isinstance(srv_of(pool, "judge:/r.py").proc, ForkedProcess)
        assert not srv_of(pool, "judge:/r.py").proc.forked
        assert pool.forks.broken is not None and "stopped (SIGSTOP)" in pool.forks.broken
    finally:
        if pool.forks is not None:
            os.kill(pool.forks.proc.pid, signal.SIGCONT)
        pool.shutdown()


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_xdist_workers_are_served_by_copies_of_the_sessions_one_server(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller's server is the session's, so torch is imported once, not once per worker: a worker attaches
    with the session's token, and a copy of the server forked for it serves it (its processes forked there, a
    copy's parent the shared server). Once the expected workers have attached, nothing else can; a connection
    without the token is not served; the socket's private folder goes with the session."""
    controller = HarnessPool()
    workers = [HarnessPool(), HarnessPool()]
    try:
        shared = controller.share_fork_server(tmp_path, 2)
        assert shared is not None and controller.forks is not None
        folder = Path(shared["path"]).parent
        assert (folder.stat().st_mode & 0o777) == 0o700
        judge = ready(controller, "judge:/r.py", tmp_path)  # the controller's own processes: forked as before
        assert srv_of(controller, "judge:/r.py").proc.forked and judge["harness_s"]["imported"] < 5.0
        # a process that does not know the token connects first: it is not served, and counts for nothing
        stranger = ForkServer.attach({**shared, "token": "0" * 32})
        assert stranger is not None
        monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")  # what xdist sets in a worker: not read at import
        monkeypatch.setenv("COLUMNS", "80")
        for pool in workers:
            assert pool.attach_fork_server(shared)
        for i, pool in enumerate(workers):
            result = ready(pool, f"candidate:/k{i}.cu", tmp_path)
            proc = srv_of(pool, f"candidate:/k{i}.cu").proc
            assert isinstance(proc, ForkedProcess) and proc.forked and result["harness_s"]["imported"] < 5.0
            assert pool.forks is not None and _parent(proc.pid) == pool.forks.proc.pid
            assert _parent(pool.forks.proc.pid) == controller.forks.proc.pid
            assert Path(f"/proc/{proc.pid}/comm").read_text().strip() == "kopt-timing"
        assert workers[0].forks.proc.pid != workers[1].forks.proc.pid
        assert stranger.answer(1, timeout_s=5.0) == {"error": "the fork server ended"}
        stranger.close()
        late = HarnessPool()
        assert not late.attach_fork_server(shared)  # both workers attached: the server stops listening
        late.shutdown()
        # a worker whose harness environment was not the server's at its import starts its own
        monkeypatch.setenv("OMP_NUM_THREADS", "3")
        assert ForkServer.attach(shared) is None
    finally:
        for pool in (*workers, controller):
            pool.shutdown()
    assert not folder.exists()
    assert workers[0].forks is None and controller.forks is None


def test_local_workers_counts_this_pythons_popen_workers() -> None:
    from types import SimpleNamespace

    from pytest_kopt.plugin.xdist import local_workers

    def config(**option):
        return SimpleNamespace(option=SimpleNamespace(**option))

    assert local_workers(config(dist="no", numprocesses=None, tx=[])) == 0
    assert local_workers(config()) == 0  # xdist not loaded
    assert local_workers(config(dist="load", numprocesses=3, tx=["popen"] * 3)) == 3
    assert local_workers(config(dist="load", numprocesses=None,
                                tx=["2*popen", "ssh=gpu-host//python=python3", "popen//python=python3.12",
                                    "popen//chdir=/elsewhere", "popen//env:OMP_NUM_THREADS=1",
                                    "popen//id=gw9"])) == 3


def test_a_session_under_xdist_imports_torch_once(pytester: pytest.Pytester) -> None:
    """Two workers judging two pure-Python kernels: each worker's processes come from a copy of the controller's
    server (the conftest below records, in each worker, its fork server's parent and its processes')."""
    redteam = Path(__file__).parent / "redteam"
    for src, dst in (("ref_softmax.py", "ref.py"), ("honest_python.py", "k.py"), ("honest_python.py", "k2.py")):
        (pytester.path / dst).write_text((redteam / src).read_text())
    pytester.makeconftest("""
import json, os
from pathlib import Path
from pytest_kopt.plugin.stash import STATE

def pytest_sessionfinish(session):
    if not hasattr(session.config, "workerinput"):
        return
    pool = session.config.stash[STATE].pool
    procs = [s.proc for s in pool.live.values()]
    parent = lambda pid: int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    row = {"server": pool.forks.proc.pid, "server_parent": parent(pool.forks.proc.pid),
           "shared_parent": parent(parent(pool.forks.proc.pid)),
           "forked": [getattr(p, "forked", False) for p in procs],
           "parents": [parent(p.pid) for p in procs if p.poll() is None], "controller": os.getppid()}
    with open("workers.jsonl", "a") as f:
        f.write(json.dumps(row) + "\\n")
""")
    result = pytester.runpytest_subprocess("--kopt-baseline", "k.py", "--kopt-candidate", "k2.py", "--kopt-ref",
                                           "ref.py", "--kopt-dims", "M=64,N=64", "-n", "2", "-p", "no:randomly",
                                           "-p", "no:cacheprovider")
    assert result.ret == 0, result.stdout.str()[-2000:]
    import json

    rows = [json.loads(line) for line in (pytester.path / "workers.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and rows[0]["server"] != rows[1]["server"]
    assert rows[0]["server_parent"] == rows[1]["server_parent"]  # one shared server
    assert rows[0]["shared_parent"] == rows[0]["controller"] == rows[1]["controller"]  # started by the controller
    for row in rows:
        assert row["forked"] and all(row["forked"])
        assert row["parents"] and set(row["parents"]) == {row["server"]}


def test_what_a_connection_without_the_token_sends_neither_ends_nor_holds_up_the_server(tmp_path: Path) -> None:
    """A kernel's code can find the listening socket (a folder of this user's): nothing a connection without the
    token sends ends the server (JSON nested past the recursion limit, bytes that are no JSON), connections that
    send nothing wait beside its other work instead of holding it up, and once the workers are ready the socket's
    folder is removed, so nothing more can connect."""
    import socket
    import time

    controller = HarnessPool()
    idle = []
    try:
        shared = controller.share_fork_server(tmp_path, 1)
        assert shared is not None and controller.forks is not None
        for payload in (b"[" * 100000, b"\xff\xfe", b"{}", b'{"op": "attach", "token": 7, "env": []}'):
            bad = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            bad.connect(shared["path"])
            bad.send(payload)
            bad.close()
        for _ in range(20):  # connections that never send
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            conn.connect(shared["path"])
            idle.append(conn)
        ready(controller, "judge:/r.py", tmp_path)  # answered once the server's imports are done
        started = time.monotonic()
        ready(controller, "check:/k.py", tmp_path)
        assert time.monotonic() - started < 3.0  # not 5 s per idle connection
        assert controller.forks.proc.poll() is None
        worker = HarnessPool()
        env = dict(os.environ)
        try:
            os.environ["PYTEST_XDIST_WORKER"] = "gw0"
            assert worker.attach_fork_server(shared)
            result = ready(worker, "candidate:/k.cu", tmp_path)
            assert srv_of(worker, "candidate:/k.cu").proc.forked and result["ok"]
        finally:
            os.environ.clear()
            os.environ.update(env)
            worker.shutdown()
        controller.forks.stop_listening()
        assert not Path(shared["path"]).parent.exists()
        assert controller.forks.shared is None  # handed to no worker started later (a crashed one's replacement)
        assert ForkServer.attach(shared) is None  # nothing can connect any more
        assert srv_of(controller, "judge:/r.py").proc.poll() is None  # the controller's processes live on
    finally:
        for conn in idle:
            conn.close()
        controller.shutdown()


def test_a_worker_the_sessions_server_refuses_starts_a_server_of_its_own(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the server's check of a worker's environment disagrees with the worker's own (a variable read at the
    server's import that the worker was not told of), the worker's first process starts as a new Python, the
    attachment is given up, and its next processes come from a fork server of its own, not as new Pythons for the
    whole session."""
    from pytest_kopt.proc.runner import harness_start

    controller = HarnessPool()
    worker = HarnessPool()
    try:
        shared = controller.share_fork_server(tmp_path, 1)
        assert shared is not None
        monkeypatch.setenv("OMP_NUM_THREADS", "3")  # read by torch at import: the server refuses it
        env, _, _ = harness_start({})
        assert worker.attach_fork_server({**shared, "env": env})  # the worker was told of another environment
        attached = worker.forks
        ready(worker, "check:/k.py", tmp_path)
        assert not srv_of(worker, "check:/k.py").proc.forked
        assert attached is not None and attached.given_up
        assert attached.broken  # how the attachment ended: refused, or the connection reset before the answer
        ready(worker, "candidate:/k.py", tmp_path)
        own = worker.forks
        assert own is not None and own is not attached and own.shared is None
        assert srv_of(worker, "candidate:/k.py").proc.forked
        assert _parent(own.proc.pid) == os.getpid()  # its own server, started by this process
    finally:
        worker.shutdown()
        controller.shutdown()


def test_a_socket_path_too_long_for_af_unix_leaves_each_worker_its_own_server(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A temporary directory whose path is longer than a Unix socket's 108 bytes: the controller's configure goes
    on, its server listens for no one (no folder left behind), and workers start their own servers."""
    import tempfile

    long = tmp_path / ("d" * 60) / ("e" * 60)
    long.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(long))
    controller = HarnessPool()
    try:
        assert controller.share_fork_server(tmp_path, 2) is None
        assert controller.forks is not None and controller.forks.shared is None
        assert not any(p.name.startswith("kopt-fork-") for p in long.iterdir())
        assert ready(controller, "judge:/r.py", tmp_path)["ok"] and srv_of(controller, "judge:/r.py").proc.forked
    finally:
        controller.shutdown()


def test_the_socket_goes_once_every_worker_handed_it_is_ready() -> None:
    """The controller removes the shared server's socket when the last worker it handed the server to is ready
    (each attached, or gave up, at its configure), not at the first one's."""
    from types import SimpleNamespace

    from pytest_kopt.plugin.xdist import XdistControllerPlugin

    stopped: list[int] = []
    forks = SimpleNamespace(stop_listening=lambda: stopped.append(1))
    state = SimpleNamespace(pool=SimpleNamespace(forks=forks))
    config = SimpleNamespace(option=SimpleNamespace(dist="load", numprocesses=3, tx=["popen"] * 3))
    plugin = XdistControllerPlugin(config, state)
    handed = SimpleNamespace(workerinput={"workerid": "gw0", "kopt_fork_server": {"path": "/x/s"}})
    plugin.pytest_testnodeready(SimpleNamespace(workerinput={"workerid": "gw9"}))  # not handed the server
    plugin.pytest_testnodeready(handed)
    plugin.pytest_testnodeready(handed)
    assert stopped == []
    plugin.pytest_testnodeready(handed)
    assert stopped == [1]


def test_a_worker_never_sends_the_token_to_a_socket_put_in_the_servers_place(tmp_path: Path) -> None:
    """Another process of this user can remove the socket's folder and listen at the same path before a worker
    attaches: the worker checks the peer of its connection (SO_PEERCRED) against the controller that handed it the
    server, sends the token to no one else and starts a server of its own."""
    import shutil
    import sys
    import textwrap

    controller = HarnessPool()
    worker = HarnessPool()
    got = tmp_path / "got"
    try:
        shared = controller.share_fork_server(tmp_path, 1)
        assert shared is not None and shared["listener_pid"] == os.getpid()
        folder = Path(shared["path"]).parent
        shutil.rmtree(folder)
        folder.mkdir(mode=0o700)
        impostor = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""\
            import socket, sys
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            s.bind({shared["path"]!r}); s.listen(4)
            print("listening", flush=True)
            conn, _ = s.accept()
            conn.settimeout(3.0)
            try:
                data = conn.recv(1 << 20)
            except TimeoutError:
                data = b"nothing"
            open({str(got)!r}, "wb").write(data)
            """)], stdout=subprocess.PIPE, text=True)
        assert impostor.stdout is not None and impostor.stdout.readline().strip() == "listening"
        env = dict(os.environ)
        try:
            os.environ["PYTEST_XDIST_WORKER"] = "gw0"
            assert not worker.attach_fork_server(shared)  # refused at the peer check: no attachment
        finally:
            os.environ.clear()
            os.environ.update(env)
        impostor.wait(timeout=10)
        assert got.read_bytes() in (b"", b"nothing") and shared["token"].encode() not in got.read_bytes()
        result = ready(worker, "candidate:/k.py", tmp_path)
        own = worker.forks
        assert result["ok"] and own is not None and own.shared is None and _parent(own.proc.pid) == os.getpid()
    finally:
        worker.shutdown()
        controller.shutdown()


def test_connections_that_never_send_are_closed_oldest_first_and_after_the_attach_timeout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server's loop keeps at most MAX_PENDING connections waiting for their attach request, closing the oldest
    when more come, and closes each after ATTACH_TIMEOUT_S; it answers its own socket all the while and ends when
    that socket closes."""
    import socket
    import threading
    import time

    from pytest_kopt.child import forkserver as child

    monkeypatch.setattr(child, "MAX_PENDING", 3)
    monkeypatch.setattr(child, "ATTACH_TIMEOUT_S", 1.5)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(str(tmp_path / "s"))
    listener.listen(16)
    ended: list[int] = []
    loop = threading.Thread(target=lambda: ended.append(child._loop(theirs, {}, (), listener, "0" * 64, 1)))
    loop.start()
    conns = []
    try:
        for _ in range(5):
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            conn.connect(str(tmp_path / "s"))
            conns.append(conn)
            time.sleep(0.1)  # accepted one by one: their order is the order of their connects

        def closed(conn: socket.socket, within_s: float) -> bool:
            conn.settimeout(within_s)
            try:
                return conn.recv(16) == b""
            except TimeoutError:
                return False

        assert [closed(c, 0.3) for c in conns] == [True, True, False, False, False]
        ours.send(b'{"op": "wait", "pid": 999999999}')  # answered while three connections wait: no such child
        assert b"is no harness process of this server's" in ours.recv(4096)
        assert [closed(c, 3.0) for c in conns[2:]] == [True, True, True]  # expired after 1.5 s (checked each 1 s)
    finally:
        ours.close()
        loop.join(5)
        for conn in conns:
            conn.close()
        listener.close()
    assert not loop.is_alive() and ended == [0]


def test_a_worker_that_meets_a_full_backlog_tries_again_within_its_connect_time(tmp_path: Path) -> None:
    """Strangers' connections can fill the listening socket's backlog before the server's loop accepts them (a
    non-blocking AF_UNIX connect then fails at once with EAGAIN): the worker tries again until its connect time
    (ATTACH_CONNECT_S) is up instead of giving up on the session's server at once; its request then arrives."""
    import socket
    import threading

    from pytest_kopt.proc.runner import harness_start

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(str(tmp_path / "s"))
    listener.listen(0)
    strangers = []
    for _ in range(8):  # the backlog full: the next connect is refused at once
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        conn.setblocking(False)
        try:
            conn.connect(str(tmp_path / "s"))
        except BlockingIOError:
            conn.close()
            break
        strangers.append(conn)
    else:
        pytest.fail("the backlog never filled")
    env, pythonpath, _ = harness_start({})
    shared = {"path": str(tmp_path / "s"), "token": "t0k", "env": env, "pythonpath": pythonpath, "log": "",
              "listener_pid": os.getpid()}
    received: list[bytes] = []

    def server_loop_catches_up() -> None:  # the server's loop accepts the waiting connections 0.5 s later
        threading.Event().wait(0.5)
        conns = [listener.accept()[0] for _ in range(len(strangers) + 1)]
        received.append(conns[-1].recv(1 << 20))
        for conn in conns:
            conn.close()

    catch_up = threading.Thread(target=server_loop_catches_up)
    catch_up.start()
    attached = ForkServer.attach(shared)
    catch_up.join(5)
    try:
        assert attached is not None  # before: None at once, and the worker started its own server
        assert received and b'"token": "t0k"' in received[0]
    finally:
        if attached is not None:
            attached.sock.close()
        for conn in strangers:
            conn.close()
        listener.close()


def test_a_worker_whose_request_came_is_never_closed_to_make_room(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker that connected and sent its attach request before a burst of strangers' connections is the oldest
    waiting: room is made among the connections that sent nothing, so the worker's request is answered (here the
    answer that needs no fork: its environment refused)."""
    import hashlib
    import json
    import socket
    import threading

    from pytest_kopt.child import forkserver as child

    monkeypatch.setattr(child, "MAX_PENDING", 1)  # the worker, accepted first, is the oldest when the next comes
    path = str(tmp_path / "s")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(16)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    worker = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    worker.connect(path)
    worker.send(json.dumps({"op": "attach", "token": "t0k", "env": {"OMP_NUM_THREADS": "3"}}).encode())
    strangers = []
    for _ in range(5):
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        conn.connect(path)
        strangers.append(conn)
    loop = threading.Thread(target=child._loop, args=(theirs, {}, (), listener, hashlib.sha256(b"t0k").hexdigest(), 1))
    loop.start()
    worker.settimeout(3.0)
    try:
        answer = json.loads(worker.recv(4096))
        assert answer == {"id": 0, "error": "refused", "variables": ["OMP_NUM_THREADS"]}
    finally:
        ours.close()
        loop.join(5)
        for conn in [worker, *strangers]:
            conn.close()
        listener.close()
    assert not loop.is_alive()


def test_a_bad_message_on_the_servers_own_socket_is_answered_and_the_server_goes_on(tmp_path: Path) -> None:
    """What the server's own socket carries is answered, never ends the server: a message that is not JSON, JSON that
    is no object, a request without its fields, a refused spawn, and a reap of a process it did not fork on
    request (any other child of the server, such as a worker's server, which its loop reaps itself: before, reaping
    it made the loop's next reap raise and end the server; pid -1, which waitpid reads as any child). The server
    then still serves, and ends when its socket closes."""
    import socket
    import threading

    from pytest_kopt.child import forkserver as child

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ended: list[int] = []
    loop = threading.Thread(target=lambda: ended.append(child._loop(theirs, {}, ())))
    loop.start()
    ours.settimeout(5)
    other = os.fork()  # a child of the server's process it did not fork on request
    if other == 0:
        os._exit(7)
    try:
        answers = []
        for msg in (b"not json", b"[1, 2]", b'"op"', b"{}", b'{"id": 7, "op": "reap", "pid": "x"}',
                    b'{"id": 8, "op": "spawn", "argv": [], "env": {"X": "1"}, "fds": []}',
                    b'{"id": 9, "op": "reap", "pid": -1}', b'{"id": 10, "op": "reap", "pid": %d}' % other):
            ours.send(msg)
            answers.append(json.loads(ours.recv(4096)))
        assert [a["id"] for a in answers] == [None, None, None, None, 7, 8, 9, 10]
        assert all(a["error"] for a in answers)
        assert answers[5] == {"id": 8, "error": "refused", "variables": ["X"]}
        assert answers[6]["error"] == "-1 is no harness process of this server's"
        assert answers[7]["error"] == f"{other} is no harness process of this server's"
        assert loop.is_alive()
    finally:
        ours.close()
        loop.join(5)
        _, status = os.waitpid(other, 0)  # still there to reap: the server took it from no one
    assert os.waitstatus_to_exitcode(status) == 7
    assert not loop.is_alive() and ended == [0]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_DUMPABLE is Linux's")
def test_the_server_is_not_dumpable_and_its_harness_processes_are() -> None:
    """_dumpable, as the server (off) and each harness process forked from it (on again) call it, sets what
    PR_GET_DUMPABLE reads back: off, no process of this user without CAP_SYS_PTRACE can attach to the server or take
    its sockets with pidfd_getfd."""
    import ctypes

    from pytest_kopt.child import forkserver as child

    def in_a_fork(on: bool) -> int:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            child._dumpable(on)
            os.write(w, bytes([ctypes.CDLL(None).prctl(3, 0, 0, 0, 0)]))  # PR_GET_DUMPABLE = 3
            os._exit(0)
        os.close(w)
        got = os.read(r, 1)
        os.close(r)
        os.waitpid(pid, 0)
        return got[0]

    assert (in_a_fork(False), in_a_fork(True)) == (0, 1)


SPY = """
import ctypes, socket, sys
seen = {}
class Spy:  # records, at the first import of numpy and of torch, whether this process is dumpable
    def find_spec(self, name, path=None, target=None):
        if name in ("numpy", "torch") and name not in seen:
            seen[name] = ctypes.CDLL(None).prctl(3, 0, 0, 0, 0)  # PR_GET_DUMPABLE
        return None
sys.meta_path.insert(0, Spy())
from pytest_kopt.child import forkserver
assert "numpy" not in sys.modules and "torch" not in sys.modules
ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
ours.close()  # its loop ends at once
print(forkserver.serve(theirs.detach()), seen["numpy"], seen["torch"])
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_DUMPABLE is Linux's")
def test_the_server_is_not_dumpable_before_its_imports(tmp_path: Path) -> None:
    """serve() turns dumpable off before it imports numpy and torch (seconds, while it already holds its sockets),
    not after them."""
    script = tmp_path / "spy.py"
    script.write_text(SPY)
    out = subprocess.run([sys.executable, "-P", "-s", str(script)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "0", "0"]  # the loop's exit code; not dumpable at numpy's, at torch's import
