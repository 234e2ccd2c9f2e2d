"""The conformance checker's producer rules (and C exchange API rules): each is shown to break (fail for
a MUST rule, warn for a SHOULD rule) on a producer broken in exactly that way, to pass on a correct one,
and to pass with a note on each variant its sentence allows. No rule can pass a producer that makes no
capsule. Consumer rules are in test_check_consumer.py, the command line and pytest plugin in
test_check_cli.py."""

import ctypes
import math
import struct

import pytest

import dlbridge
from dlbridge._check import abi
from dlbridge._check.catalogue import load_all
from dlbridge._check.rules import VERDICT

RULES = load_all()
from dlbridge.testing import check_producer, rules
from test_check_fakes import FakeArray, ReturnsBytes


def dlbridge_maker(shape, readonly=False):
    """dlbridge tensors holding 1..n: the correct producer for the rules FakeArray cannot pass."""
    n = math.prod(shape)
    payload = struct.pack(f"={n}f", *range(1, n + 1))
    if readonly:
        return dlbridge.asarray(memoryview(payload).cast("B").cast("f", list(shape)))
    t = dlbridge.zeros(shape, "float32")
    if n:
        ctypes.memmove(t.data_ptr, payload, len(payload))
    return t


class Wrapped:
    """A dlbridge tensor behind a Python class, for exchange tables that are not dlbridge's."""

    def __init__(self, shape=(3, 4), readonly=False):
        self.t = dlbridge_maker(shape, readonly)
        self.readonly = readonly

    def __dlpack__(self, **kw):
        return self.t.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()


_KEEP = []  # tables and callbacks must outlive every lookup


def table_capsule(name="dlpack_exchange_api", **changes):
    """A copy of dlbridge's exchange table with fields changed, in a capsule."""
    original = abi.ExchangeAPI.from_address(abi.capsule_pointer(dlbridge.Tensor.__dlpack_c_exchange_api__))
    api = abi.ExchangeAPI()
    ctypes.memmove(ctypes.addressof(api), ctypes.addressof(original), ctypes.sizeof(api))
    for field, value in changes.items():
        if field == "version":
            api.header.version = abi.DLPackVersion(*value)
        else:
            _KEEP.append(value)
            setattr(api, field, None if value is None else ctypes.cast(value, ctypes.c_void_p).value)
    _KEEP.append(api)
    return abi.api.PyCapsule_New(ctypes.addressof(api), ctypes.addressof(abi.static_name(name)), None)


# --- producers broken in one way each ----------------------------------------------------------------

class NoCopyKeyword(FakeArray):
    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None):
        return super().__dlpack__(stream=stream, max_version=max_version, dl_device=dl_device)


class AlwaysVersioned(FakeArray):
    def __dlpack__(self, *, max_version=None, **kw):
        return super().__dlpack__(max_version=(1, 3), **kw)


class LegacyOnly(FakeArray):
    def __dlpack__(self, *, max_version=None, **kw):
        return super().__dlpack__(**kw)


class LegacyFor10(FakeArray):
    """Versioned capsules for max_version (1, 3), legacy ones for (1, 0): it supports 1.0 but does not say so."""

    def __dlpack__(self, *, max_version=None, **kw):
        return super().__dlpack__(max_version=None if max_version == (1, 0) else max_version, **kw)


class EchoesMaxVersion(FakeArray):
    def version(self, max_version):
        return tuple(max_version)


class SwallowsUnknownKeywords(FakeArray):
    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None, **ignored):
        return super().__dlpack__(stream=stream, max_version=max_version, dl_device=dl_device, copy=copy)


class PositionalStream(FakeArray):
    def __dlpack__(self, stream=None, *, max_version=None, dl_device=None, copy=None):
        return super().__dlpack__(stream=stream, max_version=max_version, dl_device=dl_device, copy=copy)


class NoReadOnlyFlag(FakeArray):
    def flags(self, versioned, copied):
        return super().flags(versioned, copied) & ~abi.READ_ONLY


class ReadOnlyLegacyAllowed(FakeArray):
    refuse_readonly_legacy = False


class ReadOnlyLegacyValueError(FakeArray):
    def __dlpack__(self, *, max_version=None, copy=None, **kw):
        if self.readonly and (max_version is None or max_version[0] < 1) and not copy:
            raise ValueError("read-only")
        return super().__dlpack__(max_version=max_version, copy=copy, **kw)


class CopyWithoutFlag(FakeArray):
    flag_copies = False


class CopyThatShares(FakeArray):
    copy_true_copies = False


class CopyFalseCopies(FakeArray):
    copy_false_copies = True


class IgnoresDevice(FakeArray):
    check_device = False


class TakesStreams(FakeArray):
    refuse_streams = False


class TakesNoSyncStream(FakeArray):
    """Accepts stream=-1 ("producer must not perform any synchronization") on CPU, as torch does."""

    def __dlpack__(self, *, stream=None, **kw):
        return super().__dlpack__(stream=None if stream == -1 else stream, **kw)


class SaysCuda(FakeArray):
    def __dlpack_device__(self):
        return (2, 0)


class ZeroSizeWrongShape(FakeArray):
    def __init__(self, shape=(3, 4), readonly=False):
        super().__init__(shape[::-1] if 0 in shape else shape, readonly)


class ZeroSizeWithData(FakeArray):
    def data(self):
        return ctypes.addressof(self.buffer)


class ZeroDimNullData(FakeArray):
    def data(self):
        return super().data() if self.shape else None


class BytesStrides(FakeArray):
    def strides(self):
        return [s * 4 for s in super().strides()]


class NullStrides13(FakeArray):
    keep_strides = False


class NullShape(FakeArray):
    def export(self, versioned, flags, version):
        capsule = super().export(versioned, flags, version)
        address = abi.capsule_pointer(capsule)
        cls = abi.DLManagedTensorVersioned if versioned else abi.DLManagedTensor
        cls.from_address(address).dl_tensor.shape = None
        return capsule


class NeverFrees(FakeArray):
    def destructor(self, versioned):
        return None


@ctypes.PYFUNCTYPE(None, ctypes.c_void_p)
def _ignores_name(capsule):
    # A destructor that frees whatever the capsule's name: a used capsule too.
    get_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.c_void_p)(("PyCapsule_GetName", abi.api))
    get = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_GetPointer", abi.api))
    name = get_name(capsule)
    cls = abi.DLManagedTensorVersioned if name.endswith(b"versioned") else abi.DLManagedTensor
    managed = cls.from_address(get(capsule, name))
    managed.deleter(ctypes.addressof(managed))


class FreesWhenUsed(FakeArray):
    def destructor(self, versioned):
        return _ignores_name


# --- exchange tables broken in one way each ---------------------------------------------------------

class TableNamedWrong(Wrapped):
    __dlpack_c_exchange_api__ = table_capsule(name="exchange_api")


class TableOnInstance(Wrapped):
    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.__dlpack_c_exchange_api__ = dlbridge.Tensor.__dlpack_c_exchange_api__


class TableVersion2(Wrapped):
    __dlpack_c_exchange_api__ = table_capsule(version=(2, 0))


class TableWithoutStream(Wrapped):
    __dlpack_c_exchange_api__ = table_capsule(current_work_stream=None)


class TableRefuses(Wrapped):
    # dlbridge's own table, which takes dlbridge tensors only: it refuses what __dlpack__ exports
    __dlpack_c_exchange_api__ = dlbridge.Tensor.__dlpack_c_exchange_api__


_dlbridge_from_py = abi.FROM_PY(abi.ExchangeAPI.from_address(
    abi.capsule_pointer(dlbridge.Tensor.__dlpack_c_exchange_api__)).managed_tensor_from_py_object_no_sync)


@abi.FROM_PY
def _exports_inner(obj, out):
    return _dlbridge_from_py(obj.t, out)  # never refuses, as torch's table skips its checks


class TableSkipsRefusal(Wrapped):
    """__dlpack__ refuses read-only arrays; the table exports them (the torch conj case)."""

    __dlpack_c_exchange_api__ = table_capsule(managed_tensor_from_py_object_no_sync=_exports_inner,
                                              dltensor_from_py_object_no_sync=None)

    def __dlpack__(self, **kw):
        if self.readonly:
            raise BufferError("read-only arrays are not exported")
        return super().__dlpack__(**kw)


@abi.ALLOCATOR
def _failing_allocator(prototype, out, ctx, set_error):
    set_error(ctx, b"MemoryError", b"no memory today")
    return -1


class TableAllocatorFails(Wrapped):
    __dlpack_c_exchange_api__ = table_capsule(managed_tensor_allocator=_failing_allocator)


@abi.STREAM
def _cpu_stream(device_type, device_id, out):
    out[0] = 0x1234
    return 0


class TableCpuStream(Wrapped):
    __dlpack_c_exchange_api__ = table_capsule(current_work_stream=_cpu_stream)


# rule: (correct producer, [broken producers], [variants the sentence allows]); crash-prone ones run in a
# child process. Broken: the rule's level decides (fail for MUST, warn for SHOULD); variants pass, noted.
CASES = {
    "producer.keywords": (FakeArray, [NoCopyKeyword, ReturnsBytes], []),
    "producer.negotiation": (FakeArray, [AlwaysVersioned, ReturnsBytes], []),
    "producer.versioned": (FakeArray, [LegacyFor10, ReturnsBytes], [LegacyOnly]),
    "producer.version-field": (FakeArray, [EchoesMaxVersion, ReturnsBytes], []),
    "producer.unknown-keyword": (FakeArray, [SwallowsUnknownKeywords, ReturnsBytes], []),
    "producer.keyword-only": (FakeArray, [PositionalStream, ReturnsBytes], []),
    "producer.readonly-flag": (FakeArray, [NoReadOnlyFlag, ReturnsBytes], []),
    "producer.readonly-legacy": (FakeArray, [ReadOnlyLegacyValueError, ReturnsBytes], [ReadOnlyLegacyAllowed]),
    "producer.copy-true": (FakeArray, [CopyWithoutFlag, CopyThatShares, ReturnsBytes], []),
    "producer.copy-false": (FakeArray, [CopyFalseCopies, ReturnsBytes], []),
    "producer.dl-device": (FakeArray, [IgnoresDevice, ReturnsBytes], []),
    "producer.stream-cpu": (FakeArray, [TakesStreams, ReturnsBytes], [TakesNoSyncStream]),
    "producer.device": (FakeArray, [SaysCuda, ReturnsBytes], []),
    "producer.zero-size": (FakeArray, [ZeroSizeWrongShape, ReturnsBytes], []),
    "producer.zero-size-null-data": (FakeArray, [ZeroSizeWithData, ReturnsBytes], []),
    "producer.0d": (FakeArray, [ZeroDimNullData, ReturnsBytes], []),
    "producer.strides": (FakeArray, [BytesStrides, NullStrides13, ReturnsBytes], []),
    "producer.shape": (FakeArray, [NullShape, ReturnsBytes], []),
    "producer.drop-frees": (FakeArray, [NeverFrees, ReturnsBytes], []),
    "producer.consumed-not-freed": (FakeArray, [FreesWhenUsed, ReturnsBytes], []),
    # FakeArray's destructor is Python code, which cannot keep an exception in flight: it is the broken one
    "producer.destructor-keeps-exception": (dlbridge_maker, [FakeArray, ReturnsBytes], []),
    "exchange.capsule": (dlbridge_maker, [TableNamedWrong, TableOnInstance], []),
    "exchange.version": (dlbridge_maker, [TableVersion2], []),
    "exchange.pointers": (dlbridge_maker, [TableWithoutStream], []),
    "exchange.matches-dlpack": (dlbridge_maker, [TableRefuses, TableSkipsRefusal], []),
    "exchange.allocator": (dlbridge_maker, [TableAllocatorFails], []),
    "exchange.current-work-stream": (dlbridge_maker, [], [TableCpuStream]),
}
ISOLATED = {"producer.destructor-keeps-exception"}


def verdict(make, rule_id):
    isolate = rule_id in ISOLATED
    if isolate and make.__module__ in (__name__, "test_check_fakes"):
        make = f"{make.__module__}:{make.__name__}"
    (result,) = check_producer(make, only=[rule_id], isolate=isolate).results
    return result


def test_every_producer_rule_has_a_case_and_every_level_a_rule():
    assert set(CASES) == {r.id for r in rules("producer")}
    assert {r.level for r in rules("producer")} == {"MUST", "SHOULD", "MAY"}
    for rule_id, (_, broken, variants) in CASES.items():
        assert broken or RULES[rule_id].level == "MAY", f"{rule_id} has no producer that breaks it"


@pytest.mark.parametrize("rule_id", CASES)
def test_correct_producer_passes(rule_id):
    result = verdict(CASES[rule_id][0], rule_id)
    assert result.status == "pass", result


@pytest.mark.parametrize("rule_id,broken", [(r, b) for r, (_, bs, _) in CASES.items() for b in bs],
                         ids=lambda x: x if isinstance(x, str) else x.__name__)
def test_broken_producer_breaks_the_rule_at_its_level(rule_id, broken):
    result = verdict(broken, rule_id)
    assert result.status == VERDICT[RULES[rule_id].level] and result.detail, result


@pytest.mark.parametrize("rule_id,variant", [(r, v) for r, (_, _, vs) in CASES.items() for v in vs],
                         ids=lambda x: x if isinstance(x, str) else x.__name__)
def test_a_variant_the_sentence_allows_passes_with_a_note(rule_id, variant):
    result = verdict(variant, rule_id)
    assert result.status == "noted" and result.detail, result


def test_a_producer_that_makes_no_capsule_passes_no_rule():
    statuses = {r.rule: r.status for r in check_producer("test_check_fakes:ReturnsBytes", isolate=True).results}
    passed = {rule for rule, status in statuses.items() if status in ("pass", "noted")}
    assert not passed, passed
    assert statuses["producer.drop-frees"] == statuses["producer.destructor-keeps-exception"] == "fail"


def test_a_failure_says_what_happened_and_cites_its_sentence():
    report = check_producer(CopyWithoutFlag, only=["producer.copy-true"])
    with pytest.raises(AssertionError) as info:
        report.assert_ok()
    text = str(info.value)
    assert "left IS_COPIED unset" in text
    assert "When a copy happens, the DLPACK_FLAG_BITMASK_IS_COPIED flag must be set." in text
    assert "MUST: Python array API standard" in text and "array.__dlpack__, parameter copy" in text
    assert "https://data-apis.org/array-api/" in text and "shared/spec" not in text


def test_sources_are_public_names_with_links():
    for r in rules():
        assert "shared/" not in r.citation() and "https://" in r.citation(), r.id


def test_rules_that_need_what_a_maker_cannot_make_are_not_applicable():
    (result,) = check_producer(dlbridge.zeros, only=["producer.readonly-flag"]).results
    assert result.status == "n/a" and "readonly=True" in result.detail
    (result,) = check_producer(FakeArray, only=["exchange.version"]).results
    assert result.status == "n/a" and "no __dlpack_c_exchange_api__" in result.detail


def test_dlbridge_passes_every_producer_rule():
    report = check_producer(dlbridge_maker)
    assert report.ok, str(report)
    assert {r.status for r in report.results} == {"pass"}
