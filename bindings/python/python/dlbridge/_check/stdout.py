"""The checker's document alone on stdout. Libraries under test print, at import (which happens in this
process too: resolving a target, reading its version), in their calls (`--in-process`) and at exit,
through print() or straight to file descriptor 1. While the checker runs, descriptor 1 points at
stderr, and the document is written to the stdout the process was started with."""

import contextlib
import os
import sys


@contextlib.contextmanager
def document_only(restore=True):
    """Yields a text stream to the original stdout; everything else written to stdout goes to stderr.
    restore=False leaves descriptor 1 on stderr for the rest of the process (a program that exits next,
    whose libraries may still print at exit)."""
    sys.stdout.flush()
    try:
        fd = sys.stdout.fileno()
        err = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # not a file (pytest's capsys): Python-level only
        out = sys.stdout
        with contextlib.redirect_stdout(sys.stderr):
            yield out
        return
    saved = os.dup(fd)
    os.dup2(err, fd)
    out = os.fdopen(os.dup(saved), "w", encoding=sys.stdout.encoding or "utf-8", errors="replace")
    try:
        yield out
    finally:
        with contextlib.suppress(BrokenPipeError):  # a reader that stopped early (| head)
            out.close()
        sys.stdout.flush()
        if restore:
            os.dup2(saved, fd)
        os.close(saved)
