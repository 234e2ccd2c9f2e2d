import gc
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def collect():
    """Runs the garbage collector until nothing more is freed."""

    def run():
        for _ in range(3):
            gc.collect()

    return run
