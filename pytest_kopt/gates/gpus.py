"""Several GPUs in one session: which GPUs a session uses (``--kopt-gpus``), which one each pytest-xdist worker
is pinned to, and the environment a pinned process reports.

Plain Python over :func:`pytest_kopt.gates.hardware.detect`'s document; nothing here touches CUDA. A worker is pinned
by setting ``CUDA_VISIBLE_DEVICES`` to its GPU's UUID in the worker's environment, which every child it starts
(harness, ncu, compute-sanitizer) inherits; UUIDs, unlike indices, name the same GPU whatever
``CUDA_VISIBLE_DEVICES`` the controller itself was started with (CUDA C Programming Guide, "CUDA Environment
Variables").
"""

from __future__ import annotations

import re
from typing import Any

from ..errors import ConfigError

#: xdist worker ids (``gw0``, ``gw1``, ...): on another host, the number after ``gw`` picks its GPU round-robin.
_WORKER_RE = re.compile(r"^gw(\d+)$")


def arch_of(cc: str) -> str:
    """nvcc arch for a compute capability: ``9.0`` -> ``sm_90a`` (Hopper's arch-specific target, so wgmma and
    setmaxnreg are allowed), ``10.0`` -> ``sm_100a``, others plain (``8.0`` -> ``sm_80``)."""
    major, minor = (int(x) for x in cc.split("."))
    suffix = "a" if major >= 9 else ""
    return f"sm_{major}{minor}{suffix}"


def select(env: dict[str, Any], spec: str | None) -> list[dict[str, Any]]:
    """The GPUs a session uses, in the order given.

    ``env``: :func:`pytest_kopt.gates.hardware.detect`'s document (its ``gpus`` list: ``index``, ``uuid``, ``name``,
    ``cc`` ...). ``spec``: ``None``/``""``/``all`` for the visible GPUs of the first one's model (same name and
    compute capability; a machine that mixes models uses that model's only, and GPUs whose UUIDs repeat, as MIG
    slices of one GPU can, leave the first alone), else a comma list of CUDA ordinals into that list (``0,1``:
    they follow ``CUDA_VISIBLE_DEVICES`` and ``CUDA_DEVICE_ORDER``) or UUIDs (``GPU-5165af39-...``, or a unique
    prefix of one). Returns ``[]`` without a GPU (the hardware gate then reports why). Raises
    :class:`~pytest_kopt.errors.ConfigError`, for an explicit list only, on an ordinal out of range, an unknown or
    ambiguous UUID, a repeated GPU, or GPUs of different models (one session compiles for one arch and compares
    timings across its GPUs).
    """
    text = (spec or "").strip()
    parts = parse(text)
    visible = list(env.get("gpus") or [])
    if not visible:
        return []
    if not parts:
        first = visible[0]
        same = [g for g in visible if (g["name"], g["cc"]) == (first["name"], first["cc"])]
        uuids = [g["uuid"] for g in same]
        return same if len(set(uuids)) == len(uuids) else [first]
    listing = _listing(visible)
    chosen = []
    for part in parts:
        if part.isdigit():
            if int(part) >= len(visible):
                raise ConfigError(f"--kopt-gpus {text}: there is no GPU {part}; visible: {listing}",
                                  fix=f"use CUDA ordinals 0..{len(visible) - 1}, UUIDs, or all")
            chosen.append(visible[int(part)])
            continue
        hits = [g for g in visible if part and g["uuid"].lower().startswith(part.lower())]
        if len(hits) != 1:
            what = "matches no visible GPU" if not hits else "matches several GPUs"
            raise ConfigError(f"--kopt-gpus {text}: {part!r} {what}; visible: {listing}",
                              fix="give CUDA ordinals (0,1) or whole UUIDs as nvidia-smi -L prints them")
        chosen.append(hits[0])
    uuids = [g["uuid"] for g in chosen]
    if len(set(uuids)) != len(uuids):
        raise ConfigError(f"--kopt-gpus {text}: a GPU is listed twice; visible: {listing}", fix="list each GPU once")
    models = {(g["name"], g["cc"]) for g in chosen}
    if len(models) > 1:
        raise ConfigError(f"--kopt-gpus {text}: the GPUs are of different models "
                          f"({', '.join(f'{n} cc {c}' for n, c in sorted(models))}); one session compiles for one arch "
                          "and compares timings across its GPUs", fix="list GPUs of one model")
    return chosen


def parse(text: str) -> list[str]:
    """The parts of a ``--kopt-gpus`` value, checked before any GPU is looked at (so a typo fails on a machine
    without GPUs too): ``[]`` for ``""``/``all``; else each comma-separated part must be a CUDA ordinal (ASCII
    digits) or a UUID or its prefix (``GPU-...``/``MIG-...``). Raises ConfigError on anything else, an empty part
    or a part given twice."""
    if text.strip().lower() in ("", "all"):
        return []
    parts = [p.strip() for p in text.split(",")]
    for part in parts:
        ordinal = part.isascii() and part.isdigit()
        if not ordinal and not re.fullmatch(r"(?i)(GPU|MIG)-[0-9a-f-]*", part):
            raise ConfigError(f"--kopt-gpus {text}: {part!r} is neither a CUDA ordinal nor a GPU UUID",
                              fix="give all, ordinals such as 0,1, or UUIDs (or their prefixes) as nvidia-smi -L "
                                  "prints them")
    norm = [str(int(p)) if p.isdigit() else p.lower() for p in parts]
    if len(set(norm)) != len(norm):
        raise ConfigError(f"--kopt-gpus {text}: a GPU is listed twice", fix="list each GPU once")
    return parts


def _listing(gpus: list[dict[str, Any]]) -> str:
    return ", ".join(f"{g['index']}: {g['name']} {g['uuid']}" for g in gpus)


def worker_gpu(gpus: list[dict[str, Any]], worker_id: str) -> dict[str, Any] | None:
    """The GPU of an xdist worker by its id alone (a worker on another host, which only knows its own GPUs):
    ``gwN`` gets ``gpus[N % len(gpus)]``, any other id the first GPU. None without GPUs."""
    if not gpus:
        return None
    m = _WORKER_RE.match(worker_id or "")
    return gpus[int(m.group(1)) % len(gpus)] if m else gpus[0]


def least_loaded(gpus: list[dict[str, Any]], load: dict[str, int]) -> dict[str, Any] | None:
    """The GPU with the fewest live workers (``load``: UUID -> count), the first of ``gpus`` on a tie; the
    controller's choice for each worker it starts, so ``-n 4`` on two GPUs puts two workers on each and a worker
    xdist restarts after a crash takes the place its predecessor left. None without GPUs."""
    return min(gpus, key=lambda g: load.get(g["uuid"], 0)) if gpus else None


def pinned(env: dict[str, Any], gpu: dict[str, Any]) -> dict[str, Any]:
    """``env`` as seen by a process pinned to ``gpu``: ``gpu`` (and ``sm_arch``) name it, ``cuda_visible_devices``
    is its UUID, ``gpus`` still lists every GPU the session uses, ``pinned`` is true."""
    return {**env, "gpu": gpu, "sm_arch": arch_of(gpu["cc"]), "cuda_visible_devices": gpu["uuid"], "pinned": True}


def session_view(env: dict[str, Any]) -> dict[str, Any]:
    """The session's environment document whatever process holds it: a worker's pin undone (``gpu`` is the
    session's first GPU, as in the controller), so every worker writes the same ``env.json``."""
    gpus = env.get("gpus") or []
    return pinned(env, gpus[0]) if env.get("pinned") and gpus else env


def should_pin(gpus: list[dict[str, Any]], spec: str | None) -> bool:
    """Pin processes only when the session uses several GPUs or ``--kopt-gpus`` names them; one visible GPU and no
    option leaves ``CUDA_VISIBLE_DEVICES`` untouched (the behaviour of a one-GPU machine)."""
    return bool(gpus) and (len(gpus) > 1 or bool(parse(spec or "")))


def same_device(reported: str | None, uuid: str | None) -> bool:
    """Whether a UUID a child process reported (with or without the ``GPU-`` prefix) is ``uuid``; True when either
    is unknown (a torch whose device properties carry no UUID, or a process not pinned)."""
    if not reported or not uuid:
        return True
    return reported.lower().removeprefix("gpu-") == uuid.lower().removeprefix("gpu-")
