"""Fakes for the conformance checker's own tests (test_check*.py): FakeArray, a producer written in
Python over ctypes that follows every producer rule, and MiniConsumer, a from_dlpack that follows every
consumer rule. Each knob breaks exactly one thing. Module-level names, so a child process can import
them by `test_check_fakes:NAME`. No tests here."""

import ctypes
import math

from dlbridge._check import abi

_LIVE = {}  # managed address -> what the tensor keeps alive until its deleter runs


class FakeArray:
    """A float32 array holding 1..n whose __dlpack__ follows the array API and dlpack.h to the letter.
    Subclasses (in test_check.py) override one method or attribute to break one rule."""

    own_version = (1, 3)
    keep_strides = True  # False: NULL strides for ndim > 0
    refuse_streams = True
    check_device = True
    refuse_readonly_legacy = True
    copy_true_copies = True
    copy_false_copies = False
    flag_copies = True

    def __init__(self, shape=(3, 4), readonly=False):
        self.shape, self.readonly = tuple(shape), readonly
        n = math.prod(self.shape)
        self.buffer = (ctypes.c_float * max(n, 1))(*range(1, n + 1))

    def __dlpack_device__(self):
        return (1, 0)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        if stream is not None and self.refuse_streams:
            raise BufferError("a CPU array takes no stream")
        if dl_device is not None and tuple(dl_device) != (1, 0) and self.check_device:
            raise BufferError(f"cannot export to device {dl_device}")
        versioned = max_version is not None and max_version[0] >= 1
        if self.readonly and not versioned and not copy and self.refuse_readonly_legacy:
            raise BufferError("a legacy capsule cannot say read-only")
        copying = self.copy_true_copies if copy else (copy is False and self.copy_false_copies)
        source = self.copied() if copying else self
        return source.export(versioned, self.flags(versioned, bool(copy)), self.version(max_version))

    def copied(self):
        twin = type(self)(self.shape)
        ctypes.memmove(twin.buffer, self.buffer, ctypes.sizeof(self.buffer))
        return twin

    def flags(self, versioned, copied):
        readonly = abi.READ_ONLY if self.readonly and not copied else 0
        return readonly | (abi.IS_COPIED if copied and self.flag_copies else 0)

    def version(self, max_version):
        return self.own_version

    def strides(self):
        return abi.row_major(self.shape)

    def data(self):
        return ctypes.addressof(self.buffer) if math.prod(self.shape) else None

    def destructor(self, versioned):
        return abi.DESTRUCTORS[versioned]

    def export(self, versioned, flags, version):
        managed = (abi.DLManagedTensorVersioned if versioned else abi.DLManagedTensor)()
        t = managed.dl_tensor
        ndim = len(self.shape)
        shape = (ctypes.c_int64 * max(ndim, 1))(*self.shape)
        strides = (ctypes.c_int64 * max(ndim, 1))(*self.strides())
        t.data, t.device, t.ndim, t.dtype = self.data(), abi.DLDevice(1, 0), ndim, abi.DLDataType(2, 32, 1)
        t.shape = shape if ndim else None
        t.strides = strides if ndim and self.keep_strides else None
        if versioned:
            managed.version, managed.flags = abi.DLPackVersion(*version), flags
        address = ctypes.addressof(managed)
        managed.deleter = _DELETER
        _LIVE[address] = (self, managed, shape, strides)
        name = abi.VERSIONED if versioned else abi.LEGACY
        return abi.api.PyCapsule_New(address, ctypes.addressof(abi.static_name(name)),
                                     ctypes.cast(self.destructor(versioned), ctypes.c_void_p))


@abi.DELETER
def _DELETER(address):
    _LIVE.pop(address, None)


class MiniConsumer:
    """from_dlpack in Python over ctypes, correct by default; each knob breaks one consumer rule."""

    KNOWN_BITS = {0: {8, 16, 32, 64}, 1: {8, 16, 32, 64}, 2: {16, 32, 64}, 4: {16}, 5: {64, 128}, 6: {8},
                  **{code: {8} for code in range(7, 15)}, 15: {6}, 16: {6}, 17: {4}}

    def __init__(self, **defects):
        unknown = set(defects) - set(DEFECTS)
        assert not unknown, unknown
        self.d = dict.fromkeys(DEFECTS, False)
        self.d.update(defects)

    def __call__(self, x):
        d = self.d
        # passes_stream: the stream it passes whatever the producer's device (False: none)
        stream = {} if d["passes_stream"] is False else {"stream": d["passes_stream"]}
        if d["legacy_only"]:
            capsule = x.__dlpack__(**stream)
        elif d["always_keywords"]:
            capsule = x.__dlpack__(max_version=(1, 3), dl_device=(1, 0), copy=None, **stream)
        else:
            try:
                capsule = x.__dlpack__(max_version=(1, 3), **stream)
            except TypeError:
                if d["no_fallback"]:
                    raise
                capsule = x.__dlpack__(**stream)
        name = abi.capsule_name(capsule)
        if name not in (abi.LEGACY, abi.VERSIONED) and not (d["accept_used"] and name.startswith("used_")):
            raise ValueError(f"not an unused DLPack capsule: {name!r}")
        versioned = name.endswith(abi.VERSIONED)
        address = abi.capsule_pointer(capsule)
        if d["leak_on_refusal"]:
            self.rename(capsule, name)
        if versioned and not d["no_major_check"]:
            major = abi.DLManagedTensorVersioned.from_address(address).version.major
            if major != 1:
                raise BufferError(f"DLPack major version {major} is not supported")
        s = abi.snapshot_address(address, versioned, name, max_ndim=64 if not d["no_ndim_check"] else 1 << 30)
        if d["truncate_ndim_32"] and s.ndim > 32:
            s.ndim, s.shape, s.strides = 32, s.shape[:32], s.strides and s.strides[:32]
        self.validate(s)
        if not d["leak_on_refusal"] and not d["no_rename"]:
            self.rename(capsule, name)
        array = MiniArray(s, d)
        if d["early_delete"]:
            array.free()
        return array

    def rename(self, capsule, name):
        abi.api.PyCapsule_SetName(capsule, abi.static_name("used_" + name))

    def validate(self, s):
        d = self.d
        limit = 32 if d["max_ndim_32"] else 64
        if not (0 <= s.ndim <= limit) and not (d["no_ndim_check"] and s.ndim < 0):
            raise BufferError(f"ndim {s.ndim} is out of range 0..{limit}")
        code, bits, lanes = s.dtype
        if code not in self.KNOWN_BITS and not d["no_dtype_check"]:
            raise BufferError(f"unknown dtype code {code}")
        if bits not in self.KNOWN_BITS.get(code, {bits}) and not d["no_bits_check"]:
            raise BufferError(f"dtype code {code} cannot have {bits} bits")
        if s.shape is None and (s.ndim > 0 or d["require_shape"]):
            raise BufferError("shape is NULL")
        if any(n < 0 for n in s.shape or []) and not d["no_shape_check"]:
            raise BufferError(f"negative shape {s.shape}")
        if not s.data and (d["refuse_null_data"] or math.prod(s.shape or []) > 0):
            raise BufferError("data is NULL")
        if d["refuse_readonly"] and s.flags and s.flags & abi.READ_ONLY:
            raise BufferError("read-only tensors are not supported")
        if d["refuse_strided"] and any(v <= 0 for v in s.strides or []):
            raise BufferError(f"strides {s.strides} are not supported")


DEFECTS = ("legacy_only", "always_keywords", "no_fallback", "accept_used", "leak_on_refusal", "no_major_check",
           "no_ndim_check", "max_ndim_32", "no_dtype_check", "no_bits_check", "require_shape", "no_shape_check",
           "refuse_null_data", "no_rename", "early_delete", "double_delete", "ignore_readonly", "null_strides_as_zero",
           "ignore_strides", "ignore_byte_offset", "refuse_readonly", "refuse_strided", "truncate_ndim_32",
           "passes_stream")


class MiniArray:
    """The consumer's array: it owns the managed tensor and shows it through __array_interface__."""

    def __init__(self, s, defects):
        self.s, self.d, self.freed = s, defects, 0
        size = abi.itemsize(s.dtype)
        shape = list(s.shape or []) if s.ndim > 0 else []
        if s.strides is not None and not defects["ignore_strides"]:
            strides = [x * size for x in s.strides]
        elif s.strides is None and defects["null_strides_as_zero"]:
            strides = [0] * len(shape)
        else:
            strides = None
        offset = 0 if defects["ignore_byte_offset"] else s.byte_offset
        readonly = bool(s.flags and s.flags & abi.READ_ONLY) and not defects["ignore_readonly"]
        typestr = "<f4" if s.dtype == (2, 32, 1) else f"|V{size}"
        self.__array_interface__ = {"shape": tuple(shape), "typestr": typestr, "version": 3,
                                    "data": ((s.data + offset) if s.data else 0, readonly),
                                    "strides": None if strides is None else tuple(strides)}

    def free(self):
        deleter = self.s.deleter
        for _ in range(2 if self.d["double_delete"] else 1):
            if deleter and self.freed < 2:
                ctypes.PYFUNCTYPE(None, ctypes.c_void_p)(deleter)(self.s.address)
                self.freed += 1

    def __del__(self):
        if not self.freed:
            self.free()


def crashing_from_dlpack(x):
    """MiniConsumer that aborts the process on negative strides, as torch once did."""
    import os

    try:
        capsule = x.__dlpack__(max_version=(1, 3))
    except TypeError:
        capsule = x.__dlpack__()
    s = abi.snapshot(capsule) if abi.capsule_name(capsule) in (abi.LEGACY, abi.VERSIONED) else None
    if s is None:
        return MiniConsumer()(_Again(capsule))
    if s.strides and any(v < 0 for v in s.strides):
        os.abort()
    return MiniConsumer()(_Again(capsule))


def aborts_on_negative_ndim_from_dlpack(x):
    """MiniConsumer that aborts on ndim < 0 (consumer.negative-ndim is a SHOULD rule), as torch segfaults."""
    return _crashes_unless(x, lambda s: s.ndim >= 0, _abort)


def hangs_on_unknown_dtype_from_dlpack(x):
    """MiniConsumer that never returns from a tensor of unknown dtype (consumer.unknown-dtype: SHOULD)."""
    import time

    return _crashes_unless(x, lambda s: s.dtype[0] != 99, lambda: time.sleep(3600))


def _abort():
    import os

    os.abort()


def _crashes_unless(x, fine, crash):
    capsule = x.__dlpack__(max_version=(1, 3))
    if not fine(abi.snapshot(capsule)):
        crash()
    return MiniConsumer()(_Again(capsule))


class _Again:
    def __init__(self, capsule):
        self.capsule = capsule

    def __dlpack__(self, **kw):
        return self.capsule


mini_from_dlpack = MiniConsumer()  # importable by name: `test_check_fakes:mini_from_dlpack`


# --- consumers and producers that do nothing the checker could see -----------------------------------

def garbage_from_dlpack(x):
    """Never calls __dlpack__; returns a string."""
    return "garbage"


def echo_from_dlpack(x):
    """Calls __dlpack__, then returns its argument instead of an array of its own."""
    x.__dlpack__(max_version=(1, 3))
    return x


class _HandBack:
    def __init__(self, capsule):
        self.capsule = capsule

    def __dlpack__(self, **kw):
        return self.capsule

    def __dlpack_device__(self):
        return (1, 0)


def handback_from_dlpack(x):
    """Takes the capsule and hands that very capsule back, unread, through a __dlpack__ of its own."""
    return _HandBack(x.__dlpack__(max_version=(1, 3)))


class ReturnsBytes(FakeArray):
    """A __dlpack__ that returns bytes, never a capsule."""

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        super().__dlpack__(stream=stream, max_version=max_version, dl_device=dl_device, copy=copy)  # its refusals
        return b"not a capsule"
