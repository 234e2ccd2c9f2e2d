"""Driving a consumer: producers that hand out capsules the checker built (abi.Managed), one import
run to its end (result inspected, dropped, capsules let go), and what was seen on the way."""

import gc
import struct
import time
from dataclasses import dataclass, field
from typing import Callable, List, Optional

from . import abi
from .rules import describe

SETTLE_S = 2.0  # how long a deleter may lag behind the result's death (JAX frees asynchronously)


def floats(values):
    return struct.pack(f"={len(values)}f", *values)


def numbered(n):
    """n float32 values 1..n: every element tells where it came from."""
    return floats([float(i) for i in range(1, n + 1)])


class Exporter:
    """An array API producer over checker-built tensors on the CPU: a versioned capsule for max_version
    >= (1, 0), else legacy, made on first request by `build(versioned)`. Asked again, it returns the
    same capsule, so a consumer that asks twice is not mistaken for one that frees twice. It refuses
    what a CPU producer must: a stream other than None, another device, and (it cannot copy) a copy."""

    def __init__(self, build: Callable[[bool], abi.Managed], prefix=""):
        self.build, self.prefix = build, prefix  # prefix "used_": capsules some consumer already took
        self.made = {}
        self.calls: List[dict] = []

    def _capsule(self, versioned):
        if versioned not in self.made:
            m = self.made[versioned] = self.build(versioned)
            m.capsule(self.prefix + (abi.VERSIONED if versioned else abi.LEGACY))
        return self.made[versioned].capsules[0]

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        self.calls.append({"stream": stream, "max_version": max_version, "dl_device": dl_device, "copy": copy})
        return self._answer(stream, max_version, dl_device, copy)

    def _answer(self, stream, max_version=None, dl_device=None, copy=None):
        if stream is not None:  # the array API's words, as NumPy (RuntimeError) and dlbridge (ValueError) do
            raise ValueError(f"On CPU and other device types without streams, only None is accepted: got {stream!r}")
        if dl_device is not None and tuple(int(v) for v in dl_device) != (1, 0):
            raise BufferError(f"cannot export to device {dl_device}")
        if copy:
            raise BufferError("this producer cannot copy")
        return self._capsule(max_version is not None and max_version[0] >= 1)

    def __dlpack_device__(self):
        return (1, 0)

    @property
    def deleted(self):
        return sum(m.deleted for m in self.made.values())

    def taken(self):
        """The Managed the consumer took: the one whose capsule it renamed, else the last made."""
        for m in self.made.values():
            if abi.capsule_name(m.capsules[0]).startswith("used_"):
                return m
        return list(self.made.values())[-1] if self.made else None

    def drop(self):
        for m in self.made.values():
            m.drop()


class PreVersionExporter(Exporter):
    """A producer from before max_version existed: its __dlpack__ takes a stream and nothing else."""

    def __dlpack__(self, stream=None):
        self.calls.append({"stream": stream})
        return self._answer(stream)


class NoDeviceCopyExporter(Exporter):
    """A producer from before dl_device and copy: max_version, but nothing newer."""

    def __dlpack__(self, *, stream=None, max_version=None):
        self.calls.append({"stream": stream, "max_version": max_version})
        return self._answer(stream, max_version)


@dataclass
class Seen:
    """What the checker can read of a consumer's result, through whatever protocol it offers."""

    how: str
    start: Optional[int] = None
    shape: Optional[list] = None  # None: the protocol does not carry the element shape
    data: Optional[bytes] = None  # None: no values could be read
    readonly: Optional[bool] = None


def _through_dlpack(y, exporter):
    """Seen through y.__dlpack__, asking for CPU memory if it is elsewhere; None if it has none."""
    for kw in ({"max_version": (1, 0)}, {}, {"max_version": (1, 0), "dl_device": (1, 0), "copy": True}):
        try:
            capsule = y.__dlpack__(**kw)
            s = abi.snapshot(capsule)
        except TypeError:
            continue
        except Exception:
            return None
        if any(capsule is mine for m in exporter.made.values() for mine in m.capsules):
            return Seen("the checker's own capsule, handed back")
        values = abi.values_of(s)
        if values is None and s.device[0] not in abi.CPU_LIKE:
            continue  # device memory: ask again for a CPU copy
        return Seen("__dlpack__", s.start, s.shape or [], None if values is None else b"".join(values),
                    bool(s.flags & abi.READ_ONLY) if s.versioned else None)
    return None


def observe(y, exporter) -> Seen:
    """The values of a consumer's result, read by the checker itself: through __dlpack__, the buffer
    protocol or __array_interface__, never through the consumer's own code."""
    if y is exporter:
        return Seen("its argument, returned as it came")
    if hasattr(type(y), "__dlpack__"):
        seen = _through_dlpack(y, exporter)
        if seen is not None:
            return seen
    try:
        start, shape, _, size, readonly, elements = abi.buffer_layout(y)
        return Seen("buffer", start, shape if size == 4 else None, b"".join(elements), readonly)
    except (TypeError, BufferError, ValueError):
        pass
    ai = getattr(y, "__array_interface__", None)
    if isinstance(ai, dict):
        start, readonly = ai["data"]
        shape, size = list(ai["shape"]), int(ai["typestr"][2:])
        strides = ai.get("strides")
        elems = None if strides is None else [s // size for s in strides]
        data = b"".join(abi.element_bytes(start, shape, elems, size)) if start or not all(shape) else None
        return Seen("__array_interface__", start, shape, data, bool(readonly))
    return Seen("nothing readable")


@dataclass
class Outcome:
    error: Optional[str]  # "Type: message" if the consumer raised
    got: str  # what it returned, briefly
    name: Optional[str]  # the capsule's name after the import
    kind: Optional[str]  # "dltensor" or "dltensor_versioned": what the consumer was handed
    seen: Optional[Seen]
    shared: Optional[bool]  # the result views the checker's memory
    writable: Optional[bool]
    deleted_while_alive: int
    deleted_after: int  # once the result is gone
    deleted_final: int  # once the capsules are let go too
    calls: list = field(default_factory=list)  # the consumer's own __dlpack__ calls

    def asked_versioned(self):
        return any((c.get("max_version") or (0,))[0] >= 1 for c in self.calls)

    def streams(self):
        """The streams other than None it passed (the checker's producers are on the CPU)."""
        return [c["stream"] for c in self.calls if c.get("stream") is not None]


def settle(condition, timeout=SETTLE_S):
    deadline = time.monotonic() + timeout
    gc.collect()
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
        gc.collect()


def run(consumer, exporter) -> Outcome:
    """One import, run to its end: the result inspected and dropped, then the capsules let go."""
    error = None
    try:
        y = consumer.consume(exporter)
    except Exception as exc:  # the verdict is the rule's; Ctrl-C still stops
        error, y = describe(exc), None
    calls = list(exporter.calls)  # before the checker asks anything itself
    got = "nothing" if error else f"a {type(y).__module__}.{type(y).__qualname__}"
    taken = exporter.taken()
    name = abi.capsule_name(taken.capsules[0]) if taken else None
    seen = observe(y, exporter) if y is not None else None
    writable = consumer.writable(y) if y is not None and seen and seen.data is not None else None
    if writable is None and seen is not None and seen.readonly is not None:
        writable = not seen.readonly
    shared = None if seen is None or seen.start is None else any(m.shares(seen.start) for m in exporter.made.values())
    alive = exporter.deleted
    owns = y is not None and name is not None and name.startswith("used_")
    del y
    if owns:  # it took the tensor, so its deleter call is due now (perhaps from another thread)
        settle(lambda: exporter.deleted >= 1)
    after = exporter.deleted
    exporter.drop()
    settle(lambda: exporter.deleted >= 1, 0.2)
    kind = None if taken is None else abi.VERSIONED if taken.versioned else abi.LEGACY
    return Outcome(error, got, name, kind, seen, shared, writable, alive, after, exporter.deleted, calls)
