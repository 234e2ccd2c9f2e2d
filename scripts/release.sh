#!/usr/bin/env bash
# Builds the release: a wheelhouse of manylinux_2_17 wheels and an sdist, checked as users will get them.
#
# Usage: scripts/release.sh [--quick] [--out DIR]   (./dev release)
#   --quick    the dev venv's CPython version and 3.14t, both architectures built, the native one tested
#              with a share of the suite (QUICK_TESTS below); what CI runs. Without it: every version
#              in PYTHONS below, and the whole suite.
#   --out DIR  the wheelhouse (default target/wheelhouse, emptied of dlbridge files first).
#
# Steps:
#   1. wheels: maturin, with zig as the linker aiming at glibc 2.17 (manylinux2014), for x86_64 and,
#      cross-compiled, aarch64; maturin's own manylinux policy check runs on each;
#   2. the sdist (maturin sdist);
#   3. auditwheel show on each wheel (an independent policy check: its tag must be manylinux_2_17),
#      twine check --strict, and scripts/release_check.py (tags, versions, licence files, ELF machine);
#   4. the sdist, built and installed by pip in a bare venv, imports and works;
#   5. the wheel for this machine's Python, installed from the wheelhouse into a venv holding only the
#      test requirements (and the example extensions the tests import), runs the Python suite, outside
#      the source tree. Tests that call the `testing` feature's hooks are skipped there, each named:
#      the wheel is the one users get, which leaves the hooks out; ./dev py-test runs them;
#   5b. daemon threads working while the interpreter exits (scripts/exit_check.py), with each
#      version's wheel alone in a venv, for every version this machine has an interpreter of;
#   6. the aarch64 wheel for CPython 3.11 runs scripts/release_smoke.py under qemu-user, with the
#      Python of a Debian arm64 root (qemu-user-static and debootstrap are installed if missing).
#
# Python versions: CPython 3.10 to 3.14, every version that PyO3 0.30 supports (3.9 to 3.14, 3.15
# unreleased) and that is still maintained: 3.9 reached its end of life in October 2025, and the
# libraries dlbridge exists to connect have left it (NumPy 2.1+, torch 2.9+); and the free-threaded
# 3.14t (PEP 779 made it a supported build; PyO3 0.30 supports free threading from 3.14 only, so no
# 3.13t). One wheel per version: abi3 would cost speed (README.md, "Releases"). No interpreter for
# 3.14t can be had here, so its wheels are built and checked (tags, module names, auditwheel) but not
# run; --quick builds them too, since nothing else builds the free-threaded code paths with zig.
#
# The tools (requirements/release.txt) live in $DLBRIDGE_CACHE/release-venv, the test venv in
# $DLBRIDGE_CACHE/wheel-venv (rebuilt when requirements/test.txt changes), the release builds in
# $DLBRIDGE_CACHE/release-target/cpXY; nothing touches the dev venv or its build.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${DLBRIDGE_CACHE:-$HOME/.cache/dlbridge}"
DEV_VENV="$CACHE/venv"
TOOLS="$CACHE/release-venv"
TEST_VENV="$CACHE/wheel-venv"
PYTHONS=(3.10 3.11 3.12 3.13 3.14 3.14t)
QUICK_TESTS=(test_numpy.py test_torch.py test_jax.py test_tvm_ffi.py test_interfaces.py test_exchange_api.py
             test_buffer_exporters.py test_malformed.py test_soundness.py test_pickle_routes.py
             test_shared_memory.py test_stubs.py test_docstrings.py test_readme.py)
TARGETS=(x86_64-unknown-linux-gnu aarch64-unknown-linux-gnu)

log() { printf '==> [%ss] %s\n' "$SECONDS" "$*" >&2; }
die() { printf 'release: %s\n' "$*" >&2; exit 1; }

quick=0
house="$ROOT/target/wheelhouse"
while [[ $# -gt 0 ]]; do
    case "$1" in
        --quick) quick=1; shift ;;
        --out) house="${2:?--out needs a folder}"; shift 2 ;;
        *) echo "usage: $0 [--quick] [--out DIR]" >&2; exit 2 ;;
    esac
done

[[ -x "$DEV_VENV/bin/python" ]] || die "no dev venv in $DEV_VENV; run ./dev venv first"
native_py="$("$DEV_VENV/bin/python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
[[ $quick -eq 1 ]] && PYTHONS=("$native_py" 3.14t)
version="$(cd "$ROOT" && cargo metadata --no-deps --format-version 1 | "$DEV_VENV/bin/python" -c \
    'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "dlbridge-python"))')"
base="$("$DEV_VENV/bin/python" -c 'import sys; print(getattr(sys, "_base_executable", sys.executable))')"
started=$SECONDS

# A venv made once per requirements file, as ./dev makes its own.
ensure_venv() {
    local venv="$1" reqs="$2" stamp="$1/.dlbridge-complete" want
    want="$(sha256sum "$reqs" | cut -d' ' -f1)"
    if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" && -x "$venv/bin/python" ]]; then return; fi
    log "creating $venv from $(basename "$reqs")"
    rm -rf "$venv"
    "$base" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --upgrade pip
    "$venv/bin/python" -m pip install --quiet -r "$reqs"
    echo "$want" > "$stamp"
}

ensure_venv "$TOOLS" "$ROOT/requirements/release.txt"
for target in "${TARGETS[@]}"; do
    if ! rustup target list --installed | grep -qx "$target"; then
        log "rustup target add $target"
        rustup target add "$target" || die "the Rust standard library for $target could not be installed"
    fi
done

WORK="$(mktemp -d "${TMPDIR:-/tmp}/dlbridge-release.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$house"
house="$(cd "$house" && pwd)"
rm -f "$house"/dlbridge-*.whl "$house"/dlbridge-*.tar.gz

# 1. Wheels. Each version is its own build of pyo3 and everything above it, in a target folder of
# its own, so that a second run rebuilds only what changed; maturin finds the interpreter's settings
# in its own tables when the interpreter is not installed here.
for target in "${TARGETS[@]}"; do
    for v in "${PYTHONS[@]}"; do
        log "maturin build --release --zig --compatibility manylinux2014 --target $target -i python$v"
        (cd "$ROOT/bindings/python" && PATH="$TOOLS/bin:$PATH" CARGO_TARGET_DIR="$CACHE/release-target/cp${v/./}" \
            maturin build --release --quiet --zig --compatibility manylinux2014 --target "$target" -i "python$v" \
            --out "$house")
    done
done
built_wheels=$SECONDS

# 2. The sdist.
log "maturin sdist"
(cd "$ROOT/bindings/python" && PATH="$TOOLS/bin:$PATH" maturin sdist --out "$house")

# 3. What each file claims.
for wheel in "$house"/dlbridge-*.whl; do
    case "$wheel" in *_x86_64.whl) arch=x86_64 ;; *_aarch64.whl) arch=aarch64 ;; *) die "$wheel: unknown architecture" ;; esac
    shown="$("$TOOLS/bin/auditwheel" show "$wheel")"
    if ! grep -q "consistent with the following platform tag: \"manylinux_2_17_$arch\"" <<<"${shown//$'\n'/ }"; then
        printf '%s\n' "$shown" >&2
        die "auditwheel does not confirm manylinux_2_17_$arch for $(basename "$wheel")"
    fi
done
log "auditwheel: every wheel is manylinux_2_17 for its architecture"
"$TOOLS/bin/twine" check --strict "$house"/dlbridge-*
"$TOOLS/bin/python" "$ROOT/scripts/release_check.py" "$house" "$version" "${PYTHONS[@]}" > "$WORK/listing"

export PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONNOUSERSITE=1
# 4. The sdist in a bare venv: pip builds it with maturin from PyPI and cargo.
log "pip install the sdist into a bare venv"
"$base" -m venv "$WORK/sdist-venv"
# The dependencies' builds are kept between runs, but not this project's crates: pip unpacks the sdist
# with its files' old mtimes, which cargo would take as older than the last build and reuse it.
(cd "$ROOT" && cargo clean --quiet --release --target-dir "$CACHE/sdist-target" \
    -p dlbridge -p dlbridge-pyo3 -p dlbridge-python)
(cd "$WORK" && CARGO_TARGET_DIR="$CACHE/sdist-target" "$WORK/sdist-venv/bin/python" -m pip install --quiet \
    "$house/dlbridge-$version.tar.gz")
(cd "$WORK" && "$WORK/sdist-venv/bin/python" "$ROOT/scripts/release_smoke.py" "$version")

# 5. This machine's wheel, installed into the test venv, runs the Python suite.
native_tag="cp${native_py/./}"
wheel="$(ls "$house"/dlbridge-"$version"-"$native_tag"-"$native_tag"-*_"$(uname -m)".whl)"
ensure_venv "$TEST_VENV" "$ROOT/requirements/test.txt"
log "installing $(basename "$wheel") and the example extensions into $TEST_VENV"
"$TEST_VENV/bin/python" -m pip uninstall --quiet --yes dlbridge scale-inplace candle-tensor cuda-kernel 2>/dev/null || true
# The examples are built as ./dev builds them (same interpreter, target folder and flags), so that
# their build is reused, and installed as wheels.
for example in "$ROOT"/examples/*/pyproject.toml; do  # every example, as ./dev builds them
    (cd "$(dirname "$example")" && VIRTUAL_ENV="$DEV_VENV" PATH="$DEV_VENV/bin:$PATH" \
        CARGO_TARGET_DIR="$CACHE/target" "$DEV_VENV/bin/maturin" build --quiet \
        --interpreter "$DEV_VENV/bin/python" --out "$WORK/examples")
done
"$TEST_VENV/bin/python" -m pip install --quiet --no-deps --no-index "$wheel" "$WORK"/examples/*.whl
(cd "$ROOT" && CARGO_TARGET_DIR="$CACHE/target" cargo build --release --quiet -p fake-cuda)
export DLBRIDGE_FAKE_CUDA="$CACHE/target/release/libfake_cuda.so"
log "pytest against the installed wheel (from $WORK, outside the source tree)"
tests=("$ROOT/bindings/python/tests")
if [[ $quick -eq 1 ]]; then
    # CI's share (the whole suite has run on the dev build just before): each peer's exchanges, the
    # interfaces, hostile input, borrows, pickling and shared memory, the stub, the documented
    # examples and the README (about 45 s of the whole suite's 3 minutes).
    tests=()
    for t in "${QUICK_TESTS[@]}"; do tests+=("$ROOT/bindings/python/tests/$t"); done
fi
(cd "$WORK" && DLBRIDGE_WHEEL_UNDER_TEST="$wheel" "$TEST_VENV/bin/python" -m pytest -q -p no:cacheprovider \
    -rs "${tests[@]}")

# 5b. Daemon threads that use dlbridge while the interpreter exits, with each version's wheel alone
# in a venv (scripts/exit_check.py): exit status 0, nothing on stderr, no segment left. CPython 3.10 to
# 3.13 end such threads with pthread_exit, which must not unwind Rust frames.
python_for() {  # the CPython X.Y of this machine: on PATH, or one pyenv installed
    local v="$1" candidate
    for candidate in "python$v" "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$v".*/bin/"python$v"; do
        if "$candidate" -c 'import sys' >/dev/null 2>&1; then echo "$candidate"; return 0; fi
    done
    return 1
}
for v in "${PYTHONS[@]}"; do
    [[ $v == *t ]] && continue  # built and checked above; no free-threaded interpreter here to run it
    interp="$(python_for "$v")" || { log "exit check, CPython $v: NOT RUN, no CPython $v on this machine"; continue; }
    tag="cp${v/./}"
    exit_wheel="$(ls "$house"/dlbridge-"$version"-"$tag"-"$tag"-*_"$(uname -m)".whl)"
    "$interp" -m venv "$WORK/exit-$tag"
    "$WORK/exit-$tag/bin/python" -m pip install --quiet --no-deps --no-index "$exit_wheel"
    log "exit check with $(basename "$exit_wheel")"
    (cd "$WORK" && "$WORK/exit-$tag/bin/python" "$ROOT/scripts/exit_check.py")
done

# 6. The aarch64 wheel, run: under qemu-user, with the Python of a Debian arm64 root (3.11), which
# needs the cp311 wheel (not built by --quick on a machine whose Python is another version).
arm_wheel="$(ls "$house"/dlbridge-"$version"-cp311-cp311-*_aarch64.whl 2>/dev/null || true)"
if [[ -z "$arm_wheel" ]]; then
    log "aarch64 under emulation: NOT RUN, no cp311 aarch64 wheel in this build (Debian's arm64 Python is 3.11)"
else
    if ! command -v qemu-aarch64-static >/dev/null || ! command -v debootstrap >/dev/null; then
        log "apt-get install qemu-user-static debootstrap (to run the aarch64 wheel)"
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq qemu-user-static debootstrap; } \
            || die "qemu-user-static and debootstrap could not be installed: the aarch64 wheel cannot be run here"
    fi
    arm_root="$CACHE/arm64-root"
    if [[ ! -x "$arm_root/usr/bin/python3.11" ]]; then
        log "a Debian bookworm arm64 root with python3.11 in $arm_root (debootstrap, first stage, unpacked)"
        rm -rf "$arm_root.tmp"
        debootstrap --arch=arm64 --foreign --variant=minbase --include=python3-minimal,libpython3.11-stdlib \
            bookworm "$arm_root.tmp" >/dev/null || die "debootstrap of an arm64 root failed"
        for deb in "$arm_root.tmp"/var/cache/apt/archives/*.deb; do dpkg-deb -x "$deb" "$arm_root.tmp"; done
        rm -rf "$arm_root" && mv "$arm_root.tmp" "$arm_root"
    fi
    "$TOOLS/bin/python" -m zipfile -e "$arm_wheel" "$WORK/arm64-site"
    log "$(basename "$arm_wheel") under qemu-aarch64 (Python $(qemu-aarch64-static -L "$arm_root" "$arm_root/usr/bin/python3.11" -c 'import platform; print(platform.python_version(), platform.machine())'))"
    (cd "$WORK" && PYTHONPATH="$WORK/arm64-site" qemu-aarch64-static -L "$arm_root" "$arm_root/usr/bin/python3.11" \
        "$ROOT/scripts/release_smoke.py" "$version")
fi

cat "$WORK/listing"
log "release built and checked in $((SECONDS - started)) s (wheels: $((built_wheels - started)) s)"
