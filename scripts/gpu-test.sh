#!/usr/bin/env bash
# The GPU tests of dlbridge, for a GPU machine that has no Rust toolchain (and perhaps no network):
# the wheel is built here, the tests run there.
#
#   scripts/gpu-test.sh build [OUTDIR]   here (./dev gpu-test): builds the release wheels of dlbridge and of
#                                        examples/cuda_kernel for CPython 3.12 on x86_64 Linux into OUTDIR
#                                        (default dist-gpu/ in the repository), with pytest's and
#                                        apache-tvm-ffi's wheels beside them in OUTDIR/extras
#   scripts/gpu-test.sh run [PYTEST ARGS] on the GPU machine, from the repository root, with dist-gpu/ there
#
# On the GPU machine, in a copy of the repository (dist-gpu/ included), the one command is:
#
#   bash scripts/gpu-test.sh run
#
# It uses that machine's own `python3` and its packages as they are: on the lent GPU machines python3
# is itself a venv holding torch, CuPy, JAX, numba-cuda and NumPy, and a venv made from it would see
# none of them, so none is made. It fails at once, before any test, when torch with a CUDA device,
# CuPy or NumPy is missing. It installs the dlbridge wheel with `pip install --no-deps --target` into
# a scratch folder (the example's wheel too, for test_cuda_kernel.py; pytest and tvm-ffi there too,
# from dist-gpu/extras, if the machine lacks them), checks that these are what Python imports, and runs `python3 -m pytest bindings/python/tests/gpu`
# with that folder first on PYTHONPATH and DLBRIDGE_REQUIRE_GPU=1, under which any skip fails the run
# (the JUnit XML is checked for skips too); then `benchmarks/bench_gpu.py`. No network is needed
# there. Results go to $OUT (the lent-GPU tool's folder), else gpu-results/: gpu-tests.xml (JUnit)
# and bench_gpu.json. Exit status: non-zero if anything is missing, any test failed or was skipped,
# or the benchmark failed. The checks themselves are scripts/gpu-check.py.
#
# With the lent-GPU tool: build here, then run `bash scripts/gpu-test.sh run` with carry ["dist-gpu"]
# (dist-gpu/ is git-ignored, so it travels only when carried).
#
# CI runs `run` too (bindings/python/tests/test_fake_driver.py), on a machine with no GPU: with the
# fake driver as libcuda.so.1 and stand-ins for torch and CuPy, against another suite and benchmark
# (DLBRIDGE_GPU_SUITE, DLBRIDGE_GPU_BENCH and DLBRIDGE_GPU_WHEELS exist for that test only).
#
# How a cp312 wheel is built without a Python 3.12 interpreter here: `maturin build --target
# x86_64-unknown-linux-gnu --interpreter python3.12`. With an explicit --target maturin treats the
# build as a cross build, and where no python3.12 runs it uses its bundled sysconfig for CPython 3.12
# on that target, writing a PyO3 config file (implementation=CPython, version=3.12, shared) that it
# passes to the build as PYO3_CONFIG_FILE. A real python3.12 on PATH is used instead if there is one;
# the result is the same. The --target also keeps the build in $CARGO_TARGET_DIR/x86_64-unknown-linux-gnu,
# apart from ./dev's own builds, which it therefore never invalidates. After the build this script
# checks the wheel's tag (cp312-cp312, x86_64) and that it holds
# dlbridge/_native.cpython-312-x86_64-linux-gnu.so. The wheel's manylinux tag follows this machine's
# glibc; the GPU machine's glibc must be at least as new (pip says "not a supported wheel" otherwise).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${DLBRIDGE_CACHE:-$HOME/.cache/dlbridge}"
VENV="$CACHE/venv"
TARGET=x86_64-unknown-linux-gnu
SO=dlbridge/_native.cpython-312-x86_64-linux-gnu.so

log() { printf '==> %s\n' "$*" >&2; }
die() { printf 'gpu-test: %s\n' "$*" >&2; exit 1; }

usage() {
    echo "usage: $0 build [OUTDIR]    (here, with Rust: the cp312 wheel into OUTDIR, default dist-gpu/)" >&2
    echo "       $0 run [PYTEST ARGS] (on the GPU machine, from the repository root)" >&2
    exit 2
}

build() {
    local out="${1:-$ROOT/dist-gpu}"
    [[ -x "$VENV/bin/maturin" ]] || die "no maturin in $VENV; run ./dev venv first"
    mkdir -p "$out"
    out="$(cd "$out" && pwd)"
    export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE/target}"
    rm -f "$out"/dlbridge-*.whl "$out"/cuda_kernel-*.whl

    local crate
    for crate in bindings/python examples/cuda_kernel; do
        log "maturin build --release --target $TARGET --interpreter python3.12 in $crate (into $out)"
        (cd "$ROOT/$crate" && VIRTUAL_ENV="$VENV" PATH="$VENV/bin:$PATH" \
            "$VENV/bin/maturin" build --release --target "$TARGET" --interpreter python3.12 --out "$out")
    done

    shopt -s nullglob
    local wheels=("$out"/dlbridge-*-cp312-cp312-*x86_64.whl)
    shopt -u nullglob
    [[ ${#wheels[@]} -eq 1 ]] || die "expected one cp312 x86_64 wheel in $out, found: $(ls "$out")"
    local wheel="${wheels[0]}"
    "$VENV/bin/python" -m zipfile -l "$wheel" | grep -q "^$SO " \
        || die "$(basename "$wheel") does not hold $SO"
    log "built $(basename "$wheel"), holding $SO"
    ls "$out"/cuda_kernel-*-cp312-cp312-*x86_64.whl >/dev/null 2>&1 || die "no cp312 x86_64 wheel of examples/cuda_kernel in $out"

    # pytest (pure Python) and tvm-ffi (for the benchmark's comparison), for a GPU machine without
    # them and without network; installed there only if missing. Best effort: a failure here only
    # means the GPU machine must have them already.
    local tvm
    tvm="$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("apache-tvm-ffi"))' 2>/dev/null || true)"
    rm -rf "$out/extras"
    log "downloading pytest${tvm:+ and apache-tvm-ffi==$tvm} wheels for CPython 3.12 into $out/extras"
    if ! "$VENV/bin/python" -m pip download --quiet --disable-pip-version-check --only-binary=:all: \
        --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
        --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any \
        -d "$out/extras" pytest ${tvm:+"apache-tvm-ffi==$tvm"}; then
        log "could not download them (offline?): the GPU machine must have pytest itself"
        rm -rf "$out/extras"
    fi
    log "done: $(du -sh "$out" | cut -f1) in $out. On the GPU machine, from the repository root: bash scripts/gpu-test.sh run"
}

run() {
    local wheels_dir="${DLBRIDGE_GPU_WHEELS:-dist-gpu}"
    local suite="${DLBRIDGE_GPU_SUITE:-bindings/python/tests/gpu}"
    local bench="${DLBRIDGE_GPU_BENCH:-benchmarks/bench_gpu.py}"
    local py=python3  # this machine's own interpreter: never a venv made from it
    [[ -f bindings/python/tests/gpu/conftest.py ]] || die "run this from the repository root"
    shopt -s nullglob
    local wheels=("$wheels_dir"/dlbridge-*.whl)
    shopt -u nullglob
    [[ ${#wheels[@]} -eq 1 ]] || die "expected one dlbridge wheel in $wheels_dir/ (build it with scripts/gpu-test.sh build), found ${#wheels[@]}"
    local out="${OUT:-$PWD/gpu-results}"
    mkdir -p "$out"

    log "$("$py" --version 2>&1) at $(command -v "$py") (sys.prefix $("$py" -c 'import sys; print(sys.prefix)')); glibc $(ldd --version 2>/dev/null | head -1 | awk '{print $NF}')"
    if command -v nvidia-smi >/dev/null; then nvidia-smi -L || true; fi
    log "checking for torch with a CUDA device, CuPy and NumPy"
    "$py" "$ROOT/scripts/gpu-check.py" requirements || die "the GPU suite cannot run on this machine (see above): nothing was tested"

    local site
    site="$(mktemp -d "${TMPDIR:-/tmp}/dlbridge-gpu-site.XXXXXX")"
    export PIP_DISABLE_PIP_VERSION_CHECK=1
    log "pip install --no-deps --target $site $(basename "${wheels[0]}")"
    "$py" -m pip install --quiet --no-deps --no-index --target "$site" "${wheels[0]}" \
        || die "pip refused the wheel: the GPU machine needs CPython 3.12 on x86_64 with a glibc at least as new as the wheel's manylinux tag"
    local module package
    for module in pytest:pytest tvm_ffi:apache-tvm-ffi; do
        package="${module#*:}"; module="${module%%:*}"
        if ! "$py" -c "import $module" >/dev/null 2>&1 && [[ -d "$wheels_dir/extras" ]]; then
            log "installing $package from $wheels_dir/extras into $site"
            "$py" -m pip install --quiet --no-index --find-links "$wheels_dir/extras" --target "$site" "$package" \
                || log "could not install $package from $wheels_dir/extras"
        fi
    done
    # The example the GPU suite launches kernels from (test_cuda_kernel.py fails without it).
    shopt -s nullglob
    local example=("$wheels_dir"/cuda_kernel-*.whl)
    shopt -u nullglob
    if [[ ${#example[@]} -eq 1 ]]; then
        log "pip install --no-deps --target $site $(basename "${example[0]}")"
        "$py" -m pip install --quiet --no-deps --no-index --target "$site" "${example[0]}" || die "pip refused $(basename "${example[0]}")"
    else
        log "no cuda_kernel wheel in $wheels_dir/ (scripts/gpu-test.sh build makes it): test_cuda_kernel.py will fail"
    fi
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" DLBRIDGE_REQUIRE_GPU=1
    "$py" "$ROOT/scripts/gpu-check.py" installed "$site" || die "Python does not import the dlbridge just installed"
    if [[ ${#example[@]} -eq 1 ]]; then
        "$py" -c 'import os, sys, cuda_kernel; f = os.path.realpath(cuda_kernel.__file__); print(f"cuda_kernel from {f}"); sys.exit(0 if f.startswith(os.path.realpath(sys.argv[1]) + os.sep) else 1)' "$site" \
            || die "Python does not import the cuda_kernel just installed"
    fi

    local status=0
    log "python3 -m pytest $suite $* (DLBRIDGE_REQUIRE_GPU=1: a skip is a failure)"
    "$py" -m pytest -q -rs -p no:cacheprovider --junitxml "$out/gpu-tests.xml" "$suite" "$@" || status=1
    "$py" "$ROOT/scripts/gpu-check.py" junit "$out/gpu-tests.xml" || status=1
    log "python3 $bench"
    "$py" "$bench" --json "$out/bench_gpu.json" || status=1
    if [[ $status -ne 0 ]]; then log "FAILED (see above)"; else log "GPU tests and benchmark passed; results in $out"; fi
    return $status
}

cmd="${1:-}"; shift || true
case "$cmd" in
    build) [[ $# -le 1 ]] || usage; build "$@" ;;
    run) run "$@" ;;
    *) usage ;;
esac
