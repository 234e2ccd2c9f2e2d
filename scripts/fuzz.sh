#!/usr/bin/env bash
# Fuzzes every parser of foreign input with cargo fuzz: the DLTensor validator
# (fuzz_targets/validate.rs) and the typestr, PEP 3118 format, dtype-name and
# array-interface field parsers (fuzz_targets/formats.rs), each for the given time.
# Usage: scripts/fuzz.sh [seconds per target, default 600]. Installs nightly and cargo-fuzz if needed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SECONDS_TO_RUN="${1:-600}"
rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
cd "$ROOT/dlbridge"
for target in validate formats; do
    mkdir -p "fuzz/corpus/$target"
    cargo +nightly fuzz run "$target" "fuzz/corpus/$target" -- -max_total_time="$SECONDS_TO_RUN" -print_final_stats=1
done
