"""A DLPack conformance checker for any library (`python -m dlbridge check TARGET ...`).

TARGET is a library (numpy, torch, jax, tvm_ffi, cupy, tensorflow, pyarrow, mpi4py, dlbridge, or any
module with zeros/from_dlpack), or a callable `package.module:function` that makes an array from a
shape (a producer) or, if its name says from_dlpack, consumes one. Each rule quotes the specification
sentence it comes from, and carries that sentence's strength: breaking a MUST rule fails, a SHOULD rule
warns, and a MAY rule (or a variant a sentence allows) passes with a note. Rules run in child processes,
whose results come back on a channel of their own, so a library that crashes, or prints, is reported
right; a crash or a hang fails the rule it happened in, whatever its level. Exit status: 0 when no
rule failed, 1 when one did, 2 when a target cannot be checked. The same rules are functions in
dlbridge.testing.
"""

import argparse
import shlex
import sys

DEFAULT_MARKDOWN_TARGETS = ("numpy", "torch", "jax", "tvm_ffi", "cupy", "tensorflow", "pyarrow", "mpi4py", "dlbridge")


def _parser():
    p = argparse.ArgumentParser(prog="python -m dlbridge check", description=__doc__.splitlines()[0])
    p.add_argument("targets", nargs="*", metavar="TARGET")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print one JSON document")
    out.add_argument("--markdown", action="store_true",
                     help="print one Markdown table, a column per target (default targets: every library found)")
    p.add_argument("--role", choices=("producer", "consumer"), help="check only this role")
    p.add_argument("--only", action="append", default=[], metavar="RULE[,RULE]", help="run only these rules")
    p.add_argument("--skip", action="append", default=[], metavar="RULE[,RULE]", help="leave these rules out")
    p.add_argument("--ignores-readonly", action="store_true", default=None,
                   help="the consumer declares it has no read-only arrays, so it ignores READ_ONLY (as the array API "
                        "prefers for such consumers)")
    p.add_argument("--in-process", action="store_true", help="no child processes (faster; a crash ends the run)")
    p.add_argument("--timeout", type=float, default=300, help="seconds per child process (default 300)")
    p.add_argument("--list", action="store_true", help="list the rules, their levels and their sources")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return p


def main(argv=None, program=False):
    """The command line; `program`: this process exits when it returns (python -m dlbridge)."""
    from . import runner
    from .stdout import document_only

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    args = parser.parse_args(argv)
    only, skip = ([r for value in values for r in value.split(",") if r] for values in (args.only, args.skip))
    if args.child:
        return runner.child_main(args.targets[0], args.role, args.ignores_readonly, only)
    with document_only(restore=not program) as out:
        return _run(parser, args, argv, only, skip, out)


def _run(parser, args, argv, only, skip, out):
    from . import render, runner
    from .catalogue import select
    from .targets import TargetError, resolve

    try:
        rules = select(None, only, skip)
    except KeyError as exc:
        parser.error(exc.args[0])
    if args.list:
        for r in rules:
            print(f"{r.id}: {r.title}\n    {r.citation()}", file=out)
        return 0
    targets = args.targets
    if not targets and args.markdown:
        from .._report.libs import found

        targets = [t for t in DEFAULT_MARKDOWN_TARGETS if found(t)]
    if not targets:
        parser.error("name a TARGET (a library such as numpy, or package.module:function)")
    reports, status = [], 0
    for spec in targets:
        try:
            target = resolve(spec, args.role, args.ignores_readonly)
        except TargetError as exc:
            print(f"dlbridge check: {exc}", file=sys.stderr)
            status = 2
            continue
        chosen = [r for r in rules if r.applies_to in target.roles()]
        if args.in_process:
            results = runner.run_in_process(target, chosen)
        else:
            results = runner.run_isolated(spec, chosen, args.role, args.ignores_readonly, args.timeout)
        reports.append((_title(spec), results))
        if any(r.status == "fail" for r in results) and status == 0:
            status = 1
    if not reports:
        return status
    if args.json:
        print(render.as_json(reports), file=out)
    elif args.markdown:
        command = "python -m dlbridge check " + " ".join(shlex.quote(a) for a in argv)
        print("\n".join(render.markdown(reports, command)), file=out)
    else:
        print("\n".join(render.plain(reports)), file=out)
    return status


def _title(spec):
    from .._report.libs import probe

    status, version = probe(spec) if ":" not in spec else ("", None)
    return f"{spec} {version}" if status == "found" and version != "?" else spec
