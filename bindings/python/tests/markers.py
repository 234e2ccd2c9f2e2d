"""Markers shared by test modules (conftest.py cannot be imported from: tests/gpu has its own)."""

import ctypes.util

import pytest

# For tests of what dlbridge says on this suite's machines, which have no CUDA driver; with one,
# the GPU suite (tests/gpu) covers the same calls for real.
no_driver = pytest.mark.skipif(ctypes.util.find_library("cuda") is not None, reason="a CUDA driver is present: the GPU suite covers it")
