"""python -m dlbridge: the interop report runs and has the columns and verdicts it should."""

import subprocess
import sys


def run(*args):
    out = subprocess.run([sys.executable, "-m", "dlbridge", *args], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_markdown_report_has_every_library_and_case():
    text = run("--markdown")
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    header = [c.strip() for c in rows[0].strip("|").split("|")]
    for lib in ("numpy", "torch", "jax", "tvm_ffi"):
        assert f"{lib} → {lib}" in header, header
    cells = {r.strip("|").split("|")[0].strip(): [c.strip() for c in r.strip("|").split("|")[1:]] for r in rows[2:]}
    column = header.index("numpy → numpy") - 1
    assert cells["dtype float32"][column] == "✔"
    assert cells["layout negative strides"][column] == "✔"
    assert cells["from_dlpack(copy=True)"][column] == "copy"
    torch_to_torch = header.index("torch → torch") - 1
    assert cells["dtype bfloat16"][torch_to_torch] == "✔"
    assert "dtype float8_e4m3fn" in cells and "read-only source" in cells
    numpy_to_jax = header.index("numpy → jax") - 1
    assert "compact" in cells["layout negative strides"][numpy_to_jax], "JAX's own refusal is reported verbatim"


def test_plain_report_lists_errors_in_full():
    text = run()
    assert "producer: numpy" in text and "errors in full:" in text
