"""The README's Python examples run as written; one marked with an `mpiexec` line runs under it."""

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[3] / "README.md"
BIN = Path(sys.executable).parent
# Hydra starts ranks with fork on this host only (no ssh, no batch system): see test_mpi.py.
LAUNCH = ["-launcher", "fork", "-rmk", "user", "-hosts", "localhost"]


def blocks():
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_python_examples_run():
    assert blocks(), "the README has Python examples"
    for block in blocks():
        if not block.startswith("# mpiexec"):
            exec(compile(block, str(README), "exec"), {})


def test_readme_mpiexec_example_runs_under_mpiexec(tmp_path):
    (mpi,) = [b for b in blocks() if b.startswith("# mpiexec")]
    ranks = re.match(r"# mpiexec -n (\d+)", mpi).group(1)
    script = tmp_path / "example.py"
    script.write_text(mpi)
    command = [str(BIN / "mpiexec"), *LAUNCH, "-n", ranks, sys.executable, "-m", "mpi4py", str(script)]
    out = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
