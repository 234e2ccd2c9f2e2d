#!/usr/bin/env bash
# Runs Python tests under valgrind memcheck, child processes included (the
# hostile-producer tests run each case in its own interpreter), and summarises
# what it finds in dlbridge's own code. The default set is the NumPy-side tests
# and the ctypes producers that rewrite and free their metadata after export;
# torch and JAX are left out by default: under memcheck their imports alone take
# minutes per process. Name tests to run others, e.g.
#   ./dev valgrind bindings/python/tests/test_producer_changes.py
# Usage: scripts/valgrind.sh [pytest args]; needs ./dev setup first.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${DLBRIDGE_CACHE:-$HOME/.cache/dlbridge}"
PY="$CACHE/venv/bin/python"
command -v valgrind >/dev/null || { apt-get update -qq && apt-get install -y -qq valgrind; }
LOGS="${VALGRIND_LOGS:-/tmp/dlbridge-valgrind}"
rm -rf "$LOGS" && mkdir -p "$LOGS"
cd "$ROOT"
TESTS=("$@")
CHANGES=bindings/python/tests/test_producer_changes.py
[[ ${#TESTS[@]} -gt 0 ]] || TESTS=(bindings/python/tests/test_numpy.py bindings/python/tests/test_interfaces.py
    bindings/python/tests/test_hypothesis.py bindings/python/tests/test_ml_dtypes_rebound.py
    "$CHANGES::test_a_producer_that_rewrites_its_metadata_after_export_changes_nothing"
    "$CHANGES::test_an_argument_whose_producer_changes_while_it_is_held_keeps_its_layout"
    -p no:cacheprovider -q)
# PYTHONMALLOC=malloc lets memcheck see every Python allocation; one log per process.
PYTHONMALLOC=malloc OPENBLAS_NUM_THREADS=1 valgrind --tool=memcheck --leak-check=full --trace-children=yes \
    --show-leak-kinds=definite --errors-for-leak-kinds=definite --num-callers=30 \
    --suppressions="$ROOT/scripts/python.supp" --log-file="$LOGS/%p.log" \
    "$PY" -m pytest "${TESTS[@]}" || true
echo "== valgrind summary ($LOGS, $(ls "$LOGS" | wc -l) processes)"
cat "$LOGS"/*.log | grep -E "ERROR SUMMARY|definitely lost|indirectly lost|Invalid (read|write)" | sed 's/^==[0-9]*==//' | sort | uniq -c | head -20 || true
echo "== reports with a frame in dlbridge's own code (the _native module, the examples, or the dlbridge crates):"
# The venv path contains "dlbridge" too, so match the library and crate names only.
cat "$LOGS"/*.log | awk '/^==[0-9]+== (Invalid|Conditional|Use of|[0-9,]+ (\([0-9, a-z]+\) )?bytes in)/{block=$0; keep=0; next}
     /_native\.cpython|scale_inplace\.cpython|dlbridge_pyo3::|dlbridge::/{keep=1}
     /^==[0-9]+== $/{if (keep) print block; keep=0}' | sed 's/^==[0-9]*==//' | sort | uniq -c
echo "(none above means none)"
