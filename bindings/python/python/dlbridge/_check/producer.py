"""Producer rules: what `__dlpack__` and `__dlpack_device__` must do, probed on the target's arrays.
Capsules are read through ctypes (abi.py) and never consumed. A rule about a flag, a copy, a device or
a stream judges every request it is about (exports.py), each export it makes; the lifetime rules are
in lifetime.py."""

from . import abi
from .exports import (ABSENT, COPIES, LEGACY_VERSIONS, MAX_VERSIONS, SHARING, STREAMS, VERSIONED_VERSIONS, VPI, call,
                      examples, export, export_all, legacy_request, other_device, overlap, own_devices, requests, snap,
                      is_copy, spell)
from .rules import MUST, SHOULD, NotApplicable, Permitted, Violation, describe, expect, rule

__all__ = ["call", "each_export", "export"]  # for the other rule modules


def offers_versioned(sample):
    """Whether the producer answers max_version=(1, 3) with a versioned capsule."""
    return snap(sample.obj, max_version=(1, 3)).versioned


def exports(sample, kw):
    """Whether the request gives a capsule (rather than raising)."""
    try:
        call(sample.obj, **kw)
    except Exception:
        return False
    return True


def each_export(sample):
    """(call, Snapshot) for every max_version. The plain legacy request may be refused with BufferError
    and the (1, 3) one must export; the others are judged where they export (the keywords and
    negotiation rules judge their refusals)."""
    for mv in MAX_VERSIONS:
        kw = {} if mv is ABSENT else {"max_version": mv}
        try:
            s = snap(sample.obj, **kw)
        except Violation:
            raise
        except BufferError:
            if mv == (1, 3):
                raise
            continue
        except Exception:
            if mv in (ABSENT, (1, 3)):
                raise
            continue
        yield spell(kw), s


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
    bad, count = [], 0
    for kw in requests(MAX_VERSIONS, COPIES, own_devices(sample), (ABSENT, None)):
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
    for mv in MAX_VERSIONS:
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
    got = {mv: snap(sample.obj, max_version=mv) for mv in VERSIONED_VERSIONS}
    if not any(s.versioned for s in got.values()):
        raise Permitted("legacy capsules only, whatever max_version: \"or of a different version\" allows it")
    legacy = [f"__dlpack__(max_version={mv})" for mv, s in got.items() if not s.versioned]
    expect(not legacy, f"{examples(legacy)} returned a legacy capsule, though the producer makes versioned ones")


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


@rule("producer.readonly-flag", "every versioned capsule of a read-only array has READ_ONLY set, whatever was asked",
      MUST, "dlpack.h", "DLPACK_FLAG_BITMASK_READ_ONLY, DLPACK_FLAG_BITMASK_IS_COPIED",
      """bit mask to indicate that the tensor is read only. #define DLPACK_FLAG_BITMASK_READ_ONLY (1UL << 0UL) ...
      bit mask to indicate that the tensor is a copy made by the producer. If set, the tensor is considered solely
      owned throughout its lifetime by the consumer, until the producer-provided deleter is invoked. [checker's
      note: a versioned capsule without READ_ONLY says the tensor may be written, so every request (each
      max_version, copy and dl_device) must keep it; only a copy the consumer owns alone may leave it out]""")
def readonly_flag(target):
    sample = target.producer.sample("readonly")
    if not snap(sample.obj, max_version=(1, 3)).versioned:
        raise NotApplicable("the producer gives legacy capsules only (see producer.readonly-legacy)")
    devices = (*own_devices(sample), other_device(sample))
    made, _ = export_all(sample.obj, requests(devices=devices))  # refusals are other rules' to judge
    versioned = [m for m in made if m.s.versioned]
    copies = [m for m in versioned if is_copy(m, made)]
    unmarked = [m for m in versioned if not m.s.flags & abi.READ_ONLY and m not in copies]
    expect(not unmarked, f"READ_ONLY is not set in {len(unmarked)} of the {len(versioned)} versioned capsules of the "
                         "read-only array: " + examples(f"{m.how} (flags={m.s.flags})" for m in unmarked))
    return f"{len(versioned)} versioned capsules" + (f", {len(copies)} of them copies" if copies else "")


@rule("producer.readonly-legacy", "a read-only array's legacy capsule is refused with BufferError, or given",
      SHOULD, "array-api", "array.__dlpack__, Raises",
      """BufferError - Implementations should raise BufferError when the data cannot be exported as DLPack (e.g.,
      incompatible dtype or strides). [checker's note: only DLManagedTensorVersioned has flags, so a legacy capsule
      cannot say the data is read-only. No sentence requires refusing it (NumPy refuses, JAX exports); a refusal
      should be a BufferError]""")
def readonly_legacy(target):
    sample = target.producer.sample("readonly")
    makes_capsules(sample)
    made, raised = export_all(sample.obj, requests(LEGACY_VERSIONS, SHARING, own_devices(sample)))
    wrong = [f"{spell(kw)} raised {describe(exc)}" for kw, exc in raised if not isinstance(exc, BufferError)]
    expect(not wrong, "a read-only array's legacy request: " + examples(wrong) + ", not BufferError")
    given = [f"{m.how} gave '{m.s.name}'" for m in made]
    if given:
        raise Permitted(f"exports read-only arrays as legacy capsules, which cannot say so ({examples(given)}); "
                        "no sentence requires a refusal")
    return f"{len(raised)} legacy requests refused with BufferError"


@rule("producer.copy-true", "copy=True gives fresh memory with the same values, and IS_COPIED, in every request",
      MUST, "array-api", "array.__dlpack__, parameter copy",
      """copy - If True, the function must always copy (performed by the producer). ... When a copy happens, the
      DLPACK_FLAG_BITMASK_IS_COPIED flag must be set. [checker's note: each max_version and dl_device; copies alive
      together share no memory, as each consumer owns its copy alone]""")
def copy_true(target):
    sample = target.producer.sample("plain")
    original, src = export(sample.obj, copy=False, max_version=(1, 3))
    want = abi.values_of(src)
    made, raised = export_all(sample.obj, requests(copies=(True,), devices=own_devices(sample)))
    # A request refused without copy=True too (a legacy or 0.x one, say) is other rules' to judge
    failed = [f"{spell(kw)} raised {describe(exc)}" for kw, exc in raised if exports(sample, {**kw, "copy": ABSENT})]
    expect(not failed, examples(failed))
    for m in made:
        expect(not overlap(m.s, src), f"{m.how} returned memory overlapping the array's")
        twin = next((o for o in made if o is not m and overlap(m.s, o.s)), None)
        expect(twin is None, f"{m.how} and {twin.how if twin else ''} returned the same memory, which each "
                             "consumer would own alone")
        if want is not None:
            expect(abi.values_of(m.s) == want, f"{m.how} returned different values")
        if m.s.versioned:
            expect(m.s.flags & abi.IS_COPIED, f"{m.how} copied but left IS_COPIED unset (flags={m.s.flags})")
    expect(made, "no copy=True call succeeded")
    return f"{len(made)} copies: " + ", ".join(sorted({m.s.name for m in made}))


@rule("producer.copy-false", "copy=False, None or absent share the array's memory, without IS_COPIED", MUST,
      "array-api", "array.__dlpack__, parameter copy",
      """If False, the function must never copy, and raise a BufferError in case a copy is deemed necessary ... If
      None, the function must reuse the existing memory buffer if possible and copy otherwise. [checker's note:
      dlpack.h's IS_COPIED says "the tensor is considered solely owned throughout its lifetime by the consumer",
      so on memory the array still shares it lets the consumer write the array: each max_version and dl_device,
      for plain and read-only arrays]""")
def copy_false(target):
    sample = cpu_sample(target)
    mv = (1, 3) if offers_versioned(sample) else ABSENT
    # These must export, alive together: a copying producer would need fresh memory for each
    held = [export(sample.obj, max_version=mv, copy=copy) for copy in (False, False, None, ABSENT)]
    start = held[0][1].start
    made, _ = export_all(sample.obj, requests(copies=SHARING, devices=own_devices(sample)))
    moved = [m.how for m in made if m.s.start != start] + [spell({"copy": c}) for c, (_, s) in
                                                           zip((False, False, None, ABSENT), held) if s.start != start]
    expect(not moved, f"exports alive together have different data pointers, so these copied: {examples(moved)}")
    judged = list(made)
    try:
        readonly = target.producer.sample("readonly")
    except NotApplicable:
        readonly = None
    if readonly is not None:
        ro, _ = export_all(readonly.obj, requests(copies=SHARING, devices=own_devices(readonly)))
        # a legacy capsule cannot say read-only, so copy=None may copy one; the rest must share
        ro = [m for m in ro if m.s.versioned or m.kw["copy"] is False]
        starts = {m.s.start for m in ro}
        expect(len(starts) <= 1, "the read-only array's exports alive together have different data pointers: "
                                 + examples(f"{m.how} at {m.s.start:#x}" for m in ro))
        judged += ro
    flagged = [m.how for m in judged if m.s.versioned and m.s.flags & abi.IS_COPIED]
    flagged += [spell({"copy": c}) for c, (_, s) in zip((False, False, None, ABSENT), held)
                if s.versioned and s.flags & abi.IS_COPIED]
    expect(not flagged, f"IS_COPIED set on memory the array still shares (a consumer may then write it), in "
                        f"{len(flagged)} of {len(judged) + len(held)} exports: {examples(flagged)}")
    return f"{len(judged) + len(held)} exports share the array's memory"


@rule("producer.dl-device", "a dl_device the producer cannot reach raises BufferError, and so does one that needs a "
      "copy under copy=False", MUST, "array-api", "array.__dlpack__, parameters dl_device and copy",
      """dl_device ... If the device type cannot be handled by the producer, this function must raise BufferError.
      ... copy ... If False, the function must never copy, and raise a BufferError in case a copy is deemed
      necessary (e.g. if a cross-device data movement is requested, and it is not possible without a copy). ... When
      a copy happens, the DLPACK_FLAG_BITMASK_IS_COPIED flag must be set. [checker's note: kDLVPI, which no array
      library reaches, and another device (CUDA for a CPU array), in every max_version and copy; moving a device
      array to the CPU under copy=False may raise ValueError too: "If a copy must be made to enable this support but
      copy is set to False, the function must raise ValueError"]""")
def dl_device(target):
    sample = target.producer.sample("plain")
    makes_capsules(sample)
    made, raised = export_all(sample.obj, requests(devices=(VPI,)))
    bad = [f"{m.how} (kDLVPI) returned a capsule on device {m.s.device}" for m in made]
    bad += [f"{spell(kw)} (kDLVPI) raised {describe(exc)}, not BufferError" for kw, exc in raised
            if not isinstance(exc, BufferError)]
    other = other_device(sample)
    made, raised = export_all(sample.obj, requests(devices=(other,)))
    for m in made:
        if m.kw["copy"] is False:
            bad.append(f"{m.how} returned a capsule on {m.s.device}, though the array is on another device")
        elif m.s.device != other:
            bad.append(f"{m.how} returned a capsule on device {m.s.device}")
        elif m.s.versioned and not m.s.flags & abi.IS_COPIED:
            bad.append(f"{m.how} copied to {other} but left IS_COPIED unset (flags={m.s.flags})")
    to_cpu = ValueError if other == (1, 0) else BufferError  # the dl_device sentence, for a move to the CPU
    for kw, exc in raised:
        if not isinstance(exc, (BufferError, to_cpu) if kw["copy"] is False else BufferError):
            bad.append(f"{spell(kw)} raised {describe(exc)}, not BufferError")
    expect(not bad, examples(bad))
    return f"kDLVPI refused; {other}: {len(made)} copies, {len(raised)} refusals"


@rule("producer.stream-cpu", "a CPU array refuses a stream other than None (-1, no synchronization, is noted)",
      SHOULD, "array-api", "array.__dlpack__, parameter stream",
      """If stream is -1, the value may be used by the consumer to signal "producer must not perform any
      synchronization". ... On CPU and other device types without streams, only None is accepted. ... When dl_device
      is provided explicitly, stream must be a valid construct for the specified device type. In particular, when
      kDLCPU is in use, stream must be None [checker's note: the sentence says what a CPU array takes, not that it
      must raise for anything else. Tried: -1, 0, 1, 2 and a stream handle, with and without max_version,
      dl_device and copy=True]""")
def stream_cpu(target):
    sample = cpu_sample(target)
    makes_capsules(sample)
    accepted, count = [], 0
    own = own_devices(sample)[2]
    for kw in requests((ABSENT, (1, 3)), (ABSENT, True), (ABSENT, own), STREAMS):
        count += 1
        try:
            call(sample.obj, **kw)
        except Exception:
            continue
        accepted.append(kw)
    wrong = [spell(kw) for kw in accepted if kw["stream"] != -1]
    expect(not wrong, f"accepted {len(wrong)} of {count} requests with a stream: {examples(wrong)}")
    if accepted:
        raise Permitted("accepted stream=-1 (\"producer must not perform any synchronization\"), which a CPU array "
                        "can honour")
    return f"{count} requests with a stream refused"


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
        found = [(how, s) for how, s in each_export(sample)]
        made, _ = export_all(sample.obj, requests((ABSENT, (1, 3)), (ABSENT,), own_devices(sample)[1:]))
        for how, s in found + [(m.how, m.s) for m in made]:
            expect(s.device == tuple(int(v) for v in got),
                   f"{kind} array: __dlpack_device__() is {tuple(got)} but {how} says {s.device}")
