"""Consumer rules, driven by capsules the checker builds (harness.Exporter over abi.Managed): how the
consumer takes ownership, which layouts it reads right, and which tensors it must refuse.

A rule passes only on evidence: the consumer asked for the capsule (called __dlpack__), and the
values of what it returned, read by the checker itself (harness.observe), are the tensor's."""

import struct

from . import abi
from .harness import Exporter, NoDeviceCopyExporter, PreVersionExporter, floats, numbered, run
from .rules import MUST, SHOULD, NotApplicable, Permitted, Violation, expect, rule

SHAPE = (3, 4)
HOLD = ("The consumer must transer ownership of the DLManangedTensor from the capsule to its own object. It does so "
        "by renaming the capsule to \"used_dltensor\"")  # sic
DELETER_SENTENCE = ("The consumer must set the PyCapsule name to \"used_dltensor\", and call the deleter of the "
                    "DLPackManagedTensor when it no longer needs the data.")


def plain(**fields):
    """build(versioned) for a float32 (3, 4) tensor holding 1..12, row-major, with `fields` applied."""

    def build(versioned):
        shape = fields.get("shape", SHAPE)
        m = abi.Managed(fields.get("payload", numbered(12)), shape, fields.get("dtype", (2, 32, 1)),
                        fields.get("strides", abi.row_major(shape)), versioned, fields.get("version", (1, 3)),
                        fields.get("flags", 0), fields.get("byte_offset", 0), fields.get("data_at", 0),
                        fields.get("payload_at"))
        for name in ("data", "ndim", "shape", "strides"):
            if name + "_raw" in fields:
                setattr(m.tensor, name, fields[name + "_raw"])
        return m

    return build


def show(data):
    """float32 values, as the probes write them."""
    n = len(data) // 4
    values = struct.unpack(f"={min(n, 6)}f", data[:min(n, 6) * 4])
    return "[" + ", ".join(f"{v:g}" for v in values) + (", ...]" if n > 6 else "]")


def asked(out):
    """Evidence that the consumer took part: it called __dlpack__, and was handed the capsule."""
    expect(out.calls, f"it never called __dlpack__ (it returned {out.got}{', raising ' + out.error if out.error else ''})")
    if out.kind is None:  # every call was refused, so it never had the tensor
        streams = out.streams()
        why = f"it passed stream={streams[0]!r} to a CPU producer; " if streams else ""
        raise Violation(f"{why}every __dlpack__ call it made was refused ({out.calls}): {out.error}")


def accepted(out, want=numbered(12), shape=SHAPE):
    """Checks an import that must succeed and show `want` (bytes, row-major) in `shape`, read by the checker."""
    asked(out)
    expect(out.error is None, f"refused: {out.error}")
    expect(out.seen is not None and out.seen.data is not None,
           f"it returned {out.got}, whose values the checker cannot read ({out.seen.how if out.seen else 'nothing'}; "
           "it reads __dlpack__, the buffer protocol and __array_interface__)")
    expect(out.seen.data == want, f"wrong values through {out.seen.how}: {show(out.seen.data)}, want {show(want)}")
    if out.seen.shape is not None:
        expect(list(out.seen.shape) == list(shape), f"shape {out.seen.shape}, want {list(shape)}")
    shared = "" if out.shared is None or not want else ", zero-copy" if out.shared else ", copied"
    return f"read through {out.seen.how}{shared}"


def refused(out):
    """Checks an import that must be refused, with our deleter called exactly once all the same."""
    asked(out)
    expect(out.error is not None, f"imported it (result read through {out.seen.how if out.seen else '?'})")
    expect(out.deleted_final == 1, f"raised {out.error}, but the deleter ran {out.deleted_final} times, not once")
    return out.error


def accepted_or_refused(out, why, **want):
    """A layout DLPack describes but no sentence makes every consumer take: read right, or refused
    cleanly (an exception, the deleter once), which is noted."""
    if out.error is not None:
        raise Permitted(f"refused: {refused(out)} ({why})")
    return accepted(out, **want)


def versioned_only(out):
    if out.kind != abi.VERSIONED:
        raise NotApplicable("the consumer asks for legacy capsules only (see consumer.asks-versioned)")


@rule("consumer.renames", "an imported capsule is renamed used_dltensor[_versioned]", MUST, "python-spec",
      "Implementation", HOLD)
def renames(target):
    out = run(target.consumer, Exporter(plain()))
    accepted(out)
    expect(out.name == "used_" + out.kind, f"after the import the capsule is named {out.name!r}")


@rule("consumer.deleter", "the deleter runs exactly once, after the consumer's array is gone", MUST, "interchange",
      "Implementation", DELETER_SENTENCE)
def deleter(target):
    out = run(target.consumer, Exporter(plain()))
    accepted(out)
    if out.shared is not False:
        expect(out.deleted_while_alive == 0,
               f"the deleter ran {out.deleted_while_alive} times while the result still viewed the memory")
    took = out.name.startswith("used_")
    if took:
        expect(out.deleted_after == 1, f"after the result was freed the deleter had run {out.deleted_after} times")
    expect(out.deleted_final == 1, f"the deleter ran {out.deleted_final} times in all")
    return "" if took else "it keeps the capsule rather than renaming it; the capsule's destructor freed the tensor"


@rule("consumer.used-capsule", "a capsule already used is refused, and not freed", MUST, "interchange",
      "Implementation", """The __dlpack__ method will produce a PyCapsule containing a DLPackManagedTensor, which will be
      consumed immediately within from_dlpack - therefore it is consumed exactly once""")
def used_capsule(target):
    out = run(target.consumer, Exporter(plain(), prefix="used_"))
    asked(out)
    expect(out.error is not None, f"imported a capsule named {out.name!r}")
    expect(out.deleted_final == 0, f"refused it, but called the deleter of a tensor another consumer owns "
                                   f"({out.deleted_final} times)")
    return out.error


@rule("consumer.readonly", "a READ_ONLY tensor is imported read-only, copied, or (without read-only arrays) "
      "writable; not refused", SHOULD, "array-api", "array.__dlpack__, Notes",
      """A consumer that does not support read-only arrays should ignore this flag (this is preferred over raising
      an exception; the user is then responsible for ensuring the memory isn't modified).""")
def readonly(target):
    out = run(target.consumer, Exporter(plain(flags=abi.READ_ONLY)))
    asked(out)
    versioned_only(out)
    expect(out.error is None, f"raised {out.error}; ignoring the flag is preferred over raising")
    accepted(out)
    if out.shared is False:
        return "copied"
    if out.writable is None:
        raise NotApplicable(f"cannot tell whether the result ({out.seen.how}) is writable")
    if not out.writable:
        return "read-only"
    ignores = target.consumer.ignores_readonly
    expect(ignores is not False, f"the result views the READ_ONLY memory and is writable, though {target.name} "
                                 "has read-only arrays")
    why = "as it has no read-only arrays" if ignores else "as a consumer without read-only arrays should"
    raise Permitted(f"writable view of READ_ONLY memory: it ignores the flag, {why}")


@rule("consumer.null-strides", "NULL strides from a legacy or pre-1.2 producer mean row-major", MUST, "dlpack.h",
      "DLTensor.strides", """Before DLPack v1.2, strides can be NULL to indicate contiguous data. [checker's note: so
      a consumer of such producers reads NULL as row-major]""")
def null_strides(target):
    out = run(target.consumer, Exporter(plain(strides=None, version=(1, 1))))
    return accepted(out)


STRIDED = "DLPack describes it, but no sentence makes every consumer take every layout"


@rule("consumer.negative-strides", "negative strides are read right (or refused cleanly, noted)", MUST, "dlpack.h",
      "DLTensor.strides", """strides of the tensor (in number of elements, not bytes) [checker's note: int64_t, so
      signed; a consumer that takes them must read them right]""")
def negative_strides(target):
    # data points at the last of 12 floats stored 12..1, so element [i, j] is 12 - (11 - 4i - j)
    reversed_payload = floats([float(12 - k) for k in range(12)])
    out = run(target.consumer, Exporter(plain(payload=reversed_payload, strides=(-4, -1), data_at=44, payload_at=0)))
    return accepted_or_refused(out, STRIDED)


@rule("consumer.zero-strides", "zero strides (a broadcast) are read right (or refused cleanly, noted)", MUST,
      "dlpack.h", "DLTensor.strides", """strides of the tensor (in number of elements, not bytes) ... must points to
      an array of ndim elements [checker's note: a stride of 0 repeats an element; a consumer that takes it must
      read it right]""")
def zero_strides(target):
    out = run(target.consumer, Exporter(plain(payload=numbered(4), strides=(0, 1))))
    return accepted_or_refused(out, STRIDED, want=numbered(4) * 3)


@rule("consumer.byte-offset", "byte_offset is added to data", MUST, "dlpack.h", "DLTensor.data, DLTensor.byte_offset",
      """the `byte_offset` field should be used to point to the beginning of the data. ... The offset in bytes to
      the beginning pointer to data [checker's note: a consumer that ignores it reads other bytes]""")
def byte_offset(target):
    return accepted(run(target.consumer, Exporter(plain(byte_offset=64))))


@rule("consumer.size0-null-data", "a size-0 tensor with NULL data imports", MUST, "python-spec", "Implementation",
      """If the array is of size zero, the data pointer in DLTensor should be set to either NULL or 0. [checker's
      note: so a consumer takes what producers are told to send]""")
def size0_null_data(target):
    out = run(target.consumer, Exporter(plain(shape=(0, 4), data_raw=None)))
    return accepted(out, want=b"", shape=(0, 4))


@rule("consumer.0d", "a 0-d tensor with NULL shape and strides imports", MUST, "dlpack.h",
      "DLTensor.shape, DLTensor.strides", """When ndim == 0, shape can be set to NULL. ... When ndim == 0, strides can
      be set to NULL. [checker's note: so a consumer takes what producers may send]""")
def zero_d(target):
    out = run(target.consumer, Exporter(plain(payload=floats([7.0]), shape=(), shape_raw=None, strides_raw=None)))
    return accepted(out, want=floats([7.0]), shape=())


@rule("consumer.ndim-64", "a tensor of 64 dimensions is read right (or refused cleanly, noted)", MUST, "dlpack.h",
      "DLTensor.ndim", """Number of dimensions [checker's note: int32_t ndim; 64 is NumPy's limit, the lowest among
      peers; no sentence sets a limit, so a refusal is noted]""")
def ndim_64(target):
    shape = (2, 2) + (1,) * 62
    out = run(target.consumer, Exporter(plain(payload=numbered(4), shape=shape)))
    return accepted_or_refused(out, "no sentence sets a lowest limit on ndim", want=numbered(4), shape=shape)


@rule("consumer.unknown-dtype", "an unknown dtype code is refused (exception, deleter once)", SHOULD, "dlpack.h",
      "DLDataType.code", """Type code of base types. We keep it uint8_t instead of DLDataTypeCode for minimal memory
      footprint, but the value should be one of DLDataTypeCode enum values.""")
def unknown_dtype(target):
    return refused(run(target.consumer, Exporter(plain(dtype=(99, 32, 1)))))


@rule("consumer.wrong-bits", "an FP4 or FP6 dtype with other bits is refused (exception, deleter once)", MUST,
      "dlpack.h", "DLDataTypeCode", """FP4 data types Setting bits != 4 is currently unspecified, and the producer
      must ensure it is set while the consumer must stop importing if the value is unexpected.""")
def wrong_bits(target):
    seen = [refused(run(target.consumer, Exporter(plain(dtype=dtype)))) for dtype in ((17, 8, 1), (15, 8, 1))]
    return "; ".join(seen)


@rule("consumer.major-2", "a versioned capsule of major version 2 is refused (exception, deleter once)", MUST,
      "dlpack.h", "DLPACK_MAJOR_VERSION", """If an obtained DLPack tensor has a major version that disagrees with the
      version number specified in this header file (i.e. major != DLPACK_MAJOR_VERSION), the consumer must call the
      deleter (and it is safe to do so). It is not safe to access any other fields as the memory layout will have
      changed.""")
def major_2(target):
    out = run(target.consumer, Exporter(plain(version=(2, 0))))
    asked(out)
    versioned_only(out)
    return refused(out)


@rule("consumer.negative-shape", "a negative extent is refused (exception, deleter once)", SHOULD, "dlpack.h",
      "DLTensor.data", """For given DLTensor, the size of memory required to store the contents of data is calculated
      as follows: ... size *= t->shape[i]; [checker's note: a negative extent describes no memory; no sentence says
      to refuse it, but a consumer that takes it reads nothing it can trust]""")
def negative_shape(target):
    return refused(run(target.consumer, Exporter(plain(shape=(3, -4), strides=(4, 1)))))


@rule("consumer.negative-ndim", "ndim < 0 is refused (exception, deleter once)", SHOULD, "dlpack.h", "DLTensor.ndim",
      """Number of dimensions [checker's note: int32_t ndim, so a producer can send a negative one; no sentence
      says to refuse it, but it describes no tensor]""")
def negative_ndim(target):
    return refused(run(target.consumer, Exporter(plain(ndim_raw=-1))))


@rule("consumer.legacy-fallback", "a producer that takes no max_version is retried with __dlpack__()", SHOULD,
      "array-api", "array.__dlpack__, Notes", """And this logic for the consumer in from_dlpack(): try:
      x.__dlpack__(max_version=(1, 0), ...) # if it succeeds, store info from the capsule named
      "dltensor_versioned" ... except TypeError: x.__dlpack__(...)""")
def legacy_fallback(target):
    return accepted(run(target.consumer, PreVersionExporter(plain())))


@rule("consumer.no-dl-device-copy", "a producer without dl_device and copy is tolerated", SHOULD, "array-api",
      "array.__dlpack__, Notes", "This logic is also applicable to handling of the new dl_device and copy keywords.")
def no_dl_device_copy(target):
    return accepted(run(target.consumer, NoDeviceCopyExporter(plain())))


@rule("consumer.asks-versioned", "the consumer asks for a versioned capsule (max_version >= (1, 0))", SHOULD,
      "array-api", "array.__dlpack__, Notes", """And this logic for the consumer in from_dlpack(): try:
      x.__dlpack__(max_version=(1, 0), ...)""")
def asks_versioned(target):
    out = run(target.consumer, Exporter(plain()))
    asked(out)
    expect(out.asked_versioned(), f"its __dlpack__ calls were {out.calls}")
    return f"max_version={next(c['max_version'] for c in out.calls if c.get('max_version'))}"


@rule("consumer.stream-cpu", "the consumer passes no stream (or None) to a CPU producer", MUST, "array-api",
      "array.__dlpack__, parameter stream", """stream is provided by the consumer to the producer ... On CPU and
      other device types without streams, only None is accepted. ... When dl_device is provided explicitly, stream
      must be a valid construct for the specified device type. In particular, when kDLCPU is in use, stream must be
      None [checker's note: the checker's producers say (1, 0), kDLCPU, from __dlpack_device__(), and refuse any
      other stream, as NumPy does]""")
def stream_cpu(target):
    out = run(target.consumer, Exporter(plain()))
    expect(out.calls, f"it never called __dlpack__ (it returned {out.got})")
    streams = out.streams()
    if streams:
        refusal = f", which refused it: {out.error}" if out.error else ""
        raise Violation(f"it passed stream={streams[0]!r} to a producer whose __dlpack_device__() is (1, 0) "
                        f"(kDLCPU){refusal}")
    return accepted(out)
