"""Regenerates scale.ptx from scale.cu with NVRTC, for a maintainer who changes the kernel; the build
and the tests only read the committed scale.ptx.

    python examples/cuda_kernel/kernels/generate.py [path/to/libnvrtc.so]

NVRTC is found in the `nvidia-cuda-nvrtc` wheel that CUDA builds of torch install, unless a path is
given. Its PTX is for compute capability 7.5 (the oldest that CUDA 13 compiles for; the driver
compiles it for newer GPUs), and its `.version` line is set to PTX ISA 7.0: NVRTC writes its own
ISA version (9.2 for CUDA 13.2), which drivers older than that toolkit refuse with
CUDA_ERROR_UNSUPPORTED_PTX_VERSION, while this kernel needs nothing newer than 7.0. The tests check
the result with ptxas where one is installed (examples/cuda_kernel/tests/test_cuda_kernel.py)."""

import ctypes
import glob
import os
import re
import sys
from pathlib import Path

HERE = Path(__file__).parent
ISA = "7.0"
ARCH = "compute_75"


def find_nvrtc():
    if len(sys.argv) > 1:
        return sys.argv[1]
    import site

    for base in site.getsitepackages():
        found = sorted(glob.glob(os.path.join(base, "nvidia", "*", "lib", "libnvrtc.so*")))
        found = [f for f in found if "builtins" not in f]
        if found:
            return found[0]
    sys.exit("no libnvrtc found: pass its path (it comes with the CUDA toolkit, or pip install nvidia-cuda-nvrtc)")


def compile_ptx(nvrtc, source, name):
    lib = ctypes.CDLL(nvrtc)
    program = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(program), source, name.encode(), 0, None, None) == 0
    options = [f"--gpu-architecture={ARCH}".encode()]
    rc = lib.nvrtcCompileProgram(program, len(options), (ctypes.c_char_p * len(options))(*options))
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(program, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(program, log)
    if rc != 0:
        sys.exit(f"NVRTC failed ({rc}):\n{log.value.decode()}")
    lib.nvrtcGetPTXSize(program, ctypes.byref(size))
    ptx = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetPTX(program, ptx)
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return ptx.value.decode(), f"{major.value}.{minor.value}"


def main():
    ptx, version = compile_ptx(find_nvrtc(), (HERE / "scale.cu").read_bytes(), "scale.cu")
    ptx, count = re.subn(r"^\.version \d+\.\d+$", f".version {ISA}", ptx, flags=re.M)
    assert count == 1, "NVRTC's output has no .version line"
    header = (f"//\n// scale.cu compiled by NVRTC {version} (--gpu-architecture={ARCH}) with kernels/generate.py,\n"
              f"// its .version set to {ISA} so that older drivers load it. Do not edit: regenerate.\n")
    (HERE / "scale.ptx").write_text(header + ptx.lstrip("\n"))
    print(f"wrote {HERE / 'scale.ptx'} (NVRTC {version}, PTX ISA {ISA}, {ARCH})")


if __name__ == "__main__":
    main()
