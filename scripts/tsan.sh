#!/usr/bin/env bash
# Runs the tests of the structures threads share (tests/registry-threads: the borrow registry's
# table, built as free-threaded builds build it) under ThreadSanitizer, with a standard library
# built with it too (nightly, -Zbuild-std), so that every access the locks do not order is reported.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${DLBRIDGE_CACHE:-$HOME/.cache/dlbridge}"
export CARGO_TARGET_DIR="$CACHE/tsan-target"

if ! rustup toolchain list | grep -q '^nightly'; then
    echo "tsan.sh: installing the nightly toolchain" >&2
    rustup toolchain install nightly --profile minimal || { echo "tsan.sh: TSAN NOT RUN: nightly could not be installed on this machine" >&2; exit 1; }
fi
if ! rustup component list --installed --toolchain nightly | grep -q '^rust-src'; then
    echo "tsan.sh: installing rust-src for nightly (-Zbuild-std)" >&2
    rustup component add rust-src --toolchain nightly || { echo "tsan.sh: TSAN NOT RUN: rust-src could not be installed on this machine" >&2; exit 1; }
fi
target="$(rustc -vV | sed -n 's/^host: //p')"
cd "$ROOT"
# Races are errors, reported once each, and the run stops at the first.
export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1 abort_on_error=1}"
RUSTFLAGS="-Zsanitizer=thread" RUSTDOCFLAGS="-Zsanitizer=thread" \
    cargo +nightly test -Zbuild-std --target "$target" -p registry-threads "$@"
