#!/usr/bin/env bash
# Checks that the publishable crates, dlbridge and dlbridge-pyo3, would reach crates.io intact:
# `cargo package` builds each .crate and verifies it by compiling it from its own contents, then
# `cargo publish --dry-run` runs the registry-side checks short of uploading.
#
# Usage: scripts/package-check.sh [--no-verify]   (./dev package)
#   --no-verify  only assemble the .crate files (no build); quick, for checking their contents.
#
# dlbridge-pyo3 depends on dlbridge by path and version, and dlbridge is not on crates.io yet, so
# the two are always packaged in one command: cargo (1.90+) then resolves dlbridge from the .crate
# it has just made (a local registry overlay). `cargo package -p dlbridge-pyo3` alone fails until
# dlbridge is published.
#
# --allow-dirty: what is checked is what the crates contain, so uncommitted work is packaged too.
# pyo3's build script needs an interpreter: PYO3_PYTHON defaults to the dev venv's.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${DLBRIDGE_CACHE:-$HOME/.cache/dlbridge}"
# A target folder of its own: verification builds dlbridge-pyo3 against dlbridge as a registry
# crate, whose build cargo never refreshes for the same name and version (0.1.0 between commits).
export CARGO_TARGET_DIR="$CACHE/package-target"
export PYO3_PYTHON="${PYO3_PYTHON:-$CACHE/venv/bin/python}"

CRATES=(dlbridge dlbridge-pyo3)
# Every .crate must carry these (cargo only packs files from the crate's own folder).
REQUIRED=(Cargo.toml README.md LICENSE-MIT LICENSE-APACHE src/lib.rs)

verify=()
case "${1:-}" in
    "") ;;
    --no-verify) verify=(--no-verify) ;;
    *) echo "usage: $0 [--no-verify]" >&2; exit 2 ;;
esac

log() { printf '==> %s\n' "$*" >&2; }

if [[ ${#verify[@]} -eq 0 && ! -x "$PYO3_PYTHON" ]]; then
    echo "PYO3_PYTHON=$PYO3_PYTHON is not an interpreter; run ./dev venv, or set PYO3_PYTHON" >&2
    exit 1
fi

cd "$ROOT"
# cargo unpacks the just-packaged dlbridge for dlbridge-pyo3's verification into its registry
# folder for the temporary overlay, and reuses what it unpacked for the same name and version in an
# earlier run (the version stays 0.1.0 between commits): a stale dlbridge would then verify
# dlbridge-pyo3. Start clean, removing only those overlay copies (crates.io's folders are not
# touched: their names do not start with "-").
rm -rf "$CARGO_TARGET_DIR/package"
for crate in "${CRATES[@]}"; do
    rm -rf "${CARGO_HOME:-$HOME/.cargo}"/registry/src/-*/"$crate"-* "${CARGO_HOME:-$HOME/.cargo}"/registry/cache/-*/"$crate"-*
    # ... and what an earlier verification built of it.
    lib="${crate//-/_}"
    rm -rf "$CARGO_TARGET_DIR"/debug/.fingerprint/"$crate"-* "$CARGO_TARGET_DIR"/debug/deps/lib"$lib"-* \
        "$CARGO_TARGET_DIR"/debug/deps/"$lib"-* "$CARGO_TARGET_DIR"/debug/build/"$crate"-*
done
pkgs=()
for crate in "${CRATES[@]}"; do pkgs+=(-p "$crate"); done

for crate in "${CRATES[@]}"; do
    list="$(cargo package --list --allow-dirty -p "$crate")"
    for file in "${REQUIRED[@]}"; do
        if ! grep -qxF "$file" <<<"$list"; then
            echo "$crate: $file is missing from the package" >&2
            exit 1
        fi
    done
done
log "each crate carries ${REQUIRED[*]}"

log "cargo package ${pkgs[*]} ${verify[*]}"
cargo package --allow-dirty "${verify[@]}" "${pkgs[@]}"

# The crates were verified just above (unless --no-verify): the dry run checks the rest.
log "cargo publish --dry-run ${pkgs[*]}"
cargo publish --dry-run --allow-dirty --no-verify "${pkgs[@]}"

for crate in "${CRATES[@]}"; do
    id="$(cargo pkgid -p "$crate")"
    ls -l "$CARGO_TARGET_DIR/package/$crate-${id##*[#@]}.crate" >&2
done
