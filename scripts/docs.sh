#!/usr/bin/env bash
# Builds the API reference, warnings as errors (./dev docs; ./dev builds the package and installs
# requirements/docs.txt first):
#   - Python: pdoc over `dlbridge` and `dlbridge.testing`, from the docstrings and the stub
#     (docs/api.py), into target/api-docs/python;
#   - Rust: rustdoc of dlbridge and dlbridge-pyo3 as docs.rs builds them (every feature, nightly with
#     `--cfg docsrs`, so each item says which crate feature it needs), into target/api-docs/rust.
# The stable `./dev doc` stays the quick check; this one installs nightly if it is missing, as
# ./dev miri does.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${DLBRIDGE_CACHE:-$HOME/.cache/dlbridge}"
VENV="$CACHE/venv"
OUT="$ROOT/target/api-docs"

log() { printf '==> %s\n' "$*" >&2; }

log "Python API reference (pdoc) into $OUT/python"
rm -rf "$OUT"
mkdir -p "$OUT"
(cd "$OUT" && "$VENV/bin/python" -W error "$ROOT/docs/api.py" "$OUT/python")

if ! rustup toolchain list | grep -q '^nightly'; then
    log "installing the nightly toolchain (rustdoc's doc_cfg, as on docs.rs)"
    rustup toolchain install nightly --profile minimal \
        || { echo "docs.sh: RUST DOCS NOT BUILT: nightly could not be installed on this machine" >&2; exit 1; }
fi
log "rustdoc, every feature, --cfg docsrs (nightly), warnings denied"
# A target folder of its own: nightly artefacts would otherwise replace stable ones in the shared one.
(cd "$ROOT" && CARGO_TARGET_DIR="$CACHE/docs-target" RUSTDOCFLAGS="--cfg docsrs -D warnings" \
    PYO3_PYTHON="$VENV/bin/python" cargo +nightly doc --no-deps -p dlbridge -p dlbridge-pyo3 --all-features)
cp -r "$CACHE/docs-target/doc" "$OUT/rust"
log "API reference: $OUT/python/index.html, $OUT/rust/dlbridge/index.html, $OUT/rust/dlbridge_pyo3/index.html"
