"""Running probes in child processes, so a library that crashes or hangs costs one probe, not the run.
Used by the checker (one child per target) and the interop report (one per crashing column).

The child prints one JSON object per probe, flushed, each with a "name"; it runs probes in the order
given, so when it dies the first name without a line is the one that killed it. The rest go to a
fresh child. A child that can fail before its first probe (a target that does not import) prints
{"ready": true} once it can run them; dying before that fails every probe at once, not one by one."""

import json
import signal
import subprocess


def crash_message(returncode, stderr=""):
    """'process crashed (exit -6, SIGABRT): <last line of stderr>'."""
    how = f"exit {returncode}"
    if returncode < 0:
        try:
            how += f", {signal.Signals(-returncode).name}"
        except ValueError:
            pass
    last = next((line.strip() for line in reversed(stderr.splitlines()) if line.strip()), "")
    return f"process crashed ({how})" + (f": {last[:200]}" if last else "")


def run_children(argv_for, names, timeout=600, env=None, ready_line=False):
    """{name: record} for every name: the child's JSON record, or {"name", "crashed": why} for the probe
    a child died or hung on. `argv_for(pending)` is the child's command line for the names still to run;
    with `ready_line`, the child announces {"ready": true} before its first probe."""
    results = {}
    pending = list(names)
    while pending:
        ready = not ready_line
        try:
            proc = subprocess.run(argv_for(pending), capture_output=True, text=True, timeout=timeout, env=env)
            out = proc.stdout
            why = None if proc.returncode == 0 else crash_message(proc.returncode, proc.stderr)
        except subprocess.TimeoutExpired as exc:
            out, why = _text(exc.stdout), f"process timed out after {timeout} s"
        for line in out.splitlines():
            if line.startswith("{"):
                record = json.loads(line)
                if record.get("ready"):
                    ready = True
                else:
                    results[record["name"]] = record
        pending = [name for name in pending if name not in results]
        if why is None:
            break
        if not ready:
            results.update((name, {"name": name, "crashed": f"before the first probe: {why}"}) for name in pending)
            return results
        if pending:
            name = pending.pop(0)
            results[name] = {"name": name, "crashed": why}
    for name in pending:
        results[name] = {"name": name, "crashed": "no result from the child process"}
    return results


def _text(data):
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data
