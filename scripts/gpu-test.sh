#!/usr/bin/env bash
# The GPU tests of dlbridge, for a GPU machine that has no Rust toolchain and no network: everything
# is built here, and the run there is one command.
#
#   bash scripts/gpu-test.sh build [OUTDIR]    here (./dev gpu-test): dist-gpu/ (or OUTDIR)
#   bash scripts/gpu-test.sh run [PYTEST ARGS] there, from the repository root, with dist-gpu/ beside it
#
# build: the release wheels of dlbridge and of examples/cuda_kernel for CPython 3.12 on x86_64 Linux,
# linked with zig for glibc 2.17 (manylinux2014, as the release wheels), with the tools of ./dev
# release ($DLBRIDGE_CACHE/release-venv: maturin and ziglang, no torch); each wheel is checked for its
# extension and the glibc its symbols need (scripts/gpu-check.py reads the ELF file, no pipes); then
# the wheels of requirements/gpu-extras.txt (pytest, apache-tvm-ffi) for CPython 3.12 go to
# OUTDIR/extras, for a machine that lacks them. A build that cannot do any of this fails, saying why.
#
# run: uses the machine's own `python3` and its packages as they are (on the lent GPU machines that is
# a venv holding torch, CuPy, JAX, numba-cuda and NumPy; a venv made from it would see none of them).
# Before the first test, each failure stops the run and names its cause: no python3, a python3 that
# is not CPython 3.12 on x86_64, no wheels, a glibc older than the wheels need, torch without a CUDA
# device, CuPy or NumPy missing, an install that Python does not then import. The wheels are
# installed into a scratch folder with `pip install --no-deps --no-index --target`, or, where python3
# has no pip (a venv made by uv), unpacked there by scripts/gpu-check.py; pytest and tvm-ffi too, from
# dist-gpu/extras, if python3 lacks them. Then `python3 -m pytest bindings/python/tests/gpu` with that
# folder first on PYTHONPATH and DLBRIDGE_REQUIRE_GPU=1 (a skip fails the run; the JUnit XML is
# checked for skips too), and `benchmarks/bench_gpu.py`. The whole run stops after
# DLBRIDGE_GPU_BUDGET seconds (default 420, inside the lent machine's 8 minutes): the tests get what
# is left less 100 s for the benchmark, and a test stuck for 150 s dumps every thread's stack.
# Results go to $OUT (the lent-GPU tool's folder), else gpu-results/: run.log, gpu-tests.xml (JUnit,
# with each test's printed output) and bench_gpu.json. Exit status: non-zero if anything is missing,
# any test failed or was skipped, the benchmark failed, or the time ran out.
#
# With the lent-GPU tool: build here, then run `bash scripts/gpu-test.sh run` there with carry
# ["dist-gpu"] (dist-gpu/ is git-ignored, so it travels only when carried) and timeout_s 480.
#
# CI runs `run` (bindings/python/tests/test_fake_driver.py) with the fake driver as libcuda.so.1 and
# stand-ins for torch and CuPy, against another suite and benchmark: with pip, without pip, and with
# a glibc said to be older than the wheel needs. DLBRIDGE_GPU_SUITE, DLBRIDGE_GPU_BENCH,
# DLBRIDGE_GPU_WHEELS and DLBRIDGE_GPU_GLIBC exist for those tests only.
#
# How a cp312 wheel is built without a Python 3.12 interpreter here: `maturin build --target
# x86_64-unknown-linux-gnu --interpreter python3.12` is a cross build for maturin, which uses its
# bundled sysconfig for CPython 3.12 when no python3.12 runs (a real one on PATH gives the same
# result). The builds use $DLBRIDGE_CACHE/gpu-target, apart from ./dev's own, which they never
# invalidate.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${DLBRIDGE_CACHE:-$HOME/.cache/dlbridge}"
TOOLS="$CACHE/release-venv"
TARGET=x86_64-unknown-linux-gnu
STARTED=$SECONDS

log() { printf '==> [%ss] %s\n' "$((SECONDS - STARTED))" "$*" >&2; }
die() { printf 'gpu-test: %s\n' "$*" >&2; exit 1; }

usage() {
    echo "usage: $0 build [OUTDIR]    (here, with Rust: the cp312 wheels into OUTDIR, default dist-gpu/)" >&2
    echo "       $0 run [PYTEST ARGS] (on the GPU machine, from the repository root)" >&2
    exit 2
}

# The tools of ./dev release, in a venv of their own (made once per requirements/release.txt).
ensure_tools() {
    local reqs="$ROOT/requirements/release.txt" stamp="$TOOLS/.dlbridge-complete" want
    want="$(sha256sum "$reqs" | cut -d' ' -f1)"
    if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" && -x "$TOOLS/bin/maturin" ]]; then return; fi
    log "creating $TOOLS from requirements/release.txt (maturin, ziglang; no torch)"
    rm -rf "$TOOLS"
    "${PYTHON:-python3}" -m venv "$TOOLS" || die "could not make a venv with ${PYTHON:-python3}"
    "$TOOLS/bin/python" -m pip install --quiet --upgrade pip || die "pip could not be upgraded in $TOOLS (offline?)"
    "$TOOLS/bin/python" -m pip install --quiet -r "$reqs" || die "the tools of requirements/release.txt could not be installed (offline?)"
    echo "$want" > "$stamp"
}

build() {
    local out="${1:-$ROOT/dist-gpu}"
    command -v cargo >/dev/null || die "no cargo here: the wheels are built where Rust is installed"
    ensure_tools
    mkdir -p "$out"
    out="$(cd "$out" && pwd)"
    rm -rf "$out"/dlbridge-*.whl "$out"/cuda_kernel-*.whl "$out/extras" "$out/MANIFEST"
    local crate
    for crate in bindings/python examples/cuda_kernel; do
        log "maturin build --release --zig --compatibility manylinux2014 --target $TARGET -i python3.12 in $crate"
        (cd "$ROOT/$crate" && PATH="$TOOLS/bin:$PATH" CARGO_TARGET_DIR="$CACHE/gpu-target" \
            "$TOOLS/bin/maturin" build --release --quiet --zig --compatibility manylinux2014 --target "$TARGET" \
            --interpreter python3.12 --out "$out") || die "maturin could not build $crate"
    done
    shopt -s nullglob
    local dl=("$out"/dlbridge-*-cp312-cp312-*x86_64.whl) ex=("$out"/cuda_kernel-*-cp312-cp312-*x86_64.whl)
    shopt -u nullglob
    [[ ${#dl[@]} -eq 1 && ${#ex[@]} -eq 1 ]] || die "expected one cp312 x86_64 wheel of dlbridge and one of cuda_kernel in $out, found: $(ls "$out")"
    "$TOOLS/bin/python" "$ROOT/scripts/gpu-check.py" wheel "${dl[0]}" dlbridge | tee "$out/MANIFEST"
    "$TOOLS/bin/python" "$ROOT/scripts/gpu-check.py" wheel "${ex[0]}" cuda_kernel | tee -a "$out/MANIFEST"
    DLBRIDGE_GPU_GLIBC=2.17 "$TOOLS/bin/python" "$ROOT/scripts/gpu-check.py" glibc "${dl[0]}" "${ex[0]}" >/dev/null \
        || die "the wheels need a glibc newer than 2.17 (manylinux2014): the zig link did not take"
    log "downloading requirements/gpu-extras.txt for CPython 3.12 into $out/extras"
    "$TOOLS/bin/python" -m pip download --quiet --disable-pip-version-check --only-binary=:all: \
        --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
        -d "$out/extras" -r "$ROOT/requirements/gpu-extras.txt" \
        || die "could not download requirements/gpu-extras.txt (offline?): the GPU machine has no network to get them"
    echo "source $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$ROOT" diff --quiet 2>/dev/null || echo ' (with uncommitted changes)'), built $(date -u +%FT%TZ)" >> "$out/MANIFEST"
    log "done: $(du -sh "$out" | cut -f1) in $out. There, from the repository root: bash scripts/gpu-test.sh run"
}

# Seconds left of the run's budget.
left() { echo $((BUDGET - (SECONDS - STARTED))); }

run() {
    BUDGET="${DLBRIDGE_GPU_BUDGET:-420}"
    local wheels_dir="${DLBRIDGE_GPU_WHEELS:-dist-gpu}"
    local suite="${DLBRIDGE_GPU_SUITE:-bindings/python/tests/gpu}"
    local bench="${DLBRIDGE_GPU_BENCH:-benchmarks/bench_gpu.py}"
    local out="${OUT:-$PWD/gpu-results}"
    [[ -f bindings/python/tests/gpu/conftest.py ]] || die "run this from the repository root (bindings/python/tests/gpu is not here): nothing was tested"
    mkdir -p "$out"
    exec > >(tee -a "$out/run.log") 2>&1
    command -v python3 >/dev/null || die "no python3 on PATH: nothing was tested"
    local py=python3  # this machine's own interpreter: never a venv made from it
    shopt -s nullglob
    local dl=("$wheels_dir"/dlbridge-*.whl) ex=("$wheels_dir"/cuda_kernel-*.whl)
    shopt -u nullglob
    [[ ${#dl[@]} -eq 1 && ${#ex[@]} -eq 1 ]] \
        || die "expected one dlbridge and one cuda_kernel wheel in $wheels_dir/, found ${#dl[@]} and ${#ex[@]}: build them with 'bash scripts/gpu-test.sh build' and carry dist-gpu; nothing was tested"
    "$py" "$ROOT/scripts/gpu-check.py" interpreter "${dl[0]}" || die "the wrong interpreter (see above): nothing was tested"
    [[ -f "$wheels_dir/MANIFEST" ]] && cat "$wheels_dir/MANIFEST"
    "$py" "$ROOT/scripts/gpu-check.py" glibc "${dl[0]}" "${ex[0]}" || die "the wheels cannot load here (see above): nothing was tested"
    if command -v nvidia-smi >/dev/null; then nvidia-smi -L || true; fi
    log "checking for torch with a CUDA device, CuPy and NumPy"
    "$py" "$ROOT/scripts/gpu-check.py" requirements || die "the GPU suite cannot run on this machine (see above): nothing was tested"

    local site
    site="$(mktemp -d "${TMPDIR:-/tmp}/dlbridge-gpu-site.XXXXXX")"
    local wanted=("${dl[0]}" "${ex[0]}") module
    for module in pytest tvm_ffi; do
        if ! "$py" -c "import $module" >/dev/null 2>&1; then
            if [[ -d "$wheels_dir/extras" ]]; then
                wanted+=("$wheels_dir"/extras/*.whl)
                log "python3 has no $module: installing $wheels_dir/extras too"
                break
            fi
            [[ $module != pytest ]] || die "python3 has no pytest and $wheels_dir/extras is missing: nothing was tested"
            log "python3 has no $module and $wheels_dir/extras is missing: the tests that need it will fail"
        fi
    done
    if "$py" -m pip --version >/dev/null 2>&1; then
        log "pip install --no-deps --no-index --target $site: ${wanted[*]##*/}"
        PIP_DISABLE_PIP_VERSION_CHECK=1 "$py" -m pip install --quiet --no-deps --no-index --target "$site" "${wanted[@]}" \
            || die "pip refused the wheels (see above): nothing was tested"
    else
        log "python3 has no pip: unpacking the wheels into $site"
        "$py" "$ROOT/scripts/gpu-check.py" unpack "$site" "${wanted[@]}" || die "the wheels could not be unpacked: nothing was tested"
    fi
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" DLBRIDGE_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
    "$py" "$ROOT/scripts/gpu-check.py" installed "$site" || die "Python does not import what was just installed: nothing was tested"

    local status=0 budget
    budget=$(( $(left) - 100 ))
    [[ $budget -gt 30 ]] || die "only $(left) s of the run's ${BUDGET} s are left for the tests and the benchmark: nothing was tested"
    log "python3 -m pytest $suite $* (DLBRIDGE_REQUIRE_GPU=1: a skip is a failure; at most $budget s)"
    timeout --kill-after=10 "$budget" "$py" -m pytest -q -rs -p no:cacheprovider --durations=15 \
        -o faulthandler_timeout=150 -o junit_logging=system-out --junitxml "$out/gpu-tests.xml" "$suite" "$@" \
        || { rc=$?; status=1; [[ $rc -ge 124 ]] && log "the tests ran out of their $budget s (exit $rc)"; }
    "$py" "$ROOT/scripts/gpu-check.py" junit "$out/gpu-tests.xml" || status=1
    budget=$(( $(left) - 5 ))
    if [[ $budget -gt 20 ]]; then
        log "python3 $bench (at most $budget s)"
        timeout --kill-after=5 "$budget" "$py" "$bench" --json "$out/bench_gpu.json" \
            || { status=1; log "the benchmark failed or ran out of its $budget s"; }
    else
        status=1
        log "no time left for the benchmark"
    fi
    if [[ $status -ne 0 ]]; then log "FAILED (see above); results in $out"; else log "GPU tests and benchmark passed; results in $out"; fi
    return $status
}

cmd="${1:-}"; shift || true
case "$cmd" in
    build) [[ $# -le 1 ]] || usage; build "$@" ;;
    run) run "$@" ;;
    *) usage ;;
esac
