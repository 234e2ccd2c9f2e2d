"""Running the cases: one cell per (producer, consumer, case), and whole columns in child processes
for libraries that can take the process down."""

import sys

import dlbridge

from .._check import isolate
from .cases import ALIGN, CASES, expected
from .libs import Unavailable, first_line, found
from .peers import PEERS


class _Capsule:
    """Hands out one kind of capsule whatever its consumer asks for."""

    def __init__(self, inner, versioned):
        self.inner, self.versioned = inner, versioned

    def __dlpack__(self, **kwargs):
        if self.versioned:
            return self.inner.__dlpack__(max_version=(1, 0))
        return self.inner.__dlpack__()  # no max_version: the legacy "dltensor" capsule

    def __dlpack_device__(self):
        return self.inner.__dlpack_device__()


def cell(producer, consumer, case):
    """The verdict for one case on the path producer → dlbridge → consumer (see render.LEGEND)."""
    step = "producer"
    try:
        shape, want = expected(case)
        x = producer.make(case)
        source_ptr = producer.data_ptr(x)
        source_readonly = case.get("readonly") or producer.writable(x) is False
        step = "into dlbridge"
        x_in = _Capsule(x, versioned=False) if case.get("into") else x
        t = dlbridge.from_dlpack(x_in, copy=True if case.get("copy") else None)
        step = consumer.name
        y = consumer.consume(_Capsule(t, versioned=case["out"] == "versioned") if case.get("out") else t)
        got_shape, got = tuple(y.shape), consumer.to_list(y)
        if got_shape != tuple(shape) or got != want:
            return f"wrong values (shape {list(got_shape)}: {str(got)[:40]})"
        if t.size and (source_ptr is None or consumer.data_ptr(y) != source_ptr):
            if consumer.copies_unaligned and source_ptr is not None and source_ptr % ALIGN:
                return "copy (unaligned source)"
            return "copy"
        # Shared memory: a writable view is a hazard if the source was read-only, or if dlbridge could
        # not know (then it marks the tensor read-only: imports from legacy capsules).
        if t.size and (source_readonly or t.readonly) and consumer.writable(y):
            return "✔ (writable!)"
        return "✔"
    except Unavailable as exc:
        return f"not available ({exc})"
    except Exception as exc:  # every failure is a verdict; KeyboardInterrupt still stops the report
        where = "" if step == consumer.name else f"[{step}] "
        return f"{where}{type(exc).__name__}: {first_line(exc)}"


def columns():
    """(producer, consumer) pairs among the libraries that import here, in PEERS order."""
    usable = [peer for peer in PEERS.values() if found(peer.name)]
    return [(p, c) for p in usable for c in usable if c.consumer]


def table():
    """{case name: {(producer name, consumer name): verdict}} for every column."""
    result: dict[str, dict[tuple[str, str], str]] = {name: {} for name, _ in CASES}
    for producer, consumer in columns():
        key = (producer.name, consumer.name)
        if producer.in_subprocess or consumer.in_subprocess:
            verdicts = column_in_subprocess(producer.name, consumer.name)
        else:
            verdicts = {name: cell(producer, consumer, case) for name, case in CASES}
        for name, verdict in verdicts.items():
            result[name][key] = verdict
    return result


def column_in_subprocess(producer, consumer):
    """Runs one column in child processes; a child that dies marks its case and the rest go on."""
    def argv(pending):
        return [sys.executable, "-m", "dlbridge", "report", "--cells", producer, consumer, *pending]

    records = isolate.run_children(argv, [name for name, _ in CASES])
    return {name: record.get("cell") or record["crashed"] for name, record in records.items()}


def print_cells(producer, consumer, names):
    """The child's side of column_in_subprocess: one record per case on the results channel."""
    wanted = dict(CASES)
    for name in names:
        verdict = cell(PEERS[producer], PEERS[consumer], wanted[name])
        isolate.record({"name": name, "cell": verdict})
