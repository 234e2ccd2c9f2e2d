#!/usr/bin/env bash
# Builds the API reference, warnings as errors (./dev docs; ./dev builds the package and installs
# requirements/docs.txt first):
#   - Python: pdoc over `dlbridge` and `dlbridge.testing`, from the docstrings and the stub
#     (docs/api.py), into target/api-docs/python;
#   - Rust: rustdoc of dlbridge and dlbridge-pyo3 as docs.rs builds them (`./dev doc`: every feature,
#     `--cfg docsrs`, so each item says which crate feature it needs), copied into target/api-docs/rust.
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

# `./dev docs` ran rustdoc (./dev doc) before this script.
cp -r "${CARGO_TARGET_DIR:-$CACHE/target}/doc" "$OUT/rust"
log "API reference: $OUT/python/index.html, $OUT/rust/dlbridge/index.html, $OUT/rust/dlbridge_pyo3/index.html"
