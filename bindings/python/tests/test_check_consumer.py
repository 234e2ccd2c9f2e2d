"""The conformance checker's consumer rules, each shown to fail on a from_dlpack broken in exactly that
way (MiniConsumer with one defect) and to pass on a correct one (MiniConsumer as is)."""

import subprocess
import sys

import pytest

import dlbridge
from dlbridge.testing import check_consumer, rules
from test_check_fakes import MiniConsumer

# rule: the defects that must each make it fail
BROKEN = {
    "consumer.renames": [{"no_rename": True}],
    "consumer.deleter": [{"early_delete": True}, {"double_delete": True}],
    "consumer.used-capsule": [{"accept_used": True}],
    "consumer.readonly": [{"ignore_readonly": True}],
    "consumer.null-strides": [{"null_strides_as_zero": True}],
    "consumer.negative-strides": [{"ignore_strides": True}],
    "consumer.zero-strides": [{"ignore_strides": True}],
    "consumer.byte-offset": [{"ignore_byte_offset": True}],
    "consumer.size0-null-data": [{"refuse_null_data": True}],
    "consumer.0d": [{"require_shape": True}],
    "consumer.ndim-64": [{"max_ndim_32": True}],
    "consumer.unknown-dtype": [{"no_dtype_check": True}, {"leak_on_refusal": True}],
    "consumer.wrong-bits": [{"no_bits_check": True}],
    "consumer.major-2": [{"no_major_check": True}],
    "consumer.negative-shape": [{"no_shape_check": True}],
    "consumer.negative-ndim": [{"no_ndim_check": True}],
    "consumer.legacy-fallback": [{"no_fallback": True}],
    "consumer.no-dl-device-copy": [{"always_keywords": True}],
    "consumer.asks-versioned": [{"legacy_only": True}],
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
def test_broken_consumer_fails(rule_id, defects):
    result = verdict(MiniConsumer(**defects), rule_id)
    assert result.status == "fail" and result.detail, result


def test_ignoring_read_only_passes_when_declared():
    result = verdict(MiniConsumer(ignore_readonly=True), "consumer.readonly", ignores_readonly=True)
    assert result.status == "pass" and "as declared" in result.detail


def test_legacy_only_consumer_makes_versioned_rules_not_applicable():
    for rule_id in ("consumer.readonly", "consumer.major-2"):
        result = verdict(MiniConsumer(legacy_only=True), rule_id)
        assert result.status == "n/a" and "legacy capsules only" in result.detail


def test_a_crashing_consumer_is_reported_and_the_other_rules_still_run():
    proc = subprocess.run([sys.executable, "-m", "dlbridge", "check", "--json",
                           "test_check_fakes:crashing_from_dlpack"], capture_output=True, text=True, timeout=300,
                          env=_env())
    import json

    (target,) = json.loads(proc.stdout)["targets"]
    by_rule = {r["rule"]: r for r in target["results"]}
    crashed = by_rule.pop("consumer.negative-strides")
    assert crashed["status"] == "fail" and crashed["detail"].startswith("process crashed (exit -6, SIGABRT)")
    assert {r["status"] for r in by_rule.values()} == {"pass"}, by_rule
    assert proc.returncode == 1


def _env():
    import os
    from pathlib import Path

    here = str(Path(__file__).parent)
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))}


def test_dlbridge_passes_every_consumer_rule():
    report = check_consumer(dlbridge.from_dlpack)
    assert report.ok, str(report)
    assert {r.status for r in report.results} == {"pass"}
