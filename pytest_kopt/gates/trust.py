"""What the pytest processes of a session trust: results they signed, and bytes whose hash a trusted process sent.

A kernel's process runs as the same user and can write wherever the session caches results. So every cached entry
the session relies on (the reference's outputs, its timing, correctness records) carries an HMAC under a key that
lives only in the session's pytest processes (:class:`Trust`; the xdist controller hands it to its workers, never
to a harness process), and an entry the session did not sign is recomputed, never trusted. Files a trusted process
wrote are read once and judged from those bytes (:func:`read_verified`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from pathlib import Path
from typing import Any, Callable

from ..artifacts import read_dict, write_json
from ..errors import KernelRuntimeError, KoptError


class Trust:
    """The session's MAC key (32 bytes): drawn by the controller, adopted by xdist workers (:meth:`from_hex`)."""

    def __init__(self, key: bytes | None = None) -> None:
        self.key = key if key is not None else os.urandom(32)
        if len(self.key) != 32:
            raise ValueError(f"a session key is 32 bytes, got {len(self.key)}")

    @classmethod
    def from_hex(cls, key_hex: str) -> "Trust":
        """The controller's key as it crossed to a worker. Raises ValueError unless it is 64 hex digits."""
        return cls(bytes.fromhex(key_hex))

    def hex(self) -> str:
        """The key as hex, for the xdist controller to hand to its workers (never to a harness process)."""
        return self.key.hex()

    def mac(self, *parts: Any) -> str:
        """HMAC-SHA256 of ``parts`` (bytes, or anything JSON can encode), hex."""
        h = hmac.new(self.key, digestmod="sha256")
        for part in parts:
            h.update(part if isinstance(part, bytes) else json.dumps(part, sort_keys=True, default=str).encode())
            h.update(b"\x00")
        return h.hexdigest()

    def verify(self, mac: Any, *parts: Any) -> bool:
        """True when ``mac`` is this session's MAC of ``parts`` (constant-time comparison)."""
        return isinstance(mac, str) and hmac.compare_digest(mac, self.mac(*parts))

    def cached(self, folder: Path, name: str, compute: Callable[[], tuple[Any, ...]], *,
               signed: bool = True, blob_suffix: str = ".npz", gate: str = "", display: str = ""
               ) -> tuple[dict[str, Any], bytes | None, bool]:
        """``compute()`` once per ``name`` under ``folder``, shared by the session's processes: under a file lock,
        load ``<name>.json`` (and its blob ``<name><blob_suffix>``), verify it (this session's MAC when ``signed``;
        the blob's SHA-256 always), else run ``compute() -> (payload, blob or None[, the blob's SHA-256 hex when
        the caller has just verified it, so it is not hashed again])`` and write both. Returns
        (payload, blob bytes or None, cache hit). An entry that fails verification is recomputed. Unsigned entries
        (``signed=False``) are kept across sessions. Raises what ``compute`` raises."""
        from filelock import FileLock

        folder.mkdir(parents=True, exist_ok=True)
        meta, blob_path = folder / f"{name}.json", folder / f"{name}{blob_suffix}"
        with FileLock(str(folder / f"{name}.lock")):
            entry = read_dict(meta)
            if entry is not None and "payload" in entry and (not signed or self.verify(
                    entry.get("mac"), entry["payload"], entry.get("sha256"))):
                blob = None
                try:
                    if entry.get("sha256") is not None:
                        blob = read_verified(blob_path, entry["sha256"], gate, display)
                    return entry["payload"], blob, True
                except (OSError, KoptError):
                    pass  # the blob is gone or changed: compute it again
            payload, blob, *known = compute()
            sha = None
            if blob is not None:
                tmp = blob_path.with_name(blob_path.name + f".{os.getpid()}.tmp")
                tmp.write_bytes(blob)
                os.replace(tmp, blob_path)
                sha = known[0] if known and known[0] else hashlib.sha256(blob).hexdigest()
            write_json(meta, {"payload": payload, "sha256": sha, "mac": self.mac(payload, sha) if signed else None})
            return payload, blob, False


def read_verified(path: Path, sha: str | None, gate: str, display: str) -> bytes:
    """The bytes of a trusted process's file, read once, whose SHA-256 must be ``sha`` (sent on that process's
    private control pipe, or kept in a signed cache entry). Everything is then judged from these bytes, never from
    the file again: another process of the same user could rewrite it at any time, even through a shared mapping
    that leaves its mtime and ctime alone. Raises KernelRuntimeError (TAMPERED) when the hash differs or none came,
    OSError when the file cannot be read."""
    data = Path(path).read_bytes()
    if sha is None or not hmac.compare_digest(hashlib.sha256(data).hexdigest(), sha):
        raise KernelRuntimeError(f"the reference's outputs ({Path(path).name}) changed after its process wrote them",
                                 gate=gate, path=display, status="TAMPERED",
                                 fix="a kernel (or a process it left running) wrote into the kopt work or cache "
                                     "folder; run the kernels in separate sessions to see which one")
    return data


def digest(*parts: Any) -> str:
    """A short content key (24 hex digits of SHA-256) of ``parts`` (bytes, or anything JSON can encode): cache
    names and build fingerprints; not a MAC."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part if isinstance(part, bytes) else json.dumps(part, sort_keys=True, default=str).encode())
    return h.hexdigest()[:24]


def local_sources(path: Path) -> bytes:
    """The bytes of every ``.py`` file beside ``path`` (a reference or kernel may import its neighbours), and of the
    files a GPU MODE ``task.yml`` beside it lists (``../utils.py``), so a cache key changes when a helper module
    does."""
    from ..child.gpumode import task_files

    h = hashlib.sha256()
    for f in sorted(path.parent.glob("*.py")) + sorted(task_files(path).values()):
        try:
            h.update(f.name.encode() + f.read_bytes())
        except OSError:
            continue
    return h.digest()
