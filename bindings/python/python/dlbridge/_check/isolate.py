"""Running probes in child processes, so a library that crashes or hangs costs one probe, not the run.
Used by the checker (one child per target) and the interop report (one per crashing column).

Results travel on a channel of their own: a file whose path the child finds in RESULTS_ENV, one JSON
object per probe, each with a "name", flushed before the next probe starts. The child's stdout is
the library's (whatever it prints is never read as a result) and its stderr only explains a crash.
The child runs probes in the order given, so when it dies the first name without a record is the
one that killed it. The rest go to a fresh child. A child that can fail before its first probe (a
target that does not import) records {"ready": true} once it can run them; dying before that fails
every probe at once, not one by one."""

import json
import os
import signal
import subprocess
import tempfile

RESULTS_ENV = "DLBRIDGE_CHECK_RESULTS"


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


def record(entry):
    """The child's side: appends one result to the channel RESULTS_ENV names."""
    path = os.environ.get(RESULTS_ENV)
    if not path:
        raise RuntimeError(f"no results channel: {RESULTS_ENV} is not set (run_children sets it)")
    with open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps(entry) + "\n")


def run_children(argv_for, names, timeout=600, env=None, ready_line=False):
    """{name: record} for every name: the child's record, or {"name", "crashed": why} for the probe a
    child died or hung on. `argv_for(pending)` is the child's command line for the names still to run;
    with `ready_line`, the child records {"ready": true} before its first probe."""
    results = {}
    pending = list(names)
    while pending:
        ready = not ready_line
        with tempfile.TemporaryDirectory(prefix="dlbridge-check-") as tmp:
            channel = os.path.join(tmp, "results.jsonl")
            child_env = {**(os.environ if env is None else env), RESULTS_ENV: channel}
            try:
                proc = subprocess.run(argv_for(pending), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                      errors="replace", timeout=timeout, env=child_env)
                why = None if proc.returncode == 0 else crash_message(proc.returncode, proc.stderr)
            except subprocess.TimeoutExpired:
                why = f"process timed out after {timeout} s"
            for entry in _read(channel):
                if entry.get("ready"):
                    ready = True
                elif entry.get("name") in pending:
                    results[entry["name"]] = entry
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


def _read(path):
    """The records a child wrote; a line cut short by its death is skipped."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            out.append(entry)
    return out
