"""Daemon threads that use dlbridge while the interpreter exits (attack class 10). CPython 3.10 to
3.13 end such a thread with pthread_exit when it takes the GIL back during finalization, which
must not unwind Rust frames (it aborted the process: "FATAL: exception not rethrown"; SIGSEGV with
the release wheels); the shared-memory segments the process created must still be unlinked, with
nothing on stderr. Each pattern runs in fresh child processes, several times, since it is a race.
scripts/exit_check.py runs the same patterns against installed wheels of every Python version."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
import exit_check  # noqa: E402  (the patterns, shared with the release check)


@pytest.mark.parametrize("pattern", exit_check.PATTERNS)
def test_daemon_threads_working_when_the_interpreter_exits(pattern):
    failures = exit_check.run_pattern(sys.executable, pattern, runs=4)
    assert not failures, "\n".join(failures)


def test_the_same_pattern_with_numpy_exits_cleanly():
    # The control: NumPy's C frames unwind without running anything.
    failures = exit_check.run_pattern(sys.executable, "numpy-exporter", runs=2)
    assert not failures, "\n".join(failures)


def test_a_daemon_thread_parked_at_exit_leaves_no_segment_even_when_killed_mid_free():
    # Finalization may end a thread between a segment's last tensor going and its unlink: the
    # exit sweep unlinks it anyway, and tells the resource tracker (nothing on stderr).
    failures = exit_check.run_pattern(sys.executable, "shared-churn", runs=6, threads=6)
    assert not failures, "\n".join(failures)


def test_no_pattern_is_vacuous():
    # Each pattern's threads really run dlbridge before the exit: a child that prints how many
    # iterations its threads made, asked to report instead of exiting mid-way.
    env = dict(os.environ, DLBRIDGE_EXIT_CHECK_REPORT="1")
    for pattern in exit_check.PATTERNS:
        proc = subprocess.run([sys.executable, exit_check.__file__, "--child", pattern, "2"], capture_output=True,
                              text=True, timeout=120, env=env)
        assert proc.returncode == 0, proc.stderr
        assert int(proc.stdout.split()[-1]) > 0, (pattern, proc.stdout)
