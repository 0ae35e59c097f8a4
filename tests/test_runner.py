"""The warm harness processes of pytest_kopt.runner: a prestarted process is the one the first request gets."""

from __future__ import annotations

from pathlib import Path

from pytest_kopt import runner


def test_prestarted_process_serves_the_first_request_and_is_ended_at_shutdown(tmp_path: Path) -> None:
    """prestart() spawns without waiting; _server_for() then waits for that same process (no second spawn), and
    shutdown_servers() ends it. A second prestart of a running identity is a no-op; None (fresh processes) too."""
    runner.prestart(None, {}, tmp_path)
    assert not runner._STARTING
    runner.prestart("reference:/r.py", {}, tmp_path)
    started = runner._STARTING[("reference:/r.py", ())]
    try:
        srv = runner._server_for("reference:/r.py", {}, tmp_path, gate="correctness", path="r.py")
        assert srv is started and not runner._STARTING
        assert srv.proc.poll() is None  # ready, alive
        runner.prestart("reference:/r.py", {}, tmp_path)
        assert not runner._STARTING
    finally:
        runner.shutdown_servers()
    assert started.proc.poll() is not None and not runner._POOL


def test_read_verified_returns_the_hashed_bytes_or_raises_tampered(tmp_path: Path) -> None:
    """The reference's outputs are judged from the bytes whose SHA-256 matched the attested one; a changed file (or
    no attested hash) is TAMPERED."""
    import hashlib

    import pytest

    from pytest_kopt.errors import KernelRuntimeError
    from pytest_kopt.gates import read_verified

    f = tmp_path / "ref.npz"
    f.write_bytes(b"outputs v1")
    good = hashlib.sha256(b"outputs v1").hexdigest()
    assert read_verified(f, good, "correctness", "k.cu") == b"outputs v1"
    f.write_bytes(b"outputs v2")
    for sha in (good, None):
        with pytest.raises(KernelRuntimeError) as info:
            read_verified(f, sha, "correctness", "k.cu")
        assert info.value.status == "TAMPERED" and "ref.npz" in info.value.message
