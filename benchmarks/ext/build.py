"""Builds the extensions that `./dev bench` times, and says which ones it could not build.

    python benchmarks/ext/build.py OUT_DIR      # run by ./dev bench with the venv's python

- dlbridge_ext (dlbridge-pyo3) and numpy_ext (rust-numpy): `maturin develop --release` into the
  running venv; cargo rebuilds only what changed. A failure here is an error.
- nanobind_ext.cpp: g++ with the recipe in nanobind's own src/nb_combined.cpp (no CMake):
  libnanobind at -O3, the module at -Os, linked with --gc-sections.
- tvm_ffi_ext.cc: g++ against the headers and libtvm_ffi.so that the apache-tvm-ffi wheel ships,
  with the flags of tvm_ffi.cpp.build (-std=c++17 -O2).

The C++ outputs go to OUT_DIR and are rebuilt only when their key (source, flags, compiler,
peer and Python versions) changes. A C++ peer that cannot be built is recorded with the reason,
which the bench prints. OUT_DIR/manifest.json maps each peer to {"module"|"path"} or {"error"}.
"""

import hashlib
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

HERE = Path(__file__).resolve().parent
CXX = os.environ.get("CXX", "g++")


def log(text):
    print(f"==> {text}", file=sys.stderr, flush=True)


def run(cmd, cwd=None, env=None):
    """Runs cmd; raises RuntimeError with the tail of its output when it fails."""
    proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.strip().splitlines()[-15:])
        raise RuntimeError(f"`{' '.join(map(str, cmd[:3]))} ...` exited {proc.returncode}:\n{tail}")


def compiler_version():
    try:
        return subprocess.run([CXX, "--version"], stdout=subprocess.PIPE, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as err:
        raise RuntimeError(f"no C++ compiler ({CXX}): {err}; install g++ (Debian: apt-get install g++)") from err


def cached(out, key, build):
    """Calls build(out) unless out exists with the same key beside it."""
    stamp = out.with_name(out.name + ".key")
    if out.exists() and stamp.exists() and stamp.read_text() == key:
        return out
    log(f"building {out.name}")
    out.unlink(missing_ok=True)
    build(out)
    stamp.write_text(key)
    return out


def key_of(*parts):
    h = hashlib.sha256()
    for part in parts:
        h.update(part if isinstance(part, bytes) else str(part).encode())
        h.update(b"\0")
    return h.hexdigest()


def build_rust(crate):
    env = dict(os.environ, VIRTUAL_ENV=sys.prefix, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    run([str(Path(sys.executable).parent / "maturin"), "develop", "--release", "--quiet"], cwd=HERE / crate, env=env)


def python_flags():
    return [f"-I{sysconfig.get_paths()['include']}", "-fPIC", "-std=c++17", "-fvisibility=hidden", "-DNDEBUG"]


def build_nanobind(out_dir):
    import nanobind

    nb_dir = Path(nanobind.__file__).parent
    flags = python_flags() + ["-DNB_COMPACT_ASSERTIONS", f"-I{nb_dir / 'include'}",
                              f"-I{nb_dir / 'ext' / 'robin_map' / 'include'}", "-fno-stack-protector"]
    base = key_of(compiler_version(), nanobind.__version__, sys.version, *flags)
    lib_flags = ["-O3", "-fno-strict-aliasing", "-ffunction-sections", "-fdata-sections"]
    lib = cached(out_dir / "libnanobind.o", key_of(base, *lib_flags),
                 lambda o: run([CXX, str(nb_dir / "src" / "nb_combined.cpp"), *flags, *lib_flags, "-c", "-o", str(o)]))
    source = HERE / "nanobind_ext.cpp"
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    out = out_dir / f"nanobind_bench_ext{suffix}"
    cached(out, key_of(base, source.read_bytes(), lib.with_name(lib.name + ".key").read_text()),
           lambda o: run([CXX, str(source), *flags, "-Os", "-shared", "-Wl,-s", "-Wl,--gc-sections", str(lib),
                          "-o", str(o)]))
    return out


def build_tvm_ffi(out_dir):
    import tvm_ffi
    from tvm_ffi import libinfo

    lib = Path(libinfo.find_libtvm_ffi())
    flags = ["-std=c++17", "-fPIC", "-O2", "-DNDEBUG", *(f"-I{p}" for p in libinfo.include_paths())]
    ldflags = ["-shared", f"-L{lib.parent}", "-ltvm_ffi", f"-Wl,-rpath,{lib.parent}"]
    source = HERE / "tvm_ffi_ext.cc"
    out = out_dir / "tvm_ffi_bench_ext.so"
    return cached(out, key_of(compiler_version(), tvm_ffi.__version__, source.read_bytes(), *flags, *ldflags),
                  lambda o: run([CXX, str(source), *flags, *ldflags, "-o", str(o)]))


def main():
    out_dir = Path(sys.argv[1]).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest = {}
    for name, crate, module in [("dlbridge-pyo3", "dlbridge_ext", "dlbridge_bench_ext"),
                                ("rust-numpy", "numpy_ext", "numpy_bench_ext")]:
        log(f"building benchmarks/ext/{crate} (maturin develop --release)")
        build_rust(crate)
        manifest[name] = {"module": module}
    for name, build in [("nanobind", build_nanobind), ("tvm-ffi", build_tvm_ffi)]:
        try:
            manifest[name] = {"path": str(build(out_dir))}
        except (RuntimeError, ImportError, OSError) as err:
            log(f"could not build the {name} extension: {err}")
            manifest[name] = {"error": str(err)}
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2))


if __name__ == "__main__":
    main()
