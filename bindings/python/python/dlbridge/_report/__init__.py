"""An interop report for the array libraries installed here (`python -m dlbridge [report]`).

Each row is a case (a dtype, a layout, read-only data, a copy, a capsule kind), and each column a
producer → consumer path through dlbridge: the producer's object goes into dlbridge.from_dlpack, and
the resulting dlbridge.Tensor into the consumer's from_dlpack. Every library is optional, NumPy
included; cases that need a missing one say "not available". Libraries that can take the process
down on a case (TensorFlow aborts on misaligned data) are probed in a subprocess, one case at a time,
so a crash becomes a cell.
"""

import argparse

from . import render, run


def main(argv=None, program=False):
    parser = argparse.ArgumentParser(prog="python -m dlbridge [report]", description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    parser.add_argument("--cells", nargs="+", help=argparse.SUPPRESS)  # a child of column_in_subprocess
    args = parser.parse_args(argv)
    if args.cells:
        producer, consumer, *names = args.cells
        run.print_cells(producer, consumer, names)
        return 0
    keys = [(p.name, c.name) for p, c in run.columns()]
    if not keys:
        print("\n".join(render.nothing_to_pair()))
        return 0
    table = run.table()
    lines = (render.markdown if args.markdown else render.plain)(table, keys)
    print("\n".join(lines))
    return 0
