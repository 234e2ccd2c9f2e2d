"""The requests a producer rule makes: every keyword value the array API names, their combinations, and
the exports they give, held alive together so that memory two of them share is seen as shared.

A rule about a flag, a copy or a device judges every export it makes, not one request: a producer can
be right for max_version=(1, 3) and wrong for the (1, 0) that the array API's own example consumer
asks, or right without keywords and wrong with copy=False or dl_device=(1, 0)."""

import itertools
from dataclasses import dataclass
from typing import Any

from . import abi
from .rules import Violation, describe

ABSENT = object()  # a keyword left out of the call, as opposed to passed as None
VPI = (9, 0)  # kDLVPI, the Verilog simulator: a device no array library can reach
CUDA = (2, 0)  # another device for a CPU array: reached by a copy, or refused
LEGACY_VERSIONS = (ABSENT, None, (0, 0), (0, 8))
VERSIONED_VERSIONS = ((1, 0), (1, 1), (1, 2), (1, 3), (1, 99), (2, 0))
MAX_VERSIONS = LEGACY_VERSIONS + VERSIONED_VERSIONS
COPIES = (ABSENT, None, False, True)
SHARING = (ABSENT, None, False)  # copy values that reuse the array's memory where it can be reused
# Every stream value the array API names besides None: -1 (no synchronization), 0 (ROCm's default,
# ambiguous on CUDA), 1 and 2 (CUDA's legacy and per-thread default streams), and a stream handle.
STREAMS = (-1, 0, 1, 2, 2 ** 40)


def spell(kw):
    args = ", ".join(f"{k}={v!r}" for k, v in kw.items() if v is not ABSENT)
    return f"__dlpack__({args})"


def call(obj, **kw):
    return obj.__dlpack__(**{k: v for k, v in kw.items() if v is not ABSENT})


def legacy_request(kw):
    mv = kw.get("max_version", ABSENT)
    return mv is ABSENT or mv is None or mv[0] < 1


def export(obj, **kw):
    """(capsule, Snapshot); Violation if __dlpack__ returns anything but an unused DLPack capsule."""
    capsule = call(obj, **kw)
    try:
        return capsule, abi.snapshot(capsule)
    except (TypeError, ValueError) as exc:
        raise Violation(f"{spell(kw)} returned {exc}") from None


def snap(obj, **kw):
    return export(obj, **kw)[1]


def requests(max_versions=MAX_VERSIONS, copies=COPIES, devices=(ABSENT,), streams=(ABSENT,)):
    """Every combination, as keyword dicts (ABSENT: left out)."""
    for mv, copy, device, stream in itertools.product(max_versions, copies, devices, streams):
        yield {"stream": stream, "max_version": mv, "dl_device": device, "copy": copy}


def own_devices(sample):
    """dl_device values that name the array's own device: absent, None, and its __dlpack_device__()."""
    return (ABSENT, None, tuple(int(v) for v in sample.obj.__dlpack_device__()))


def other_device(sample):
    """A device the array is not on: CUDA for a CPU array, the CPU for any other."""
    return CUDA if int(sample.obj.__dlpack_device__()[0]) in abi.CPU_LIKE else (1, 0)


@dataclass
class Made:
    """One export: the request, its capsule (kept alive) and what the capsule holds."""

    kw: dict
    capsule: Any
    s: abi.Snapshot

    @property
    def how(self):
        return spell(self.kw)


def export_all(obj, kws):
    """([Made], [(request, exception)]): every request's export, all alive together. A return that
    is no DLPack capsule is a Violation; a raised exception is collected for the rule to judge."""
    made, raised = [], []
    for kw in kws:
        try:
            capsule, s = export(obj, **kw)
        except Violation:
            raise
        except Exception as exc:  # whatever the producer raised; the rule decides
            raised.append((kw, exc))
            continue
        made.append(Made(kw, capsule, s))
    return made, raised


def extent(s):
    """[lo, hi): the bytes a snapshot's elements cover."""
    shape = s.shape or []
    if any(n == 0 for n in shape):
        return s.start, s.start
    strides = s.strides if s.strides is not None else abi.row_major(shape)
    lo = sum((n - 1) * st for n, st in zip(shape, strides) if st < 0)
    hi = sum((n - 1) * st for n, st in zip(shape, strides) if st > 0)
    size = abi.itemsize(s.dtype)
    return s.start + lo * size, s.start + (hi + 1) * size


def overlap(a, b):
    (alo, ahi), (blo, bhi) = extent(a), extent(b)
    return alo < bhi and blo < ahi and a.device == b.device


def is_copy(m, made):
    """Whether `m` shares no byte with any other export alive beside it: a copy, which the consumer
    owns alone and may write (whether it says IS_COPIED is the copy rules' to judge)."""
    return not any(other is not m and overlap(m.s, other.s) for other in made)


def examples(items, n=3):
    """'a; b; c (and 4 more)'."""
    items = list(items)
    more = f" (and {len(items) - n} more)" if len(items) > n else ""
    return "; ".join(items[:n]) + more


def refusals(raised):
    return [f"{spell(kw)}: {describe(exc)}" for kw, exc in raised]
