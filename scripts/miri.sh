#!/usr/bin/env bash
# Runs the core crate's whole test suite under Miri (nightly).
# The C-calling tests live in tests/c-abi, a separate crate, so nothing is left out here.
# proptest cases are reduced under Miri (it is ~1000x slower); the properties are the same.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# A target folder of this checkout's own: cargo-miri records each test binary as
# an invocation naming the checkout it was built in, so a folder shared between
# checkouts would run another checkout's (stale) sources.
export CARGO_TARGET_DIR="$ROOT/target/miri"

if ! rustup toolchain list | grep -q '^nightly'; then
    echo "miri.sh: installing the nightly toolchain" >&2
    rustup toolchain install nightly --profile minimal || { echo "miri.sh: MIRI NOT RUN: nightly could not be installed on this machine" >&2; exit 1; }
fi
if ! cargo +nightly miri --version >/dev/null 2>&1; then
    echo "miri.sh: installing miri and rust-src for nightly" >&2
    rustup component add miri rust-src --toolchain nightly || { echo "miri.sh: MIRI NOT RUN: the miri component could not be installed on this machine" >&2; exit 1; }
fi
cd "$ROOT"
export PROPTEST_CASES="${PROPTEST_CASES:-8}"
# proptest reads the working directory and the clock, which isolation forbids.
# Strict provenance: an integer-to-pointer cast is an error, not a warning that Miri may miss bugs.
export MIRIFLAGS="${MIRIFLAGS:--Zmiri-disable-isolation -Zmiri-strict-provenance}"
cargo +nightly miri setup >/dev/null 2>&1 || true
# Every feature but candle, whose own tests exercise candle's kernels (SIMD, threads), far
# beyond what Miri runs in time; its unsafe glue is covered natively by dlbridge/tests/candle.rs.
exec cargo +nightly miri test -p dlbridge --features ndarray,half,complex,float8,cuda "$@"
