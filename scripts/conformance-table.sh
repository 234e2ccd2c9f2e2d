#!/usr/bin/env bash
# Writes docs/conformance.md: the DLPack conformance table (`python -m dlbridge check --markdown`) for
# NumPy, PyTorch, JAX, tvm-ffi and dlbridge itself, generated, never edited by hand.
# Peers break some rules, which is what the table is for, so the checker's exit status 1 (a rule
# failed) is not an error here; 2 (a library could not be checked) is, and so is any rule that
# dlbridge fails (a MUST rule broken, or a crash or a hang in any rule). SHOULD warnings and MAY notes
# for dlbridge are printed, not fatal.
# Usage: scripts/conformance-table.sh [OUT]   (PYTHON= picks the interpreter; default: ./dev's venv)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-${DLBRIDGE_CACHE:-$HOME/.cache/dlbridge}/venv/bin/python}"
OUT="${1:-$ROOT/docs/conformance.md}"
LIBRARIES=(numpy torch jax tvm_ffi dlbridge)

mkdir -p "$(dirname "$OUT")"
status=0
"$PY" -m dlbridge check --markdown "${LIBRARIES[@]}" > "$OUT.tmp" || status=$?
if (( status > 1 )); then
    rm -f "$OUT.tmp"
    echo "conformance-table: the checker could not check every library (exit $status)" >&2
    exit "$status"
fi
mv "$OUT.tmp" "$OUT"
echo "conformance-table: wrote $OUT" >&2
# The lines listed under a heading: "## Failures ...", "## Warnings ..." or "## Notes ...".
listed() { awk -v h="$1" '/^## /{on = index($0, "## " h) == 1; next} on && /^- \*\*dlbridge/' "$OUT"; }
if [[ -n "$(listed Warnings)$(listed Notes)" ]]; then
    echo "conformance-table: dlbridge's warnings and notes:" >&2
    { listed Warnings; listed Notes; } >&2
fi
if [[ -n "$(listed Failures)" ]]; then
    echo "conformance-table: dlbridge fails a rule:" >&2
    listed Failures >&2
    exit 1
fi
