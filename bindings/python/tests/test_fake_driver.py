"""The CUDA layer without a GPU, against tests/fake-cuda (a driver with a timeline, loaded as
`libcuda.so.1`; `./dev py-test` builds it and names it in DLBRIDGE_FAKE_CUDA):

- tests/fake_driver, run in a child process with the fake on LD_LIBRARY_PATH;
- how the driver is found and initialised: the driver's soname before a toolkit stub, and cuInit
  failures reported as such;
- scripts/gpu-test.sh, run as on the GPU machine, with the fake standing in for the GPU and
  stand-ins for torch and CuPy: it must pass there, with pip and without it (the wheels unpacked),
  and fail loudly, before any test, when torch or CuPy is missing, the glibc is older than the
  wheel needs, or the wheels are missing, and after the tests when one skips; the reader of the
  wheels' glibc needs agrees with readelf; and the GPU suite itself under DLBRIDGE_REQUIRE_GPU=1,
  where a skip fails."""

import base64
import hashlib
import importlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

import dlbridge

HERE = Path(__file__).parent
ROOT = HERE.parents[2]


@pytest.fixture
def fake():
    path = os.environ.get("DLBRIDGE_FAKE_CUDA")
    if not path:
        pytest.skip("DLBRIDGE_FAKE_CUDA is not set: run through ./dev py-test, which builds tests/fake-cuda")
    assert Path(path).is_file(), f"DLBRIDGE_FAKE_CUDA names {path}, which does not exist"
    return Path(path)


def with_driver(tmp_path, fake, **env):
    """An environment whose libcuda.so.1 is the fake."""
    lib = tmp_path / "lib"
    lib.mkdir(exist_ok=True)
    (lib / "libcuda.so.1").symlink_to(fake)
    return {**os.environ, "LD_LIBRARY_PATH": f"{lib}:{os.environ.get('LD_LIBRARY_PATH', '')}", **env}


def test_the_cuda_layer_against_a_fake_driver(tmp_path, fake):
    env = with_driver(tmp_path, fake, DLBRIDGE_FAKE_DRIVER_CHILD="1")
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(HERE / "fake_driver")],
                            capture_output=True, text=True, env=env, timeout=900)
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-2000:]
    lines = result.stdout.splitlines()
    # No test may skip, but for those that call the `testing` hooks in a run against a release wheel (conftest.py).
    skips = [line for line in lines if line.startswith("SKIPPED") and "`testing` feature's hooks" not in line]
    assert " passed" in lines[-1] and not skips, result.stdout[-2000:]


PROBE = "import dlbridge, numpy as np; t = dlbridge.from_dlpack(np.arange(3.0), device=(2, 0)); " \
        "print(dlbridge.from_dlpack(t, device='cpu').tolist())"


def probe(env):
    return subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=120)


def test_the_drivers_soname_is_found_before_a_toolkit_stub(tmp_path, fake):
    """L3: a toolkit's stubs/libcuda.so on the library path (its cuInit says 34) must not hide the
    driver: libcuda.so.1 is opened first."""
    env = with_driver(tmp_path, fake)
    stub = tmp_path / "lib" / "libcuda.so"
    shutil.copy(fake, stub)  # a copy, so that the loader takes it for another library
    env["FAKE_CUDA_STUB"] = str(stub)
    result = probe(env)
    assert result.returncode == 0 and "[0.0, 1.0, 2.0]" in result.stdout, result.stdout + result.stderr


def test_a_stub_alone_says_it_is_a_stub(tmp_path, fake):
    stub = tmp_path / "libcuda.so"
    shutil.copy(fake, stub)
    env = {**os.environ, "LD_LIBRARY_PATH": f"{tmp_path}:{os.environ.get('LD_LIBRARY_PATH', '')}", "FAKE_CUDA_STUB": str(stub)}
    result = probe(env)
    assert result.returncode != 0
    assert "CUDA is not available: libcuda.so is the toolkit's stub" in result.stderr, result.stderr


@pytest.mark.parametrize("code, name", [(100, "CUDA_ERROR_NO_DEVICE"), (999, "CUDA_ERROR_UNKNOWN"),
                                        (46, "CUDA_ERROR_DEVICE_UNAVAILABLE"), (803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"), (12345, None)])
def test_a_failing_cuinit_is_reported(tmp_path, fake, code, name):
    result = probe(with_driver(tmp_path, fake, FAKE_CUDA_INIT_RESULT=str(code)))
    assert result.returncode != 0
    assert f"CUDA is not available: cuInit failed with CUresult {code}" in result.stderr, result.stderr
    assert name is None or name in result.stderr


# --- scripts/gpu-test.sh, with the fake standing in for the GPU ----------------------------------


def dev_wheel(out, module=dlbridge):
    """A wheel of the package this suite runs (dlbridge's development build, or an example's), tagged
    for this interpreter."""
    package = Path(module.__file__).parent
    dist = module.__name__
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    info = f"{dist}-0.1.0.dist-info"
    files = {f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1.0\n".encode(),
             f"{info}/WHEEL": f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: {tag}-{tag}-linux_x86_64\n".encode()}
    for path in package.rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts:
            files[f"{dist}/{path.relative_to(package)}"] = path.read_bytes()
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    files[f"{info}/RECORD"] = ("\n".join(record + [f"{info}/RECORD,,"]) + "\n").encode()
    out.mkdir(parents=True, exist_ok=True)
    wheel = out / f"{dist}-0.1.0-{tag}-{tag}-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return wheel


STAND_INS = {
    "torch": "__version__ = '2.11.0+stand-in'\nclass cuda:\n    is_available = staticmethod(lambda: True)\n"
             "    device_count = staticmethod(lambda: 1)\n",
    "cupy": "__version__ = '14.0.0+stand-in'\nclass cuda:\n    class runtime:\n        getDeviceCount = staticmethod(lambda: 1)\n",
}

BENCH = """
import json, os, sys
assert os.path.exists(os.path.join(os.environ["OUT"], "gpu-tests.xml")), "the benchmark ran before the tests"
json.dump({"rows": []}, open(sys.argv[sys.argv.index("--json") + 1], "w"))
print("stand-in benchmark ran")
"""


# A `pip` that cannot be imported: `python3 -m pip` fails as on an interpreter without pip.
NO_PIP = "raise ImportError('No module named pip (a stand-in for an interpreter without it)')\n"


def gpu_machine(tmp_path, fake, stand_ins=STAND_INS, suite=None):
    """A stand-in for the GPU machine: `python3` is this venv's interpreter (itself a venv, as
    there), libcuda.so.1 the fake, torch and CuPy stand-ins that say a GPU is there; the suite run
    is tests/fake_driver (or `suite`), the benchmark a stand-in. A `pip` entry in `stand_ins`
    replaces pip."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    python3 = bin_ / "python3"  # a script, not a link: a venv's interpreter finds its venv by its own path
    python3.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python3.chmod(0o755)
    modules = tmp_path / "stand-ins"
    for name, source in stand_ins.items():
        (modules / name).mkdir(parents=True)
        (modules / name / "__init__.py").write_text(source)
    dev_wheel(tmp_path / "dist")
    dev_wheel(tmp_path / "dist", importlib.import_module("cuda_kernel"))
    (tmp_path / "bench.py").write_text(BENCH)
    (tmp_path / "out").mkdir()
    return with_driver(
        tmp_path, fake, PATH=f"{bin_}:{os.environ['PATH']}", PYTHONPATH=str(modules), OUT=str(tmp_path / "out"),
        DLBRIDGE_GPU_WHEELS=str(tmp_path / "dist"), DLBRIDGE_GPU_BENCH=str(tmp_path / "bench.py"),
        DLBRIDGE_GPU_SUITE=str(suite or HERE / "fake_driver"), DLBRIDGE_FAKE_DRIVER_CHILD="1", TMPDIR=str(tmp_path))


def gpu_test(env, *pytest_args):
    """Runs the script; its output (stdout and stderr, which it sends to one log) in `.output`."""
    result = subprocess.run(["bash", str(ROOT / "scripts" / "gpu-test.sh"), "run", *pytest_args], cwd=ROOT,
                            capture_output=True, text=True, env=env, timeout=600)
    result.output = result.stdout + result.stderr
    return result


def test_the_gpu_script_runs_the_suite_then_the_benchmark(tmp_path, fake):
    env = gpu_machine(tmp_path, fake)
    result = gpu_test(env, "-k", "test_host_to_device_and_back and float32 or a_host_to_device_copy_is_ready "
                                 "or dunder_dlpack_producers_tensor_is_launched")
    output = result.output
    assert result.returncode == 0, output[-6000:]
    assert f"from {tmp_path}/dlbridge-gpu-site" in output, "the wheel installed with --target is the dlbridge imported"
    assert re.search(rf"cuda_kernel from {tmp_path}/dlbridge-gpu-site\S*/cuda_kernel/", output), "the example's wheel is imported"
    assert "JUnit: 8 tests, 0 failures, 0 errors, 0 skipped" in output, output[-3000:]
    assert "stand-in benchmark ran" in output and (tmp_path / "out" / "bench_gpu.json").is_file()
    assert not list(tmp_path.rglob("pyvenv.cfg")), "a venv was made"
    assert "GPU tests and benchmark passed" in (tmp_path / "out" / "run.log").read_text(), "the log is kept in $OUT"


def test_the_gpu_script_unpacks_the_wheels_where_python3_has_no_pip(tmp_path, fake):
    """C12: a venv made by uv has no pip; the wheels are then unpacked, and the same run follows."""
    env = gpu_machine(tmp_path, fake, stand_ins={**STAND_INS, "pip": NO_PIP})
    result = gpu_test(env, "-k", "a_host_to_device_copy_is_ready or dunder_dlpack_producers_tensor_is_launched")
    output = result.output
    assert result.returncode == 0, output[-6000:]
    assert "python3 has no pip: unpacking the wheels" in output, output[-3000:]
    assert f"from {tmp_path}/dlbridge-gpu-site" in output and "JUnit: 2 tests, 0 failures" in output, output[-3000:]


def test_the_gpu_script_refuses_wheels_that_need_a_newer_glibc_before_any_test(tmp_path, fake):
    """C9: a wheel linked against a newer glibc than the machine's cannot load there; the run says
    so, naming both versions, before installing anything."""
    env = {**gpu_machine(tmp_path, fake), "DLBRIDGE_GPU_GLIBC": "2.17"}
    result = gpu_test(env)
    assert result.returncode != 0
    assert re.search(r"needs glibc 2\.\d+, and this machine has 2\.17", result.output), result.output[-3000:]
    assert "nothing was tested" in result.output and not (tmp_path / "out" / "gpu-tests.xml").exists()


def test_the_gpu_script_says_when_the_wheels_are_missing(tmp_path, fake):
    env = gpu_machine(tmp_path, fake)
    for wheel in (tmp_path / "dist").glob("*.whl"):
        wheel.unlink()
    result = gpu_test(env)
    assert result.returncode != 0
    assert "expected one dlbridge and one cuda_kernel wheel" in result.output and "gpu-test.sh build" in result.output, result.output


def test_the_glibc_reader_agrees_with_readelf():
    """scripts/gpu-check.py reads the newest GLIBC_x.y version an extension needs from its ELF file
    (the GPU machine has no binutils); here readelf checks it on dlbridge's own extension."""
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("no readelf here to compare with")
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu-check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    native = Path(dlbridge._native.__file__)
    listing = subprocess.run([readelf, "-V", str(native)], capture_output=True, text=True, check=True).stdout
    newest = max(tuple(int(p) for p in v.split(".")) for v in re.findall(r"GLIBC_(\d+(?:\.\d+)+)", listing))
    assert gpu_check.glibc_needed(native.read_bytes()) == newest
    with pytest.raises(ValueError):
        gpu_check.glibc_needed(b"not an ELF file")


@pytest.mark.parametrize("broken, message", [
    ({"torch": "raise ImportError('No module named torch')"}, "missing: torch (ImportError"),
    ({"cupy": "raise ImportError('No module named cupy')"}, "missing: cupy (ImportError"),
    ({"torch": STAND_INS["torch"].replace("lambda: True", "lambda: False")}, "sees no CUDA device"),
], ids=["no torch", "no CuPy", "torch without CUDA"])
def test_the_gpu_script_fails_loudly_without_its_libraries(tmp_path, fake, broken, message):
    env = gpu_machine(tmp_path, fake, stand_ins={**STAND_INS, **broken})
    result = gpu_test(env)
    assert result.returncode != 0
    assert message in result.output and "nothing was tested" in result.output, result.output[-3000:]
    assert not (tmp_path / "out" / "gpu-tests.xml").exists(), "tests ran anyway"


def test_the_gpu_script_fails_when_a_test_skips(tmp_path, fake):
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_one.py").write_text(textwrap.dedent("""
        import pytest

        def test_runs():
            pass

        def test_skips():
            pytest.skip("no GPU library here")
    """))
    result = gpu_test(gpu_machine(tmp_path, fake, suite=suite))
    assert result.returncode != 0
    assert "1 tests were skipped, which a GPU run does not allow" in result.output


def test_the_gpu_suite_fails_instead_of_skipping_when_a_gpu_is_required():
    """On this machine (no GPU): skipped without DLBRIDGE_REQUIRE_GPU, failed with it."""
    suite = str(HERE / "gpu")
    base = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", suite]
    plain = subprocess.run(base, capture_output=True, text=True, timeout=600, env={**os.environ, "DLBRIDGE_REQUIRE_GPU": "0"})
    assert plain.returncode == 0 and " skipped" in plain.stdout.splitlines()[-1], plain.stdout[-2000:]
    required = subprocess.run(base, capture_output=True, text=True, timeout=600, env={**os.environ, "DLBRIDGE_REQUIRE_GPU": "1"})
    assert required.returncode != 0, required.stdout[-2000:]
    assert "DLBRIDGE_REQUIRE_GPU=1 forbids skipping" in required.stdout, required.stdout[-3000:]
    assert "passed" not in required.stdout.splitlines()[-1], required.stdout[-500:]
