"""Running rules against a target: in this process, or in child processes so that a library that
crashes (torch aborts on some strides) is reported, not fatal. The command line isolates by default;
dlbridge.testing runs in-process unless the target is importable by name."""

import os
import sys

from . import isolate
from .catalogue import load_all
from .rules import Result, died, run_rule
from .targets import resolve

DEFAULT_TIMEOUT = 300  # seconds per child; a child that hangs costs the rule it hung on


def run_one(target, rule):
    if getattr(target, rule.applies_to) is None:
        return Result(rule.id, "n/a", f"{target.name} has no {rule.applies_to} to check")
    return run_rule(rule, target)


def run_in_process(target, rules):
    return [run_one(target, r) for r in rules]


def run_isolated(spec, rules, role=None, ignores_readonly=None, timeout=DEFAULT_TIMEOUT):
    """Results for a target named by `spec` (what resolve() takes), each rule in a child process."""

    def argv(pending):
        extra = (["--role", role] if role else []) + (["--ignores-readonly"] if ignores_readonly else [])
        return [sys.executable, "-m", "dlbridge", "check", "--child", *extra, spec, "--only", ",".join(pending)]

    # The child imports what this process can: callables from modules on our sys.path included.
    path = [p for p in sys.path if p] + os.environ.get("PYTHONPATH", "").split(os.pathsep)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}
    records = isolate.run_children(argv, [r.id for r in rules], timeout, env=env, ready_line=True)
    out = []
    for r in rules:
        rec = records[r.id]
        if "crashed" in rec:
            out.append(died(r, rec["crashed"]))  # a crash or hang fails the rule it happened in
        else:
            out.append(Result(r.id, rec["status"], rec["detail"]))
    return out


def child_main(spec, role, ignores_readonly, rule_ids):
    """The child's side of run_isolated: one record per rule on the results channel, each written
    before the next rule starts."""
    rules = load_all()
    target = resolve(spec, role, ignores_readonly)
    isolate.record({"ready": True})
    for rid in rule_ids:
        result = run_one(target, rules[rid])
        isolate.record({"name": rid, "status": result.status, "detail": result.detail})
    return 0
