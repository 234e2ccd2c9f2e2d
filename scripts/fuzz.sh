#!/usr/bin/env bash
# Fuzzes the validation path (dlbridge/fuzz/fuzz_targets/validate.rs) with cargo fuzz.
# Usage: scripts/fuzz.sh [seconds, default 600]. Installs nightly and cargo-fuzz if needed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SECONDS_TO_RUN="${1:-600}"
rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
cd "$ROOT/dlbridge"
mkdir -p fuzz/corpus/validate
exec cargo +nightly fuzz run validate fuzz/corpus/validate -- -max_total_time="$SECONDS_TO_RUN" -print_final_stats=1
