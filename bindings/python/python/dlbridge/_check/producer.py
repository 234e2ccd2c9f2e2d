"""Producer rules: what `__dlpack__` and `__dlpack_device__` must do, probed on the target's arrays.
Capsules are read through ctypes (abi.py) and never consumed; the lifetime rules are in lifetime.py."""

import itertools

from . import abi
from .rules import MUST, SHOULD, NotApplicable, Permitted, Violation, describe, expect, rule

ABSENT = object()  # a keyword left out of the call, as opposed to passed as None
VPI = (9, 0)  # kDLVPI, the Verilog simulator: a device no array library can reach
LEGACY_VERSIONS = (ABSENT, None, (0, 0), (0, 8))
VERSIONED_VERSIONS = ((1, 0), (1, 1), (1, 2), (1, 3), (1, 99), (2, 0))


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


def offers_versioned(sample):
    """Whether the producer answers max_version=(1, 3) with a versioned capsule."""
    return snap(sample.obj, max_version=(1, 3)).versioned


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


def refuses_legacy(sample):
    try:
        call(sample.obj)
    except BufferError:
        return True
    return False


def each_export(sample):
    """(call, Snapshot) for a legacy and a versioned request; a legacy BufferError is skipped (the
    negotiation and read-only rules judge those)."""
    for kw in ({}, {"max_version": (1, 3)}):
        try:
            yield spell(kw), snap(sample.obj, **kw)
        except BufferError:
            if kw:
                raise


def makes_capsules(sample):
    """Evidence that the producer exports at all, before a rule judges how it refuses: a versioned or a
    legacy request gives a DLPack capsule (Violation for anything else)."""
    for kw in ({"max_version": (1, 3)}, {}):
        try:
            export(sample.obj, **kw)
            return
        except BufferError:
            continue
    raise Violation("__dlpack__ refused both a versioned and a legacy request")


def cpu_sample(target, kind="plain"):
    sample = target.producer.sample(kind)
    device = sample.obj.__dlpack_device__()
    if int(device[0]) not in abi.CPU_LIKE:
        raise NotApplicable(f"the {kind} array is on device {tuple(device)}, not CPU")
    return sample


@rule("producer.keywords", "__dlpack__ accepts every keyword combination the method allows", MUST, "array-api",
      "array.__dlpack__, signature",
      """array.__dlpack__(*, stream: int | Any | None = None, max_version: tuple[int, int] | None = None,
      dl_device: tuple[Enum, int] | None = None, copy: bool | None = None) PyCapsule [checker's note: the signature
      a conforming array implements; BufferError for a legacy request is allowed: "from March 2025 onwards ...
      it's okay to raise BufferError here"]""")
def keywords(target):
    sample = target.producer.sample("plain")
    own = sample.obj.__dlpack_device__()
    combos = itertools.product((ABSENT, None), (*LEGACY_VERSIONS, *VERSIONED_VERSIONS), (ABSENT, None, own),
                               (ABSENT, None, False, True))
    bad, count = [], 0
    for stream, mv, device, copy in combos:
        kw = dict(stream=stream, max_version=mv, dl_device=device, copy=copy)
        count += 1
        try:
            export(sample.obj, **kw)
        except BufferError as exc:
            if not legacy_request(kw):
                bad.append(f"{spell(kw)}: {describe(exc)}")
        except Violation as exc:
            bad.append(str(exc))
        except Exception as exc:
            bad.append(f"{spell(kw)}: {describe(exc)}")
    expect(not bad, f"{len(bad)} of {count} calls failed, e.g. " + "; ".join(bad[:3]))
    return f"{count} calls"


@rule("producer.negotiation", "the capsule kind follows max_version: legacy below 1.0, else versioned or legacy",
      SHOULD, "array-api", "array.__dlpack__, Notes",
      """It is recommended for the producer to use this logic in the implementation of __dlpack__: if max_version
      is None: # Keep and use the DLPack 0.X implementation ... if we're at a higher major version internally, did
      we keep an implementation of the older major version around? ... If so, use that. Else, the producer should
      raise a BufferError""")
def negotiation(target):
    sample = target.producer.sample("plain")
    seen = []
    for mv in (*LEGACY_VERSIONS, *VERSIONED_VERSIONS):
        kw = {"max_version": mv}
        try:
            s = snap(sample.obj, **kw)
        except BufferError:
            expect(legacy_request(kw), f"{spell(kw)} raised BufferError, though a 1.x consumer reads any 1.x capsule")
            seen.append(f"{mv}: BufferError")
            continue
        if legacy_request(kw):
            expect(not s.versioned,
                   f"{spell(kw)} returned a dltensor_versioned capsule, which a 0.x consumer cannot read")
        elif s.versioned:
            expect(1 <= s.version[0] <= mv[0],
                   f"{spell(kw)} returned version {s.version[0]}.{s.version[1]}, a major the consumer did not offer")
        seen.append(f"{'absent' if mv is ABSENT else mv}: {s.name}")
    return "; ".join(seen)


@rule("producer.versioned", "max_version >= (1, 0) gets a versioned capsule from a producer that makes them",
      SHOULD, "array-api", "array.__dlpack__, parameter max_version",
      """This method may return a capsule of version max_version (recommended if it does support that), or of a
      different version. This means the consumer must verify the version even when max_version is passed.""")
def versioned(target):
    sample = target.producer.sample("plain")
    got = {mv: snap(sample.obj, max_version=mv) for mv in ((1, 0), (1, 3))}
    if not any(s.versioned for s in got.values()):
        raise Permitted("legacy capsules only, whatever max_version: \"or of a different version\" allows it")
    for mv, s in got.items():
        expect(s.versioned, f"__dlpack__(max_version={mv}) returned a legacy '{s.name}' capsule, though the producer "
                            "makes versioned ones")


@rule("producer.version-field",
      "a versioned capsule carries the producer's own 1.x version, whatever 1.x or later was asked", SHOULD,
      "array-api", "array.__dlpack__, Notes",
      """if max_version >= our_own_dlpack_version: # Consumer understands us, just return a Capsule with our max
      version elif max_version[0] == our_own_dlpack_version[0]: # major versions match, we should
      still be fine here - return our own max version""")
def version_field(target):
    sample = target.producer.sample("plain")
    versions = {}
    for mv in VERSIONED_VERSIONS:
        s = snap(sample.obj, max_version=mv)
        if s.versioned:
            versions[mv] = s.version
    if not versions:
        raise NotApplicable("the producer gives legacy capsules only")
    bad = {mv: v for mv, v in versions.items() if v[0] != 1}
    expect(not bad, f"major version is not 1: {bad}")
    distinct = set(versions.values())
    expect(len(distinct) == 1, f"the version depends on max_version: {versions}")
    return "version {}.{}".format(*distinct.pop())


@rule("producer.unknown-keyword", "an unknown keyword raises TypeError", SHOULD, "array-api",
      "array.__dlpack__, Notes",
      """And this logic for the consumer in from_dlpack(): try: x.__dlpack__(max_version=(1, 0), ...) ... except
      TypeError: x.__dlpack__(...) This logic is also applicable to handling of the new dl_device and copy
      keywords. [checker's note: the recommended fallback works only if a producer raises TypeError for a
      keyword it does not take]""")
def unknown_keyword(target):
    sample = target.producer.sample("plain")
    makes_capsules(sample)
    for kw in ({"not_a_dlpack_keyword": 1}, {"max_version": (1, 0), "not_a_dlpack_keyword": None}):
        try:
            sample.obj.__dlpack__(**kw)
        except TypeError:
            continue
        except Exception as exc:
            raise Violation(f"__dlpack__(**{kw}) raised {describe(exc)}, not TypeError") from None
        raise Violation(f"__dlpack__(**{kw}) returned a capsule")


@rule("producer.keyword-only", "a positional argument raises TypeError (the keywords are keyword-only)", MUST,
      "array-api", "array.__dlpack__, signature",
      """array.__dlpack__(*, stream: int | Any | None = None, max_version: tuple[int, int] | None = None, ...
      [checker's note: the "*" makes every parameter keyword-only]""")
def keyword_only(target):
    sample = target.producer.sample("plain")
    makes_capsules(sample)
    try:
        sample.obj.__dlpack__(None)
    except TypeError:
        return None
    except Exception as exc:
        raise Violation(f"__dlpack__(None) raised {describe(exc)}, not TypeError") from None
    raise Violation("__dlpack__(None) returned a capsule")


@rule("producer.readonly-flag", "a read-only array's versioned capsule has READ_ONLY set", MUST, "dlpack.h",
      "DLPACK_FLAG_BITMASK_READ_ONLY",
      """bit mask to indicate that the tensor is read only. #define DLPACK_FLAG_BITMASK_READ_ONLY (1UL << 0UL)
      [checker's note: a versioned capsule without it says the tensor may be written]""")
def readonly_flag(target):
    sample = target.producer.sample("readonly")
    s = snap(sample.obj, max_version=(1, 3))
    if not s.versioned:
        raise NotApplicable("the producer gives legacy capsules only (see producer.readonly-legacy)")
    expect(s.flags & abi.READ_ONLY, f"flags are {s.flags}: READ_ONLY is not set")


@rule("producer.readonly-legacy", "a read-only array's legacy capsule is refused with BufferError, or given",
      SHOULD, "array-api", "array.__dlpack__, Raises",
      """BufferError - Implementations should raise BufferError when the data cannot be exported as DLPack (e.g.,
      incompatible dtype or strides). [checker's note: only DLManagedTensorVersioned has flags, so a legacy capsule
      cannot say the data is read-only. No sentence requires refusing it (NumPy refuses, JAX exports); a refusal
      should be a BufferError]""")
def readonly_legacy(target):
    sample = target.producer.sample("readonly")
    makes_capsules(sample)
    given = []
    for kw in ({}, {"max_version": (0, 8)}, {"copy": False}):
        try:
            s = snap(sample.obj, **kw)
        except BufferError:
            continue
        except Violation:
            raise
        except Exception as exc:
            raise Violation(f"{spell(kw)} of a read-only array raised {describe(exc)}, not BufferError") from None
        given.append(f"{spell(kw)} gave '{s.name}'")
    if given:
        raise Permitted(f"exports read-only arrays as legacy capsules, which cannot say so ({'; '.join(given)}); "
                        "no sentence requires a refusal")
    return "refused with BufferError"


@rule("producer.copy-true", "copy=True gives fresh memory with the same values, and IS_COPIED", MUST, "array-api",
      "array.__dlpack__, parameter copy",
      """copy - If True, the function must always copy (performed by the producer). ... When a copy happens, the
      DLPACK_FLAG_BITMASK_IS_COPIED flag must be set.""")
def copy_true(target):
    sample = target.producer.sample("plain")
    original, src = export(sample.obj, copy=False, max_version=(1, 3))
    want = abi.values_of(src)
    checked = []
    for kw in ({"copy": True, "max_version": (1, 3)}, {"copy": True}):
        try:
            keep, s = export(sample.obj, **kw)
        except BufferError as exc:
            if legacy_request(kw) and refuses_legacy(sample):
                continue  # it refuses legacy capsules outright, which the array API allows
            raise Violation(f"{spell(kw)} raised {describe(exc)}") from None
        lo, hi = extent(s)
        slo, shi = extent(src)
        expect(hi <= slo or lo >= shi or lo == hi, f"{spell(kw)} returned memory overlapping the array's")
        if want is not None:
            expect(abi.values_of(s) == want, f"{spell(kw)} returned different values")
        if s.versioned:
            expect(s.flags & abi.IS_COPIED, f"{spell(kw)} copied but left IS_COPIED unset (flags={s.flags})")
        checked.append(s.name)
        del keep
    expect(checked, "no copy=True call succeeded")
    return ", ".join(checked)


@rule("producer.copy-false", "copy=False (and None) share the array's memory, without IS_COPIED", MUST,
      "array-api", "array.__dlpack__, parameter copy",
      """If False, the function must never copy, and raise a BufferError in case a copy is deemed necessary ... If
      None, the function must reuse the existing memory buffer if possible and copy otherwise.""")
def copy_false(target):
    sample = cpu_sample(target)
    mv = (1, 3) if offers_versioned(sample) else ABSENT
    held, starts = [], set()
    for copy in (False, False, None, ABSENT):  # alive together: a copying producer would need fresh memory each
        capsule, s = export(sample.obj, max_version=mv, copy=copy)
        held.append(capsule)
        starts.add(s.start)
        if s.versioned and copy is False:
            expect(not s.flags & abi.IS_COPIED, f"copy=False returned a capsule with IS_COPIED (flags={s.flags})")
    expect(len(starts) == 1, f"exports alive together have {len(starts)} different data pointers: they copied")


@rule("producer.dl-device", "a dl_device the producer cannot reach raises BufferError", MUST, "array-api",
      "array.__dlpack__, parameter dl_device",
      """dl_device ... If the device type cannot be handled by the producer, this function must raise BufferError.""")
def dl_device(target):
    sample = target.producer.sample("plain")
    makes_capsules(sample)
    for kw in ({"dl_device": VPI}, {"dl_device": VPI, "copy": True}, {"dl_device": VPI, "max_version": (1, 3)}):
        try:
            s = snap(sample.obj, **kw)
        except BufferError:
            continue
        except Exception as exc:
            raise Violation(f"{spell(kw)} (kDLVPI) raised {describe(exc)}, not BufferError") from None
        raise Violation(f"{spell(kw)} (kDLVPI) returned a capsule on device {s.device}")


@rule("producer.stream-cpu", "a CPU array refuses a stream other than None (-1, no synchronization, is noted)",
      SHOULD, "array-api", "array.__dlpack__, parameter stream",
      """If stream is -1, the value may be used by the consumer to signal "producer must not perform any
      synchronization". ... On CPU and other device types without streams, only None is accepted. [checker's note:
      the sentence says what a CPU array takes, not that it must raise for anything else]""")
def stream_cpu(target):
    sample = cpu_sample(target)
    makes_capsules(sample)
    accepted = []
    for stream, mv in itertools.product((1, 2, -1), (ABSENT, (1, 3))):
        try:
            call(sample.obj, stream=stream, max_version=mv)
        except Exception:
            continue
        accepted.append((stream, spell({"stream": stream, "max_version": mv})))
    expect(all(stream == -1 for stream, _ in accepted), f"accepted: {', '.join(how for _, how in accepted)}")
    if accepted:
        raise Permitted("accepted stream=-1 (\"producer must not perform any synchronization\"), which a CPU array "
                        "can honour")


@rule("producer.device", "__dlpack_device__() is the device in the capsule, as a 2-tuple of ints", MUST,
      "array-api", "array.__dlpack__, parameter dl_device",
      """dl_device ... When specified, the format must be a 2-tuple, following that of the return value of
      array.__dlpack_device__().""")
def device(target):
    for kind in ("plain", "0-d", "zero-size"):
        sample = target.producer.sample(kind)
        got = sample.obj.__dlpack_device__()
        expect(isinstance(got, tuple) and len(got) == 2 and all(isinstance(v, int) for v in got),
               f"__dlpack_device__() of the {kind} array returned {got!r}")
        for _, s in each_export(sample):
            expect(s.device == tuple(int(v) for v in got),
                   f"{kind} array: __dlpack_device__() is {tuple(got)} but the {s.name} capsule says {s.device}")
