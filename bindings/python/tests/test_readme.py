"""The README's Python examples run as written."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[3] / "README.md"


def test_readme_python_examples_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "the README has Python examples"
    for block in blocks:
        exec(compile(block, str(README), "exec"), {})
