"""The checks of `scripts/gpu-test.sh`, each exiting non-zero with the reason (Python 3.8 or later,
standard library only: it runs on the GPU machine before anything is installed):

    gpu-check.py interpreter WHEEL    this python3 is the CPython version and machine WHEEL is for
    gpu-check.py wheel WHEEL MODULE   WHEEL holds MODULE's extension for CPython 3.12; prints the glibc it needs
    gpu-check.py glibc WHEEL...       this machine's glibc is at least as new as each wheel's extension needs
    gpu-check.py requirements         torch with a CUDA device, CuPy and NumPy import; the other libraries listed
    gpu-check.py unpack SITE WHEEL... unpacks wheels into SITE (for an interpreter without pip)
    gpu-check.py installed SITE       dlbridge and cuda_kernel are imported from SITE; prints versions
    gpu-check.py junit XML            the JUnit XML of the run holds tests, and none was skipped

DLBRIDGE_GPU_GLIBC overrides this machine's glibc version for `glibc`: the CI test of the old-glibc
refusal sets it (no machine with an old glibc is at hand there).
"""

import importlib
import os
import platform
import struct
import sys
import xml.etree.ElementTree as ET
import zipfile

TAG = "cpython-312-x86_64-linux-gnu"
SHT_GNU_VERNEED = 0x6FFFFFFE


def interpreter(wheel):
    """The wheel's tags are `{python}-{abi}-{platform}` at the end of its name (PEP 427)."""
    python, _, plat = os.path.basename(wheel)[: -len(".whl")].split("-")[-3:]
    found = f"{platform.python_implementation()} {platform.python_version()} on {platform.machine()} {sys.platform}"
    here = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    if platform.python_implementation() != "CPython" or python != here or not plat.endswith(platform.machine()) or sys.platform != "linux":
        sys.exit(f"python3 is {found} ({sys.executable}), and the wheels are for {python} on {plat}")
    print(f"python3: {found}, {sys.executable}; glibc {machine_glibc_text()}")


def machine_glibc_text():
    return os.environ.get("DLBRIDGE_GPU_GLIBC") or (os.confstr("CS_GNU_LIBC_VERSION") or "glibc ?").split()[-1]


def version(text):
    return tuple(int(p) for p in text.split("."))


def glibc_needed(elf):
    """The newest GLIBC_x.y symbol version an ELF64 little-endian shared object needs, as a tuple;
    (0,) when it needs none."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", elf, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    newest = (0,)
    for _, kind, _, _, offset, _, link, count, _, _ in sections:
        if kind != SHT_GNU_VERNEED:
            continue
        strings = sections[link][4]
        at = offset
        for _ in range(count):
            _, aux_count, _, aux, next_need = struct.unpack_from("<HHIII", elf, at)
            aux_at = at + aux
            for _ in range(aux_count):
                _, _, _, name, next_aux = struct.unpack_from("<IHHII", elf, aux_at)
                end = elf.index(b"\0", strings + name)
                text = elf[strings + name:end].decode()
                if text.startswith("GLIBC_") and text[6:].replace(".", "").isdigit():
                    newest = max(newest, version(text[6:]))
                aux_at += next_aux
            at += next_need
    return newest


def extension_of(wheel, module, tag=TAG):
    """The name and bytes of MODULE's extension in WHEEL: for CPython 3.12 on x86_64 Linux, or with
    `tag=None` for whichever interpreter it was built for."""
    stem = f"{module}/_native." if module == "dlbridge" else f"{module}/{module}."
    with zipfile.ZipFile(wheel) as z:
        names = [n for n in z.namelist() if n.startswith(stem) and n.endswith(".so") and (tag is None or n == f"{stem}{tag}.so")]
        if not names:
            sys.exit(f"{os.path.basename(wheel)} does not hold {stem}{tag or '*'}.so")
        return names[0], z.read(names[0])


def wheel(path, module):
    name, data = extension_of(path, module)
    needed = glibc_needed(data)
    print(f"{os.path.basename(path)}: {name}, needs glibc {'.'.join(map(str, needed))}")


def glibc(*wheels):
    have = version(machine_glibc_text())
    for path in wheels:
        module = os.path.basename(path).split("-")[0]
        _, data = extension_of(path, module, tag=None)
        needed = glibc_needed(data)
        if needed > have:
            sys.exit(f"{os.path.basename(path)} needs glibc {'.'.join(map(str, needed))}, and this machine has "
                     f"{'.'.join(map(str, have))}: build the wheels for an older glibc (scripts/gpu-test.sh build uses zig for that)")
    print(f"glibc {'.'.join(map(str, have))} is new enough for {len(wheels)} wheel(s)")


def requirements():
    missing = []
    for name in ("numpy", "torch", "cupy"):
        try:
            importlib.import_module(name)
        except Exception as e:  # ImportError, or a library that fails to load
            missing.append(f"{name} ({type(e).__name__}: {e})")
    if missing:
        sys.exit("missing: " + "; ".join(missing))
    import cupy
    import torch

    if not torch.cuda.is_available():
        sys.exit(f"torch {torch.__version__} sees no CUDA device (torch.cuda.is_available() is False)")
    if cupy.cuda.runtime.getDeviceCount() < 1:
        sys.exit("CuPy sees no CUDA device")
    print(f"torch {torch.__version__} with {torch.cuda.device_count()} CUDA device(s), CuPy {cupy.__version__}")
    for name in ("jax", "numba", "tvm_ffi", "pytest"):
        try:
            importlib.import_module(name)
        except Exception as e:
            extra = " unless dist-gpu/extras provides it" if name in ("tvm_ffi", "pytest") else ""
            print(f"  {name}: not importable here ({type(e).__name__}: {e}); the tests that need it fail{extra}")


def unpack(site, *wheels):
    """What `pip install --no-deps --target` does for these wheels: their files, with each
    `*.data/purelib` and `platlib` merged into SITE (scripts and headers are not needed)."""
    for path in wheels:
        with zipfile.ZipFile(path) as z:
            for member in z.infolist():
                parts = member.filename.split("/")
                if parts[0].endswith(".data"):
                    if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                        continue
                    parts = parts[2:]
                target = os.path.join(site, *parts)
                if member.is_dir():
                    os.makedirs(target, exist_ok=True)
                    continue
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with z.open(member) as source, open(target, "wb") as out:
                    out.write(source.read())
        print(f"unpacked {os.path.basename(path)} into {site}")


def installed(site):
    site = os.path.realpath(site)
    for name in ("dlbridge", "cuda_kernel"):
        module = importlib.import_module(name)
        where = os.path.realpath(module.__file__)
        if not where.startswith(site + os.sep):
            sys.exit(f"{name} comes from {module.__file__}, not from {site}")
        version_ = getattr(module, "__version__", None)
        print(f"{name}{' ' + version_ if version_ else ''} from {module.__file__}")
    for name in ("torch", "cupy", "jax", "numba", "numpy", "tvm_ffi", "pytest"):
        try:
            print(f"  {name} {getattr(importlib.import_module(name), '__version__', '?')}")
        except Exception as e:
            print(f"  {name}: not available ({type(e).__name__}: {e})")


def junit(path):
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as e:
        sys.exit(f"no JUnit XML from pytest: {e}")
    suites = [root] if root.tag == "testsuite" else list(root)
    count = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    print("JUnit: {tests} tests, {failures} failures, {errors} errors, {skipped} skipped".format(**count))
    if count["tests"] == 0:
        sys.exit("no test ran")
    if count["skipped"]:
        sys.exit(f"{count['skipped']} tests were skipped, which a GPU run does not allow")


if __name__ == "__main__":
    command, *args = sys.argv[1:] or ["?"]
    commands = {"interpreter": interpreter, "wheel": wheel, "glibc": glibc, "requirements": requirements,
                "unpack": unpack, "installed": installed, "junit": junit}
    commands.get(command, lambda *_: sys.exit(__doc__))(*args)
