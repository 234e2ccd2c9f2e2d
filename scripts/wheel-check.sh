#!/usr/bin/env bash
# Checks the dlbridge wheel as a user gets it, outside the development venv:
#   1. `maturin build --release` in bindings/python, into a temporary folder;
#   2. a fresh venv (pip and nothing else) installs the wheel, and `import dlbridge` must work
#      without NumPy, which the package does not depend on;
#   3. NumPy alone is then installed from PyPI, and `python -m dlbridge` (the interop report, which
#      needs NumPy) must exit 0.
#
# Usage: scripts/wheel-check.sh [--out DIR]   (./dev wheel-check)
#   --out DIR  also keep the wheel in DIR (by default it goes with the temporary folder).
#
# The wheel is built with the dev venv's interpreter and maturin, in the same environment as
# `./dev setup`, so that the release build in $CARGO_TARGET_DIR is reused rather than redone (a
# different PYO3_PYTHON would rebuild pyo3 and everything above it, here and in the next ./dev
# run). The fresh venv is made from that interpreter's base python3, so the wheel's tag matches.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${DLBRIDGE_CACHE:-$HOME/.cache/dlbridge}"
VENV="$CACHE/venv"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE/target}"

log() { printf '==> %s\n' "$*" >&2; }

keep=""
case "${1:-}" in
    "") ;;
    --out) keep="${2:?--out needs a folder}"; mkdir -p "$keep"; keep="$(cd "$keep" && pwd)" ;;
    *) echo "usage: $0 [--out DIR]" >&2; exit 2 ;;
esac

if [[ ! -x "$VENV/bin/maturin" ]]; then
    echo "no maturin in $VENV; run ./dev venv first" >&2
    exit 1
fi

WORK="$(mktemp -d "${TMPDIR:-/tmp}/dlbridge-wheel.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

log "maturin build --release (into $WORK/dist)"
(cd "$ROOT/bindings/python" && VIRTUAL_ENV="$VENV" PATH="$VENV/bin:$PATH" \
    "$VENV/bin/maturin" build --release --interpreter "$VENV/bin/python" --out "$WORK/dist")
shopt -s nullglob
wheels=("$WORK"/dist/dlbridge-*.whl)
shopt -u nullglob
if [[ ${#wheels[@]} -ne 1 ]]; then
    echo "expected one wheel in $WORK/dist, found: ${wheels[*]:-none}" >&2
    exit 1
fi
wheel="${wheels[0]}"
log "built $(basename "$wheel")"
if [[ -n "$keep" ]]; then
    cp "$wheel" "$keep/"
    log "kept a copy in $keep"
fi

base="$("$VENV/bin/python" -c 'import sys; print(getattr(sys, "_base_executable", sys.executable))')"
log "fresh venv from $base"
"$base" -m venv "$WORK/venv"
PY="$WORK/venv/bin/python"
# Outside the repository, so that only the installed wheel can be imported.
cd "$WORK"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONNOUSERSITE=1
unset PYTHONPATH VIRTUAL_ENV

log "pip install the wheel"
"$PY" -m pip install --quiet "$wheel"

log "import dlbridge, without NumPy"
"$PY" - <<'EOF'
import importlib.util
import sys

assert importlib.util.find_spec("numpy") is None, "numpy is installed in the fresh venv"
import dlbridge

assert "site-packages" in dlbridge.__file__, f"imported {dlbridge.__file__}, not the wheel"
t = dlbridge.zeros((2, 3), "int32")
assert t.shape == (2, 3) and str(t.dtype) == "int32" and t.tolist() == [[0, 0, 0], [0, 0, 0]]
assert bytes(memoryview(t)) == bytes(24)
u = dlbridge.from_dlpack(t)
assert u.data_ptr == t.data_ptr
assert "numpy" not in sys.modules, "importing dlbridge imported numpy"
print(f"dlbridge {dlbridge.__version__} from {dlbridge.__file__}: import and basic use work without numpy")
EOF

log "pip install numpy (nothing else)"
"$PY" -m pip install --quiet numpy
log "installed: $("$PY" -m pip list --format=freeze 2>/dev/null | tr '\n' ' ')"

log "python -m dlbridge"
"$PY" -m dlbridge
log "wheel check passed: $(basename "$wheel")"
