"""The READMEs' Python examples run as written (the repository's, and the package's, which is its page on
PyPI); one marked with an `mpiexec` line runs under it."""

import os
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


# Dask and Ray leave threads (gRPC, an IO loop) and state in a process that started them, after which
# a fork() of the suite's later tests can crash: their examples run in a process of their own.
ENGINES = re.compile(r"^(import|from) (ray|dask|distributed)\b|^import .*\b(ray|distributed)\b", re.M)


def test_readme_python_examples_run():
    for readme in READMES:
        assert blocks(readme), f"{readme} has Python examples"
    for path, block in blocks():
        if block.startswith(("# mpiexec", "# myext")):
            continue
        if ENGINES.search(block):
            run = subprocess.run([sys.executable, "-c", block], capture_output=True, text=True, timeout=300)
            assert run.returncode == 0, f"{path}: {block[:200]}...\n{run.stderr[-3000:]}"
        else:
            exec(compile(block, str(path), "exec"), {})


def test_engine_examples_are_found():
    assert sum(bool(ENGINES.search(block)) for _, block in blocks()) >= 2, "the Dask and Ray examples run apart"


def test_readme_mpiexec_example_runs_under_mpiexec(tmp_path):
    (mpi,) = [b for _, b in blocks() if b.startswith("# mpiexec")]
    ranks = re.match(r"# mpiexec -n (\d+)", mpi).group(1)
    script = tmp_path / "example.py"
    script.write_text(mpi)
    command = [str(BIN / "mpiexec"), *LAUNCH, "-n", ranks, sys.executable, "-m", "mpi4py", str(script)]
    out = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def recipe():
    """The files of "Writing an extension": the two TOML blocks and the Rust block that follow its heading,
    and the Python block that uses the result."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Writing an extension"):text.index("### GPU kernels in Rust")]
    cargo, pyproject = re.findall(r"```toml\n(.*?)```", section, flags=re.S)
    (lib,) = re.findall(r"```rust,ignore\n(.*?)```", section, flags=re.S)
    (use,) = [b for b in re.findall(r"```python\n(.*?)```", section, flags=re.S) if b.startswith("# myext")]
    return cargo, pyproject, lib, use


def test_readme_extension_recipe_builds_and_runs(tmp_path):
    cargo, pyproject, lib, use = recipe()
    local = f'path = "{ROOT / "dlbridge-pyo3"}"'
    assert 'path = "../dlbridge/dlbridge-pyo3"' in cargo
    crate = tmp_path / "myext"
    (crate / "src").mkdir(parents=True)
    (crate / "Cargo.toml").write_text(cargo.replace('path = "../dlbridge/dlbridge-pyo3"', local) + "\n[workspace]\n")
    (crate / "pyproject.toml").write_text(pyproject)
    (crate / "src" / "lib.rs").write_text(lib)
    # The workspace's lock file: the versions CI has already compiled, so the build reuses them.
    (crate / "Cargo.lock").write_bytes((ROOT / "Cargo.lock").read_bytes())
    wheels, site = tmp_path / "wheels", tmp_path / "site"
    build = subprocess.run([str(BIN / "maturin"), "build", "--quiet", "-i", sys.executable, "-o", str(wheels)],
                           cwd=crate, capture_output=True, text=True, timeout=900)
    assert build.returncode == 0, build.stdout + build.stderr
    (wheel,) = wheels.glob("myext-*.whl")
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site),
                              str(wheel)], capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stdout + install.stderr
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *sys.path])}
    run = subprocess.run([sys.executable, "-c", use], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip() == re.search(r"print\(e\)  # (.*)", use).group(1), run.stdout
