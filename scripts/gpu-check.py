"""The checks of `scripts/gpu-test.sh run`, each exiting non-zero with the reason:

    gpu-check.py requirements    torch with a CUDA device, CuPy and NumPy import on this python3
    gpu-check.py installed SITE  dlbridge is imported from SITE (the wheel just installed); prints versions
    gpu-check.py junit XML       the JUnit XML of the run holds tests, and none was skipped
"""

import importlib
import os
import sys
import xml.etree.ElementTree as ET


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


def installed(site):
    import dlbridge

    site = os.path.realpath(site)
    if not os.path.realpath(dlbridge.__file__).startswith(site + os.sep):
        sys.exit(f"dlbridge comes from {dlbridge.__file__}, not from {site}")
    print(f"dlbridge {dlbridge.__version__} from {dlbridge.__file__}")
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
    {"requirements": requirements, "installed": installed, "junit": junit}.get(command, lambda *_: sys.exit(__doc__))(*args)
