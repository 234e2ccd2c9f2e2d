"""The READMEs' Python examples run as written (the repository's, and the package's, which is its page on
PyPI); one marked with an `mpiexec` line runs under it."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
READMES = [ROOT / "README.md", ROOT / "bindings" / "python" / "README.md"]
BIN = Path(sys.executable).parent
# Hydra starts ranks with fork on this host only (no ssh, no batch system): see test_mpi.py.
LAUNCH = ["-launcher", "fork", "-rmk", "user", "-hosts", "localhost"]


def blocks(readme=None):
    return [(path, block) for path in ([readme] if readme else READMES)
            for block in re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)]


def test_readme_python_examples_run():
    for readme in READMES:
        assert blocks(readme), f"{readme} has Python examples"
    for path, block in blocks():
        if not block.startswith("# mpiexec"):
            exec(compile(block, str(path), "exec"), {})


def test_readme_mpiexec_example_runs_under_mpiexec(tmp_path):
    (mpi,) = [b for _, b in blocks() if b.startswith("# mpiexec")]
    ranks = re.match(r"# mpiexec -n (\d+)", mpi).group(1)
    script = tmp_path / "example.py"
    script.write_text(mpi)
    command = [str(BIN / "mpiexec"), *LAUNCH, "-n", ranks, sys.executable, "-m", "mpi4py", str(script)]
    out = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
