"""The conformance checker's consumer rules: each is shown to break (fail for a MUST rule, warn for a
SHOULD rule) on a from_dlpack broken in exactly that way (MiniConsumer with one defect), to pass on a
correct one (MiniConsumer as is), and to pass with a note on each variant its sentence allows. No rule
passes a consumer that never reads the tensor."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import dlbridge
from dlbridge._check.rules import RULES, VERDICT
from dlbridge.testing import check_consumer, rules
from test_check_fakes import MiniConsumer, echo_from_dlpack, garbage_from_dlpack, handback_from_dlpack

# rule: the defects that must each break it
BROKEN = {
    "consumer.renames": [{"no_rename": True}],
    "consumer.deleter": [{"early_delete": True}, {"double_delete": True}],
    "consumer.used-capsule": [{"accept_used": True}],
    "consumer.readonly": [{"refuse_readonly": True}],
    "consumer.null-strides": [{"null_strides_as_zero": True}],
    "consumer.negative-strides": [{"ignore_strides": True}],
    "consumer.zero-strides": [{"ignore_strides": True}],
    "consumer.byte-offset": [{"ignore_byte_offset": True}],
    "consumer.size0-null-data": [{"refuse_null_data": True}],
    "consumer.0d": [{"require_shape": True}],
    "consumer.ndim-64": [{"truncate_ndim_32": True}],
    "consumer.unknown-dtype": [{"no_dtype_check": True}, {"leak_on_refusal": True}],
    "consumer.wrong-bits": [{"no_bits_check": True}],
    "consumer.major-2": [{"no_major_check": True}],
    "consumer.negative-shape": [{"no_shape_check": True}],
    "consumer.negative-ndim": [{"no_ndim_check": True}],
    "consumer.legacy-fallback": [{"no_fallback": True}],
    "consumer.no-dl-device-copy": [{"always_keywords": True}],
    "consumer.asks-versioned": [{"legacy_only": True}],
    # NumPy refuses them all ("NumPy only supports stream=None"); -1 and 0 are CUDA and ROCm values
    "consumer.stream-cpu": [{"passes_stream": 1}, {"passes_stream": -1}, {"passes_stream": 0},
                            {"passes_stream": 2 ** 40}, {"passes_stream": 1, "legacy_only": True}],
}
# rule: (defects, declared ignores_readonly) of variants its sentence allows, which pass with a note
VARIANTS = {
    "consumer.readonly": [({"ignore_readonly": True}, None), ({"ignore_readonly": True}, True)],
    "consumer.negative-strides": [({"refuse_strided": True}, None)],
    "consumer.zero-strides": [({"refuse_strided": True}, None)],
    "consumer.ndim-64": [({"max_ndim_32": True}, None)],
}


def verdict(consumer, rule_id, **kw):
    (result,) = check_consumer(consumer, only=[rule_id], isolate=False, **kw).results
    return result


def test_every_consumer_rule_has_a_case():
    assert set(BROKEN) == {r.id for r in rules("consumer")}


@pytest.mark.parametrize("rule_id", BROKEN)
def test_correct_consumer_passes(rule_id):
    result = verdict(MiniConsumer(), rule_id)
    assert result.status == "pass", result


@pytest.mark.parametrize("rule_id,defects", [(r, d) for r, ds in BROKEN.items() for d in ds],
                         ids=lambda x: x if isinstance(x, str) else ",".join(x))
def test_broken_consumer_breaks_the_rule_at_its_level(rule_id, defects):
    result = verdict(MiniConsumer(**defects), rule_id)
    assert result.status == VERDICT[RULES[rule_id].level] and result.detail, result


@pytest.mark.parametrize("rule_id,defects,declared", [(r, d, decl) for r, vs in VARIANTS.items() for d, decl in vs],
                         ids=lambda x: x if isinstance(x, str) else repr(x))
def test_a_variant_the_sentence_allows_passes_with_a_note(rule_id, defects, declared):
    result = verdict(MiniConsumer(**defects), rule_id, ignores_readonly=declared)
    assert result.status == "noted" and result.detail, result


def test_ignoring_read_only_is_noted_as_declared():
    result = verdict(MiniConsumer(ignore_readonly=True), "consumer.readonly", ignores_readonly=True)
    assert "as it has no read-only arrays" in result.detail


def test_a_library_with_read_only_arrays_that_ignores_the_flag_is_warned():
    import ctypes

    from dlbridge._check.rules import run_rule
    from dlbridge._check.targets import PeerConsumer, Target
    from dlbridge._report.peers import NumPy

    np = pytest.importorskip("numpy")

    class Careless(NumPy):
        """NumPy's adapter with a from_dlpack that makes every result writable, READ_ONLY or not."""

        def consume(self, t):
            a = np.from_dlpack(t)
            # a writable view of the same memory, which the checker keeps alive until the rule ends
            raw = (ctypes.c_char * a.nbytes).from_address(a.__array_interface__["data"][0])
            return np.frombuffer(raw, dtype=a.dtype).reshape(a.shape)

    readonly_rule = next(r for r in rules("consumer") if r.id == "consumer.readonly")
    consumer = PeerConsumer(Careless())
    assert consumer.ignores_readonly is False, "NumPy has read-only arrays"
    result = run_rule(readonly_rule, Target("careless numpy", consumer=consumer))
    assert result.status == "warn" and "has read-only arrays" in result.detail, result
    honest = run_rule(readonly_rule, Target("numpy", consumer=PeerConsumer(NumPy())))
    assert honest.status == "pass" and honest.detail == "read-only", honest


def test_legacy_only_consumer_makes_versioned_rules_not_applicable():
    for rule_id in ("consumer.readonly", "consumer.major-2"):
        result = verdict(MiniConsumer(legacy_only=True), rule_id)
        assert result.status == "n/a" and "legacy capsules only" in result.detail


@pytest.mark.parametrize("consumer", [garbage_from_dlpack, echo_from_dlpack, handback_from_dlpack],
                         ids=lambda f: f.__name__)
def test_a_consumer_that_reads_nothing_passes_no_rule(consumer):
    report = check_consumer(consumer, isolate=False)
    passed = [r for r in report.results if r.status in ("pass", "noted", "n/a")]
    if consumer is not garbage_from_dlpack:
        # it asked for the capsule, so the rules that judge only refusals and requests can pass
        passed = [r for r in passed if r.rule not in REFUSALS_AND_REQUESTS]
    assert not passed, passed
    if consumer is garbage_from_dlpack:
        assert all("never called __dlpack__" in r.detail for r in report.results), report


def test_a_consumer_that_passes_a_stream_to_a_cpu_producer_passes_no_rule():
    """It imports nothing from NumPy, which refuses any stream on CPU, so it imports nothing here."""
    report = check_consumer(MiniConsumer(passes_stream=1), isolate=False)
    passed = [r for r in report.results if r.status in ("pass", "noted", "n/a")]
    assert not passed, passed
    stream = next(r for r in report.results if r.rule == "consumer.stream-cpu")
    assert stream.status == "fail" and "stream=1" in stream.detail and "(1, 0)" in stream.detail, stream
    renames = next(r for r in report.results if r.rule == "consumer.renames")
    assert "stream=1" in renames.detail, renames


def test_the_checkers_producers_refuse_a_stream_as_a_cpu_producer_must():
    from dlbridge._check.consumer import plain
    from dlbridge._check.harness import Exporter, NoDeviceCopyExporter, PreVersionExporter

    for exporter in (Exporter, PreVersionExporter, NoDeviceCopyExporter):
        for stream in (-1, 0, 1, 2, 2 ** 40):
            with pytest.raises(Exception, match="only None"):
                exporter(plain()).__dlpack__(stream=stream)
        exporter(plain()).drop()


# Rules about what a consumer refuses or asks for, which need no values read.
REFUSALS_AND_REQUESTS = {"consumer.used-capsule", "consumer.unknown-dtype", "consumer.wrong-bits", "consumer.major-2",
                         "consumer.negative-shape", "consumer.negative-ndim", "consumer.asks-versioned"}


def test_a_crashing_consumer_is_reported_and_the_other_rules_still_run():
    proc = subprocess.run([sys.executable, "-m", "dlbridge", "check", "--json",
                           "test_check_fakes:crashing_from_dlpack"], capture_output=True, text=True, timeout=300,
                          env=_env())
    (target,) = json.loads(proc.stdout)["targets"]
    by_rule = {r["rule"]: r for r in target["results"]}
    crashed = by_rule.pop("consumer.negative-strides")
    assert crashed["status"] == "fail" and crashed["detail"].startswith("process crashed (exit -6, SIGABRT)")
    assert {r["status"] for r in by_rule.values()} == {"pass"}, by_rule
    assert proc.returncode == 1


@pytest.mark.parametrize("consumer,rule_id,how", [
    ("aborts_on_negative_ndim_from_dlpack", "consumer.negative-ndim", "process crashed (exit -6, SIGABRT)"),
    ("hangs_on_unknown_dtype_from_dlpack", "consumer.unknown-dtype", "process timed out after 10"),
])
def test_a_crash_or_a_hang_fails_its_rule_whatever_the_level(consumer, rule_id, how):
    assert RULES[rule_id].level == "SHOULD"  # a broken SHOULD rule only warns; a dead process is no variant
    proc = subprocess.run([sys.executable, "-m", "dlbridge", "check", "--json", f"test_check_fakes:{consumer}",
                           "--only", f"consumer.renames,{rule_id}", "--timeout", "10"], capture_output=True,
                          text=True, timeout=300, env=_env())
    (target,) = json.loads(proc.stdout)["targets"]
    by_rule = {r["rule"]: r for r in target["results"]}
    assert by_rule[rule_id]["status"] == "fail" and by_rule[rule_id]["detail"].startswith(how), by_rule
    assert by_rule["consumer.renames"]["status"] == "pass" and proc.returncode == 1


MANAGED_DROPPED_UNUSED = """
import gc, struct
from dlbridge._check import abi
for _ in range(50):
    m = abi.Managed(struct.pack("=4f", 1, 2, 3, 4), (4,))
    m.capsule()
    del m  # never drop()ped: its capsule, still unused, calls the deleter through m's struct
    gc.collect()
print("ok")
"""


def test_a_managed_tensor_collected_with_unused_capsules_frees_them_first():
    """Found by the probes: the struct went first and the capsules' destructors read freed memory
    (a segfault under PYTHONMALLOC=debug, which fills freed memory)."""
    proc = subprocess.run([sys.executable, "-c", MANAGED_DROPPED_UNUSED], capture_output=True, text=True, timeout=120,
                          env={**_env(), "PYTHONMALLOC": "debug"})
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", (proc.returncode, proc.stderr[-2000:])


def _env():
    here = str(Path(__file__).parent)
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))}


def test_dlbridge_passes_every_consumer_rule():
    report = check_consumer(dlbridge.from_dlpack)
    assert report.ok, str(report)
    assert {r.status for r in report.results} == {"pass"}
