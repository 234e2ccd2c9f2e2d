import gc
import inspect
import os
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

# Set by scripts/release.sh: the suite runs against that wheel, installed, instead of the dev build.
WHEEL = os.environ.get("DLBRIDGE_WHEEL_UNDER_TEST")
# The `testing` feature's hooks (dlbridge-pyo3/src/testing.rs): every private name of _native but the
# package's own (pickling and shared-memory constructors, the exit sweep, numpy()'s type lookup).
# Release wheels leave them out.
# table_producer (producers.py) has a hook trust its table, as only a static type's is otherwise.
HOOK_USE = re.compile(r"_native\._(?!_|rebuild_tensor\b|shared_tensor\b|shared_exit_sweep\b|ml_dtypes_type\b)\w+"
                      r"|\btable_producer\(")


def pytest_report_header(config):
    import dlbridge

    return f"dlbridge {dlbridge.__version__} from {Path(dlbridge.__file__).parent}"


def pytest_sessionstart(session):
    """Against a wheel, dlbridge must come from an installed wheel: not the source tree, not editable."""
    if WHEEL:
        import importlib.metadata

        import dlbridge

        where = Path(dlbridge.__file__).resolve()
        root = Path(__file__).resolve().parents[3]
        direct_url = importlib.metadata.distribution("dlbridge").read_text("direct_url.json") or ""
        if root in where.parents or '"editable": true' in direct_url:
            pytest.exit(f"DLBRIDGE_WHEEL_UNDER_TEST is set, but dlbridge was imported from {where}", returncode=3)


def pytest_collection_modifyitems(config, items):
    """In a run against a release wheel (no hooks), tests that call the hooks are skipped, each by name."""
    from dlbridge import _native

    if not WHEEL or hasattr(_native, "_live_borrows"):
        return
    reason = f"calls the `testing` feature's hooks, which {Path(WHEEL).name} leaves out; ./dev py-test runs it"
    for item in items:
        function = getattr(item, "function", None)
        if function is not None and HOOK_USE.search(inspect.getsource(function)):
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def collect():
    """Runs the garbage collector until nothing more is freed."""

    def run():
        for _ in range(3):
            gc.collect()

    return run
