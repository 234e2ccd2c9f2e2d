"""python -m dlbridge: the interop report runs with whatever is installed, has the columns and
verdicts it should, and prints the same thing every time."""

import functools
import subprocess
import sys

import pytest

# Runs the report with some modules made unimportable, as if they were not installed.
BLOCKING_PRELUDE = """
import runpy, sys
BLOCKED = set(sys.argv[1].split(","))
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Block())
sys.argv = ["dlbridge", *sys.argv[2:]]
runpy.run_module("dlbridge", run_name="__main__", alter_sys=True)
"""


def run(*args, blocked=()):
    command = [sys.executable, "-m", "dlbridge", *args]
    if blocked:
        command = [sys.executable, "-c", BLOCKING_PRELUDE, ",".join(blocked), *args]
    out = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return out.stdout


@functools.lru_cache(maxsize=None)
def markdown():
    return run("--markdown")


def parse(text):
    """(header, {case: [cells]}, the line of libraries found and not) from a Markdown report."""
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    header = [c.strip() for c in rows[0].strip("|").split("|")][1:]
    split = [[c.strip() for c in row.strip("|").split("|")] for row in rows[2:]]
    cells = {row[0]: row[1:] for row in split}
    return header, cells, text.splitlines()[1]


def cell(header, cells, case, column):
    return cells[case][header.index(column)]


def test_markdown_report_has_every_library_and_case():
    header, cells, libraries = parse(markdown())
    for lib in ("numpy", "torch", "jax", "tvm_ffi"):
        assert f"{lib} → {lib}" in header, header
        assert f" {lib} " in libraries
    assert cell(header, cells, "dtype float32", "numpy → numpy") == "✔"
    assert cell(header, cells, "layout negative strides", "numpy → numpy") == "✔"
    assert cell(header, cells, "from_dlpack(copy=True)", "numpy → numpy") == "copy"
    assert cell(header, cells, "dtype bfloat16", "torch → torch") == "✔"
    assert "dtype float8_e4m3fn" in cells and "read-only source" in cells
    refusal = cell(header, cells, "layout negative strides", "numpy → jax")
    assert "compact" in refusal, "JAX's own refusal is reported verbatim"


def test_sources_are_aligned_so_jax_shares_them():
    header, cells, _ = parse(markdown())
    assert cell(header, cells, "dtype float32", "numpy → jax") == "✔"
    assert cell(header, cells, "dtype float32", "torch → jax") == "✔"


def test_writable_cells_are_explained():
    text = markdown()
    assert "(writable!)" in text.split("\n\n")[-1], "a legend under the table"
    assert "a legacy capsule cannot carry READ_ONLY" in text


def test_report_is_deterministic():
    assert run("--markdown") == markdown()


def test_plain_report_lists_errors_in_full():
    text = run()
    assert "producer: numpy" in text and "errors in full:" in text and "(writable!) =" in text


def test_report_runs_without_numpy():
    header, cells, libraries = parse(run("--markdown", blocked=("numpy", "ml_dtypes")))
    not_installed = libraries.partition("not installed: ")[2].split(";")[0].split(", ")
    assert "numpy" in not_installed and "ml_dtypes" in not_installed, libraries
    assert not any(key.startswith("numpy") or key.endswith("numpy") for key in header)
    if "torch → torch" in header:
        assert cell(header, cells, "dtype float32", "torch → torch") == "✔"
        assert cell(header, cells, "dtype bfloat16", "torch → torch") == "✔"
        assert cell(header, cells, "layout negative strides", "torch → torch") == "not available (no numpy)"


def test_report_runs_without_ml_dtypes():
    header, cells, libraries = parse(run("--markdown", blocked=("ml_dtypes",)))
    assert "ml_dtypes" in libraries.partition("not installed: ")[2].split(";")[0].split(", "), libraries
    assert cell(header, cells, "dtype float32", "numpy → numpy") == "✔"
    assert cell(header, cells, "dtype bfloat16", "numpy → numpy") == "not available (no ml_dtypes)"
    if "torch → torch" in header:
        assert cell(header, cells, "dtype bfloat16", "torch → torch") == "✔"


# Stands in for sys.executable: a child that dies (as TensorFlow does) on one case.
CRASHING_CHILD = """#!{python}
import os, runpy, sys
from dlbridge._report import run
real = run.cell
run.cell = lambda p, c, case: os.abort() if case == {{"dtype": "int8"}} else real(p, c, case)
sys.argv = ["dlbridge", *sys.argv[3:]]  # after "-m dlbridge"
runpy.run_module("dlbridge", run_name="__main__")
"""


def test_a_crashing_child_costs_one_cell(tmp_path, monkeypatch):
    from dlbridge._report import run as report
    from dlbridge._report.cases import CASES
    from dlbridge._report.peers import PEERS

    child = tmp_path / "python"
    child.write_text(CRASHING_CHILD.format(python=sys.executable))
    child.chmod(0o755)
    in_process = {name: report.cell(PEERS["numpy"], PEERS["numpy"], case) for name, case in CASES}
    monkeypatch.setattr(sys, "executable", str(child))
    verdicts = report.column_in_subprocess("numpy", "numpy")
    assert verdicts.pop("dtype int8").startswith("process crashed (exit ")
    assert verdicts == {name: v for name, v in in_process.items() if name != "dtype int8"}


def test_ctrl_c_stops_the_report(monkeypatch):
    from dlbridge._report import run as report
    from dlbridge._report.peers import PEERS

    def interrupted(case):
        raise KeyboardInterrupt

    monkeypatch.setattr(PEERS["numpy"], "make", interrupted)
    with pytest.raises(KeyboardInterrupt):
        report.cell(PEERS["numpy"], PEERS["numpy"], {})
