"""The GPU probe's driver-API path through cuda-bindings, against a stand-in of its ``driver`` module (its calls
return ``(CUresult, values...)`` as cuda-bindings' do) and an empty ``libcuda.so.1`` for the loader's check; and
its fall back to ctypes when the bindings' API is not what it calls."""

from __future__ import annotations

import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from pytest_kopt.gates import hardware

FAKE_DRIVER = '''
import enum
class CUresult(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_NO_DEVICE = 100
class CUdevice_attribute(int):
    pass
class CUuuid:
    bytes = bytes(range(16))
ATTR = {75: 9, 76: 0, 16: 132, 38: 62914560, 97: 232448, 13: 1980000, 36: 3201000, 37: 6144}
def cuInit(flags): return (CUresult.CUDA_SUCCESS,)
def cuDriverGetVersion(): return (CUresult.CUDA_SUCCESS, 13000)
def cuDeviceGetCount(): return (CUresult.CUDA_SUCCESS, COUNT)
def cuDeviceGet(i): return (CUresult.CUDA_SUCCESS, i)
def cuDeviceGetName(n, d): return (CUresult.CUDA_SUCCESS, b"NVIDIA H200" + bytes(n - 11))
def cuDeviceGetAttribute(a, d):
    assert isinstance(a, CUdevice_attribute)
    return (CUresult.CUDA_SUCCESS, ATTR[int(a)])
def cuDeviceTotalMem(d): return (CUresult.CUDA_SUCCESS, 150 * 2**30)
def cuDeviceGetUuid(d): return (CUresult.CUDA_SUCCESS, CUuuid())
def cuDevicePrimaryCtxRetain(d): return (CUresult.CUDA_SUCCESS, object())
def cuCtxPushCurrent(c): return (CUresult.CUDA_SUCCESS,)
def cuMemGetInfo(): return (CUresult.CUDA_SUCCESS, 140 * 2**30, 150 * 2**30)
def cuCtxPopCurrent(): return (CUresult.CUDA_SUCCESS, None)
def cuDevicePrimaryCtxRelease(d): return (CUresult.CUDA_SUCCESS,)
def cuGetErrorString(e): return (CUresult.CUDA_SUCCESS, b"no CUDA-capable device is detected")
'''


@pytest.fixture
def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A folder with the stand-in ``cuda.bindings.driver`` and an empty ``libcuda.so.1``, on the probe's paths."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler for the stand-in libcuda.so.1")
    (tmp_path / "stub.c").write_text("int kopt_stub;\n")
    subprocess.run(["cc", "-shared", "-o", str(tmp_path / "libcuda.so.1"), str(tmp_path / "stub.c")], check=True)
    pkg = tmp_path / "cuda" / "bindings"
    pkg.mkdir(parents=True)
    (tmp_path / "cuda" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    monkeypatch.setenv("LD_LIBRARY_PATH", str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))

    def driver(count: int, extra: str = "") -> None:
        (pkg / "driver.py").write_text(FAKE_DRIVER + f"COUNT = {count}\n" + textwrap.dedent(extra))
    return driver


def test_the_probe_reads_every_gpu_through_cuda_bindings(stand_in) -> None:
    stand_in(1)
    out = hardware.probe_gpus()
    assert (out["error"], out["driver_version"], out["probe"]) == (None, "13.0", "cuda-bindings")
    (gpu,) = out["gpus"]
    assert gpu == {"index": 0, "name": "NVIDIA H200", "uuid": "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f",
                   "cc": "9.0", "sm_count": 132, "l2_bytes": 62914560, "smem_per_block_optin_bytes": 232448,
                   "memory_bytes": 150 * 2**30, "free_bytes": 140 * 2**30, "sm_clock_khz": 1980000,
                   "mem_clock_khz": 3201000, "mem_bus_width_bits": 6144}


def test_a_cuda_error_is_the_probes_error(stand_in) -> None:
    stand_in(1, "def cuInit(flags): return (CUresult.CUDA_ERROR_NO_DEVICE,)\n")
    out = hardware.probe_gpus()
    assert out["gpus"] == [] and out["probe"] == "cuda-bindings"
    assert out["error"] == "cuInit failed: CUDA error 100 no CUDA-capable device is detected"


def test_bindings_of_another_api_fall_back_to_ctypes(stand_in) -> None:
    """A TypeError from the bindings (an API that changed) is no CUDA error: the probe runs through ctypes instead,
    which finds the stand-in library empty (its own error), never a wrong GPU list."""
    stand_in(1, "def cuDriverGetVersion(): raise TypeError('takes no arguments')\n")
    out = hardware.probe_gpus()
    assert out["probe"] == "ctypes" and out["gpus"] == [] and "cuInit" in out["error"], out


def test_without_the_driver_library_the_message_is_the_same() -> None:
    if hardware.probe_gpus()["gpus"]:
        pytest.skip("a driver is installed here")
    assert hardware.probe_gpus()["error"].startswith(hardware.NO_DRIVER)
