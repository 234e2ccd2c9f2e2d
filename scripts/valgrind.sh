#!/usr/bin/env bash
# Runs the NumPy-side Python tests under valgrind memcheck and summarises what
# it finds in dlbridge's own code. torch and JAX are left out: under memcheck
# their imports alone take many minutes.
# Usage: scripts/valgrind.sh [pytest args]; needs ./dev setup first.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${DLBRIDGE_CACHE:-$HOME/.cache/dlbridge}"
PY="$CACHE/venv/bin/python"
command -v valgrind >/dev/null || { apt-get update -qq && apt-get install -y -qq valgrind; }
LOG="${VALGRIND_LOG:-/tmp/dlbridge-valgrind.log}"
cd "$ROOT"
TESTS=("$@")
[[ ${#TESTS[@]} -gt 0 ]] || TESTS=(bindings/python/tests/test_numpy.py bindings/python/tests/test_interfaces.py bindings/python/tests/test_hypothesis.py -p no:cacheprovider -q)
# PYTHONMALLOC=malloc lets memcheck see every Python allocation.
PYTHONMALLOC=malloc OPENBLAS_NUM_THREADS=1 valgrind --tool=memcheck --leak-check=full \
    --show-leak-kinds=definite --errors-for-leak-kinds=definite --num-callers=30 \
    --suppressions="$ROOT/scripts/python.supp" --log-file="$LOG" \
    "$PY" -m pytest "${TESTS[@]}" || true
echo "== valgrind summary ($LOG)"
grep -E "ERROR SUMMARY|definitely lost|indirectly lost|Invalid (read|write)" "$LOG" | sort | uniq -c | head -20
echo "== reports with a frame in dlbridge's own code (the _native module, or the dlbridge crates):"
# The venv path contains "dlbridge" too, so match the library and crate names only.
awk '/^==[0-9]+== (Invalid|Conditional|Use of|[0-9,]+ (\([0-9, a-z]+\) )?bytes in)/{block=$0; keep=0; next}
     /_native\.cpython|dlbridge_pyo3::|dlbridge::/{keep=1}
     /^==[0-9]+== $/{if (keep) print block; keep=0}' "$LOG" | sort | uniq -c
echo "(none above means none)"
