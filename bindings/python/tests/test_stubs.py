"""The type stubs (_native.pyi) agree with the native module: mypy's stubtest compares every name,
signature, default and class attribute of the stub with what the built module has at runtime."""

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mypy.stubtest", reason="mypy is not installed (it is in requirements/test.txt)")

ALLOWLIST = Path(__file__).with_name("stubtest-allowlist.txt")


def test_stubtest(tmp_path):
    # Run from an empty folder with an empty config, so that only the installed package and no user
    # configuration is seen, and the mypy cache lands there.
    config = tmp_path / "mypy.ini"
    config.write_text("[mypy]\n")
    proc = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "dlbridge._native", "--allowlist", str(ALLOWLIST),
         "--mypy-config-file", str(config)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
