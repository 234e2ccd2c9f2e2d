"""The producer rules judge every export they make, in every request the rule is about: each max_version
(absent, None, 0.x, 1.0 to 1.3 and above), copy (absent, None, False, True), dl_device (absent, None,
the array's own, another device) and stream the specification names. Each fake here is right for the
request the checker once made alone and wrong for another, so a rule that probes one request passes
it. Broken fakes must break their rule at its level, the correct one must pass, and the variants the
sentences allow must pass (or pass with a note)."""

import pytest

from dlbridge._check import abi
from dlbridge._check.catalogue import load_all
from dlbridge._check.rules import VERDICT
from dlbridge.testing import check_producer
from test_check_fakes import FakeArray

RULES = load_all()
CUDA = (2, 0)


def _versioned(capsule):
    if abi.capsule_name(capsule) != abi.VERSIONED:
        return None
    return abi.DLManagedTensorVersioned.from_address(abi.capsule_pointer(capsule))


class Patched(FakeArray):
    """FakeArray, whose versioned capsule then gets `on` flags set and `off` flags cleared when the
    request (the keywords as passed: an absent one is missing) matches `when`."""

    on = off = 0

    def when(self, kw):
        return True

    def __dlpack__(self, **kw):
        capsule = super().__dlpack__(**kw)
        managed = _versioned(capsule)
        if managed is not None and self.when(kw):
            managed.flags = (managed.flags | self.on) & ~self.off
        return capsule


# --- IS_COPIED on memory the producer still shares, whatever copy was ------------------------------

class CopiedFlagWhileSharing(Patched):
    """IS_COPIED on every versioned export except copy=False, which alone was checked."""

    on = abi.IS_COPIED

    def when(self, kw):
        return kw.get("copy") is not False


class CopiedFlagForCopyNone(Patched):
    on = abi.IS_COPIED

    def when(self, kw):
        return "copy" in kw and kw["copy"] is None


class CopiedFlagForCopyAbsent(Patched):
    on = abi.IS_COPIED

    def when(self, kw):
        return "copy" not in kw


class CopiedFlagFor10(Patched):
    """IS_COPIED on shared memory for a 1.0 consumer only (the array API's example consumer)."""

    on = abi.IS_COPIED

    def when(self, kw):
        return kw.get("max_version") == (1, 0) and not kw.get("copy")


class CopiedFlagOnReadOnly(Patched):
    """IS_COPIED on a read-only array's shared exports: the consumer may then write them."""

    on = abi.IS_COPIED

    def when(self, kw):
        return self.readonly and not kw.get("copy")


# --- READ_ONLY on every versioned capsule of a read-only array ---------------------------------------

class ReadOnlyOnlyFor13(Patched):
    off = abi.READ_ONLY

    def when(self, kw):
        return kw.get("max_version") != (1, 3)


class ReadOnlyLostWithKeywords(Patched):
    off = abi.READ_ONLY

    def when(self, kw):
        return kw.get("copy") is False or "dl_device" in kw


class ReadOnlyLostFor10(Patched):
    off = abi.READ_ONLY

    def when(self, kw):
        return kw.get("max_version") == (1, 0)


class ReadOnlyLostForCopyNone(Patched):
    off = abi.READ_ONLY

    def when(self, kw):
        return "copy" in kw and kw["copy"] is None


class ReadOnlyOnCopiesToo(Patched):
    """A cautious producer: its copies of a read-only array are read-only too. Allowed."""

    on = abi.READ_ONLY

    def when(self, kw):
        return self.readonly


# --- copy=True in every request --------------------------------------------------------------------

class CopyFlagOnlyFor13(Patched):
    off = abi.IS_COPIED

    def when(self, kw):
        return kw.get("copy") and kw.get("max_version") != (1, 3)


class CopyTrueSharesWithDevice(FakeArray):
    """copy=True is honoured unless dl_device is passed too."""

    def __dlpack__(self, *, copy=None, dl_device=None, **kw):
        return super().__dlpack__(copy=None if dl_device is not None else copy, dl_device=dl_device, **kw)


class CopyTrueReusesOneCopy(FakeArray):
    """Every copy=True export is the same copy: two consumers each think they own it alone."""

    def copied(self):
        if not hasattr(self, "_twin"):
            self._twin = super().copied()
        return self._twin


# --- dl_device on another device ------------------------------------------------------------------

class CrossDeviceValueError(FakeArray):
    """ValueError where copy=False forbids the copy a move to CUDA needs (as torch, and dlbridge at
    a20834b): the copy sentence asks for BufferError."""

    def __dlpack__(self, *, dl_device=None, copy=None, **kw):
        if dl_device is not None and tuple(dl_device) == CUDA and copy is False:
            raise ValueError("cannot move a tensor from cpu to cuda without copying")
        return super().__dlpack__(dl_device=dl_device, copy=copy, **kw)


class CrossDeviceRuntimeError(FakeArray):
    """RuntimeError for a device it cannot reach (as JAX without CUDA): must be BufferError."""

    def __dlpack__(self, *, dl_device=None, **kw):
        if dl_device is not None and tuple(dl_device) == CUDA:
            raise RuntimeError("Unknown backend cuda")
        return super().__dlpack__(dl_device=dl_device, **kw)


class IgnoresCrossDevice(FakeArray):
    """Answers dl_device=(2, 0) with its CPU capsule."""

    def __dlpack__(self, *, dl_device=None, **kw):
        return super().__dlpack__(dl_device=None if dl_device is not None and tuple(dl_device) == CUDA else dl_device,
                                  **kw)


class IgnoresDeviceWhenLegacy(FakeArray):
    """Checks dl_device only for versioned requests (as tvm-ffi's legacy path)."""

    def __dlpack__(self, *, dl_device=None, max_version=None, **kw):
        legacy = max_version is None or max_version[0] < 1
        return super().__dlpack__(dl_device=None if legacy else dl_device, max_version=max_version, **kw)


class CopiesToCuda(FakeArray):
    """Reaches CUDA by a copy (faked: host memory labelled kDLCUDA), flagged IS_COPIED; refuses the
    move under copy=False. What a producer with a GPU does: allowed."""

    def __dlpack__(self, *, dl_device=None, copy=None, max_version=None, **kw):
        if dl_device is None or tuple(dl_device) != CUDA:
            return super().__dlpack__(dl_device=dl_device, copy=copy, max_version=max_version, **kw)
        if copy is False:
            raise BufferError("a move to CUDA needs a copy")
        capsule = super().__dlpack__(copy=True, max_version=max_version, **kw)
        managed = _versioned(capsule) or abi.DLManagedTensor.from_address(abi.capsule_pointer(capsule))
        managed.dl_tensor.device = abi.DLDevice(*CUDA)
        return capsule


# --- max_version: every 1.x and above ------------------------------------------------------------------

class LegacyFor11And12(FakeArray):
    """Versioned capsules for (1, 0) and (1, 3), legacy ones for a 1.1 or 1.2 consumer."""

    def __dlpack__(self, *, max_version=None, **kw):
        return super().__dlpack__(max_version=None if max_version in ((1, 1), (1, 2)) else max_version, **kw)


# --- streams on CPU ------------------------------------------------------------------------------------

class AcceptsStreamZero(FakeArray):
    """0 is "disallowed due to its ambiguity" for CUDA and means nothing on CPU."""

    def __dlpack__(self, *, stream=None, **kw):
        return super().__dlpack__(stream=None if stream == 0 else stream, **kw)


class AcceptsLargeStream(FakeArray):
    """Takes any stream handle above 2 (a pointer, on CUDA) though it has no streams."""

    def __dlpack__(self, *, stream=None, **kw):
        return super().__dlpack__(stream=None if stream is not None and stream > 2 else stream, **kw)


class AcceptsStreamWithCpuDevice(FakeArray):
    """Takes any stream when dl_device=(1, 0) is passed: "when kDLCPU is in use, stream must be None"."""

    def __dlpack__(self, *, stream=None, dl_device=None, **kw):
        return super().__dlpack__(stream=None if dl_device is not None else stream, dl_device=dl_device, **kw)


class AcceptsStreamWhenCopying(FakeArray):
    def __dlpack__(self, *, stream=None, copy=None, **kw):
        return super().__dlpack__(stream=None if copy else stream, copy=copy, **kw)


# --- crashes: a dead process fails its rule, whatever the rule's level --------------------------------

class AbortsOnUnknownKeyword(FakeArray):
    """producer.unknown-keyword is a SHOULD rule: a wrong exception warns, but this takes the process down."""

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None, **unknown):
        if unknown:
            import os

            os.abort()
        return super().__dlpack__(stream=stream, max_version=max_version, dl_device=dl_device, copy=copy)


def _table_that_aborts():
    from test_check import Wrapped, table_capsule

    @abi.STREAM
    def aborts(device_type, device_id, out):
        import os

        os.abort()

    class TableStreamAborts(Wrapped):
        __dlpack_c_exchange_api__ = table_capsule(current_work_stream=aborts)

    return TableStreamAborts


def table_stream_aborts(shape, readonly=False):
    """exchange.current-work-stream is a MAY rule; this table's current_work_stream aborts."""
    return _table_that_aborts()(shape, readonly)


@pytest.mark.parametrize("spec,rule_id,level", [
    ("test_check_requests:AbortsOnUnknownKeyword", "producer.unknown-keyword", "SHOULD"),
    ("test_check_requests:table_stream_aborts", "exchange.current-work-stream", "MAY"),
])
def test_a_crash_fails_its_rule_whatever_the_level(spec, rule_id, level):
    assert RULES[rule_id].level == level
    (result,) = check_producer(spec, only=[rule_id]).results
    assert result.status == "fail" and result.detail.startswith("process crashed (exit -6, SIGABRT)"), result


# rule: (correct, [broken: must break the rule at its level], [allowed: must pass, or pass noted])
CASES = {
    "producer.copy-false": (FakeArray, [CopiedFlagWhileSharing, CopiedFlagForCopyNone, CopiedFlagForCopyAbsent,
                                        CopiedFlagFor10, CopiedFlagOnReadOnly], [ReadOnlyOnCopiesToo]),
    "producer.readonly-flag": (FakeArray, [ReadOnlyOnlyFor13, ReadOnlyLostWithKeywords, ReadOnlyLostFor10,
                                           ReadOnlyLostForCopyNone], [ReadOnlyOnCopiesToo]),
    "producer.copy-true": (FakeArray, [CopyFlagOnlyFor13, CopyTrueSharesWithDevice, CopyTrueReusesOneCopy],
                           [ReadOnlyOnCopiesToo]),
    "producer.dl-device": (FakeArray, [CrossDeviceValueError, CrossDeviceRuntimeError, IgnoresCrossDevice,
                                       IgnoresDeviceWhenLegacy], [CopiesToCuda]),
    "producer.versioned": (FakeArray, [LegacyFor11And12], []),
    "producer.stream-cpu": (FakeArray, [AcceptsStreamZero, AcceptsLargeStream, AcceptsStreamWithCpuDevice,
                                        AcceptsStreamWhenCopying], []),
}


def verdict(make, rule_id):
    (result,) = check_producer(make, only=[rule_id], isolate=False).results
    return result


@pytest.mark.parametrize("rule_id", CASES)
def test_the_correct_producer_passes_every_request(rule_id):
    result = verdict(CASES[rule_id][0], rule_id)
    assert result.status == "pass", result


@pytest.mark.parametrize("rule_id,broken", [(r, b) for r, (_, bs, _) in CASES.items() for b in bs],
                         ids=lambda x: x if isinstance(x, str) else x.__name__)
def test_a_producer_wrong_for_one_request_breaks_the_rule(rule_id, broken):
    result = verdict(broken, rule_id)
    assert result.status == VERDICT[RULES[rule_id].level] and result.detail, result


@pytest.mark.parametrize("rule_id,allowed", [(r, a) for r, (_, _, allowed) in CASES.items() for a in allowed],
                         ids=lambda x: x if isinstance(x, str) else x.__name__)
def test_what_the_sentence_allows_passes(rule_id, allowed):
    result = verdict(allowed, rule_id)
    assert result.status in ("pass", "noted"), result


def test_a_failure_names_the_request_it_happened_in():
    detail = verdict(ReadOnlyLostFor10, "producer.readonly-flag").detail
    assert "max_version=(1, 0)" in detail and "max_version=(1, 3)" not in detail, detail
    detail = verdict(CopiedFlagForCopyAbsent, "producer.copy-false").detail
    assert "IS_COPIED" in detail and "copy=" not in detail, detail


def test_every_stream_value_the_specification_names_is_tried():
    seen = []

    class Recorder(FakeArray):
        def __dlpack__(self, *, stream=None, **kw):
            seen.append(stream)
            return super().__dlpack__(stream=stream, **kw)

    verdict(Recorder, "producer.stream-cpu")
    assert {-1, 0, 1, 2}.issubset(seen) and any(s is not None and s > 2 ** 32 for s in seen), sorted(set(seen) - {None})


def test_the_flags_are_checked_in_each_max_version_copy_and_device():
    asked = []

    class Recorder(FakeArray):
        def __dlpack__(self, **kw):
            asked.append(kw)
            return super().__dlpack__(**kw)

    for rule_id in ("producer.readonly-flag", "producer.copy-false"):
        asked.clear()
        verdict(Recorder, rule_id)
        versions = {kw.get("max_version", "absent") for kw in asked}
        assert {"absent", None, (1, 0), (1, 1), (1, 2), (1, 3)}.issubset(versions), (rule_id, versions)
        assert any(v not in ("absent", None) and v > (1, 3) for v in versions), (rule_id, versions)
        copies = {kw.get("copy", "absent") for kw in asked}
        assert {"absent", None, False}.issubset(copies), (rule_id, copies)
        devices = {kw.get("dl_device", "absent") for kw in asked}
        assert {"absent", (1, 0)}.issubset(devices), (rule_id, devices)
    asked.clear()
    verdict(Recorder, "producer.dl-device")
    assert any(tuple(kw.get("dl_device", ())) == CUDA and kw.get("copy") is False for kw in asked)

