"""The mutation run of the CUDA layer (./dev mutants): each named mutation below is applied to the
source, dlbridge's Python package and examples/cuda_kernel are rebuilt (dev profile, into a scratch
folder, leaving the venv's own build alone), and the fake-driver suite runs against them; the
mutation is caught when the suite fails (or hangs past the time limit), missed when it passes. Every
file is restored afterwards, whatever happens.

    python scripts/mutants.py [--only ID ...] [--list] [--timeout SECONDS] [--report FILE]

The whole suite runs for each mutation (not stopping at the first failure), and every failing test
is listed, so that a failure of a timing test on a loaded machine cannot pass for a catch unseen;
each run's output is kept in $DLBRIDGE_CACHE/mutants-logs/ID.txt. A mutation whose original text is
no longer in its file once is reported as stale, and one the compiler refuses as broken; either
fails the run: the list must follow the code. Prints one line per mutation and the score, and with
--report writes them as a Markdown table (docs/mutants.md); exit status 1 if any was missed, stale
or broken. CI does not run this (it takes about three minutes per mutation)."""

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("DLBRIDGE_CACHE", Path.home() / ".cache" / "dlbridge"))
VENV = CACHE / "venv"
# One target folder per checkout: cargo does not tell two checkouts of one workspace apart in a
# shared folder, and would reuse one's build for the other.
TARGET = CACHE / f"mutants-target-{hashlib.sha1(str(ROOT).encode()).hexdigest()[:8]}"

CORE = "dlbridge/src/cuda"
EXAMPLE = "examples/cuda_kernel/src/lib.rs"
PYO3 = "dlbridge-pyo3/src"

# (id, file, original text, replacement, what it breaks). Ids M1-M18 follow the outside review of
# 2026-11-27 (M15 was dropped there); F1 onwards are mutations of what issue 32 added.
MUTATIONS = [
    ("M1", f"{CORE}/handoff.rs",
     '_ => check("cuStreamWaitEvent", unsafe { (api.stream_wait_event)(stream_handle(consumer), event, 0) }),',
     "_ => Ok(()),", "no cuStreamWaitEvent in a hand-off"),
    ("M2", f"{CORE}/handoff.rs",
     "let captured = capturing(api, ready)?;\n            event.record(ready)?;",
     "let captured = capturing(api, ready)?;\n            event.record(consumer)?;",
     "the hand-off's event recorded on the consumer's stream"),
    ("M3", f"{PYO3}/moves.rs", "dlbridge::cuda::to_device(view, wanted.device_id).py()?, Some(1)",
     "dlbridge::cuda::to_device(view, wanted.device_id).py()?, None", "a host-to-device copy reported complete"),
    ("M4", f"{CORE}/copies.rs", 'check("cuStreamSynchronize", (api.stream_synchronize)(stream_handle(stream)))',
     "Ok(())", "no stream synchronisation after a device-to-host copy"),
    ("M5", f"{CORE}/handoff.rs",
     "event.record(ready)?;\n            hand_over(api, event.handle, captured, consumer)",
     "event.record(ready)?;\n            let handle = event.handle;\n            drop(event);\n            hand_over(api, handle, captured, consumer)",
     "the event destroyed before the wait on it is queued"),
    ("M6", f"{PYO3}/gil.rs", "dlbridge::cuda::set_blocking_hook(detached);", "let _ = detached;", "the GIL-releasing hook never installed"),
    ("M7", f"{PYO3}/gil.rs", "    if holds_gil() {\n        // SAFETY: this thread holds the GIL",
     "    if true {\n        // SAFETY: this thread holds the GIL", "the hook detaches on a thread without the GIL"),
    ("M8", EXAMPLE, "Tensor::new(out).with_ready_stream(Some(stream))", "Tensor::new(out).with_ready_stream(None)",
     "the example's result reported ready before its kernel ran"),
    ("M9", EXAMPLE, "unsafe { launch_scale(device_id, x.device_ptr(), out.device_ptr(), n, factor, stream) }?;",
     "unsafe { launch_scale(device_id, x.device_ptr(), out.device_ptr(), n, factor, Stream::CUDA_LEGACY) }?;",
     "the example's kernel launched on another stream than the one reported"),
    ("M10", f"{CORE}/handoff.rs", "match (captured, consumer_capturing) {", "match (false, false) {",
     "hand-offs ignore graph captures"),
    ("M11a", f"{CORE}/mod.rs",
     "        let mut mode = CU_STREAM_CAPTURE_MODE_RELAXED;\n        if let Some(exchange) = api.exchange_capture_mode {\n            // SAFETY: swaps this thread's mode with a writable value.\n            unsafe { exchange(&mut mode) };\n        }\n",
     "        let mut mode = CU_STREAM_CAPTURE_MODE_RELAXED;\n",
     "no swap into relaxed capture mode; the 'restore' leaves the thread relaxed"),
    ("M11b", f"{CORE}/mod.rs",
     "        if let Some(exchange) = api.exchange_capture_mode {\n            // SAFETY: swaps this thread's mode with a writable value.\n            unsafe { exchange(&mut mode) };\n        }\n",
     "", "no cuThreadExchangeStreamCaptureMode at all"),
    ("M12", f"{PYO3}/ready.rs", "                if target == 1 {\n                    *self.state.lock().unwrap_or_else(PoisonError::into_inner) = Ready::Legacy;\n                }\n",
     "", "the old event kept after the legacy stream took over"),
    ("M13", f"{CORE}/handoff.rs",
     'host_side(api, || check("cuStreamSynchronize", unsafe { (api.stream_synchronize)(stream_handle(ready)) }))',
     "Ok(())", "no host wait before the host reads managed memory"),
    ("M14", f"{CORE}/handoff.rs",
     'host_side(api, || check("cuEventSynchronize", unsafe { (api.event_synchronize)(event) }))\n        }\n        // SAFETY: the caller\'s stream',
     'check("cuEventSynchronize", unsafe { (api.event_synchronize)(event) })\n        }\n        // SAFETY: the caller\'s stream',
     "the capture path's host wait outside the hook (GIL held)"),
    ("M16", EXAMPLE, "    let args = [KernelArg::new(&x),", "    let factor = f64::from(factor);\n    let args = [KernelArg::new(&x),",
     "the example's .f32 parameter passed as f64"),
    ("M17", f"{CORE}/release.rs", "    in_context(item.device_id, |api| {\n        // A StreamCapture error",
     "    in_context(0, |api| {\n        // A StreamCapture error", "frees ordered with device 0's context current"),
    ("M18", f"{CORE}/mod.rs",
     "        let out = call();\n        if let Some(exchange) = api.exchange_capture_mode {\n            // SAFETY: puts the previous mode back.\n            unsafe { exchange(&mut mode) };\n        }\n",
     "        let out = call();\n", "the thread's previous capture mode never restored"),
    ("F1", f"{CORE}/release.rs",
     'check("cuStreamWaitEvent", (api.stream_wait_event)(stream_handle(LEGACY), handle(event), 0))?;\n', "",
     "a free does not wait for the work dlbridge queued on the memory elsewhere"),
    ("F2", f"{CORE}/release.rs", 'let waited = check("cuEventSynchronize", (api.event_synchronize)(handle(fence)));',
     "let waited = Ok::<(), Error>(());", "the release thread frees without waiting for the fence"),
    ("F3", f"{CORE}/copies.rs", "                buffer.used_on(api, stream)\n", "                Ok(())\n",
     "a copy on another stream is not noted for the free"),
    ("F4", f"{CORE}/allocate.rs", "            if let Some(event) = unsafe { super::buffers::writer_event(api, stream) }? {",
     "            if let Some(event) = None::<usize> {", "written_on notes nothing"),
    ("F5", f"{CORE}/staging.rs", "        wait_until_read(api, staging)?;\n", "        let _ = wait_until_read;\n",
     "a staging buffer refilled before its DMA ran"),
    ("F6", f"{CORE}/buffers.rs", "unsafe { alloc_async(&mut ptr, len.max(1), stream_handle(stream)) }",
     "unsafe { alloc_async(&mut ptr, len.max(1), stream_handle(LEGACY)) }",
     "pool memory allocated on the legacy stream, used on another unordered"),
    ("F7", f"{CORE}/driver.rs", "blocking(|| API.get_or_init(load))", "API.get_or_init(load)", "the driver's start-up holds the GIL"),
    ("F8", f"{CORE}/mod.rs", "    blocking(|| {\n        let _one_at_a_time", "    (|| {\n        let _one_at_a_time",
     "the first retain of a context holds the GIL"),
    ("F9", f"{CORE}/kernels.rs", "            check_arguments(layout, args.iter().map(KernelArg::size))?;",
     "            let _ = layout;", "launch arguments not checked against the parameters"),
    ("F10", f"{CORE}/release.rs", "        Ok(false) | Err(Error::StreamCapture { .. }) => hand_over(item),",
     "        Ok(false) => hand_over(item),\n        Err(Error::StreamCapture { .. }) => {}",
     "a free that a capture holds up is dropped (leaked)"),
    ("F11", f"{CORE}/params.rs", "    Err(Error::PtxRejected { code, log: text.to_owned() })",
     "    check(\"cuModuleLoadDataEx\", code).map(|()| module)", "the JIT log left out of a PTX error"),
]
# Second edits of the mutations that need two.
EXTRA = {
    "F8": [(f"{CORE}/mod.rs", "        Ok(known)\n    })\n}", "        Ok(known)\n    })()\n}")],
    "M11b": [(f"{CORE}/mod.rs",
              "        if let Some(exchange) = api.exchange_capture_mode {\n            // SAFETY: puts the previous mode back.\n            unsafe { exchange(&mut mode) };\n        }\n",
              "        let _ = &mut mode;\n")],
}


def log(message):
    print(message, flush=True)


def run(cmd, cwd=ROOT, env=None, timeout=None):
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def build(site):
    """Dev-profile wheels of the package and the example, unpacked into `site`; the fake driver."""
    env = {**os.environ, "CARGO_TARGET_DIR": str(TARGET), "VIRTUAL_ENV": str(VENV), "PATH": f"{VENV}/bin:{os.environ['PATH']}"}
    out = Path(tempfile.mkdtemp(prefix="mutant-wheels-"))
    try:
        for crate, extra in (("bindings/python", ["--features", "testing"]), ("examples/cuda_kernel", ["--features", "testing"])):
            result = run([str(VENV / "bin" / "maturin"), "build", "--quiet", "-i", str(VENV / "bin" / "python"), "--out", str(out), *extra],
                         cwd=ROOT / crate, env=env)
            if result.returncode != 0:
                return f"build of {crate} failed: {result.stderr[-1500:]}"
        shutil.rmtree(site, ignore_errors=True)
        for wheel in out.glob("*.whl"):
            with zipfile.ZipFile(wheel) as z:
                z.extractall(site)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    result = run(["cargo", "build", "--release", "--quiet", "-p", "fake-cuda"], env=env)
    return None if result.returncode == 0 else f"fake build failed: {result.stderr[-1500:]}"


def suite(site, timeout, log_file=None):
    """Runs the fake-driver suite against `site`; (passed, the failing tests or why, seconds)."""
    lib = Path(tempfile.mkdtemp(prefix="mutant-lib-"))
    fake = TARGET / "release" / "libfake_cuda.so"
    (lib / "libcuda.so.1").symlink_to(fake)
    env = {**os.environ, "PYTHONPATH": str(site), "LD_LIBRARY_PATH": f"{lib}:{os.environ.get('LD_LIBRARY_PATH', '')}",
           "DLBRIDGE_FAKE_DRIVER_CHILD": "1", "DLBRIDGE_FAKE_CUDA": str(fake)}
    start = time.monotonic()
    try:
        result = run([str(VENV / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                      "bindings/python/tests/fake_driver"], env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, f"timed out after {timeout} s (a hang)", time.monotonic() - start
    finally:
        shutil.rmtree(lib, ignore_errors=True)
    seconds = time.monotonic() - start
    output = result.stdout + result.stderr
    if log_file is not None:
        log_file.write_text(output)
    if result.returncode == 0:
        return True, "", seconds
    failing = sorted({name.split("::", 1)[-1] for name in re.findall(r"^(?:FAILED|ERROR) (\S+)", output, re.M)})
    if failing:
        shown = ", ".join(failing[:3]) + (f" and {len(failing) - 3} more" if len(failing) > 3 else "")
        return False, f"{len(failing)} failing: {shown}", seconds
    return False, f"exit {result.returncode} ({output.strip().splitlines()[-1] if output.strip() else 'no output'})", seconds


def apply(edits):
    """Applies (file, old, new) edits; returns the original texts, or None if one is stale."""
    originals = {}
    for file, old, new in edits:
        path = ROOT / file
        current = path.read_text()
        originals.setdefault(path, current)
        if current.count(old) != 1:
            restore(originals)
            return None
        path.write_text(current.replace(old, new))
    return originals


def restore(originals):
    for path, text in originals.items():
        path.write_text(text)


def write_report(path, results, caught):
    head = run(["git", "rev-parse", "--short", "HEAD"]).stdout.strip() or "?"
    lines = [
        "# Mutation run of the CUDA layer",
        "",
        f"`./dev mutants` (scripts/mutants.py) at {head}, {time.strftime('%Y-%m-%d')}: each mutation applied, the package and",
        "examples/cuda_kernel rebuilt (dev profile), the fake-driver suite run against them. Ids M1-M18 follow the",
        "outside review of 2026-11-27; F1 on are mutations of the code issue 32 added.",
        "",
        f"**Score: {caught} of {len(results)} caught.**",
        "",
        "| id | mutation | result | failing tests |",
        "|---|---|---|---|",
    ]
    for id_, outcome, detail, what in results:
        lines.append(f"| {id_} | {what} | {outcome} | {detail.replace('|', '/')} |")
    path.write_text("\n".join(lines) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="ids to run (default: all)")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--timeout", type=int, default=900, help="seconds the suite may run per mutation")
    parser.add_argument("--report", help="also write the results as a Markdown table to this file")
    args = parser.parse_args()
    chosen = [m for m in MUTATIONS if not args.only or m[0] in args.only]
    if args.list:
        for id_, file, _, _, what in chosen:
            log(f"{id_:5} {file}: {what}")
        return 0
    site = Path(tempfile.mkdtemp(prefix="mutant-site-"))
    logs = CACHE / "mutants-logs"
    logs.mkdir(parents=True, exist_ok=True)
    log(f"baseline: building into {TARGET} and running the fake-driver suite")
    error = build(site)
    if error:
        log(error)
        return 2
    passed, failure, seconds = suite(site, args.timeout, logs / "baseline.txt")
    if not passed:
        log(f"the baseline fails ({failure}): fix it before running mutations")
        return 2
    log(f"baseline passes ({seconds:.0f} s)")
    results = []
    for id_, file, old, new, what in chosen:
        originals = apply([(file, old, new)] + EXTRA.get(id_, []))
        if originals is None:
            results.append((id_, "STALE", f"{file}: the original text is not there once", what))
            log(f"{id_:5} STALE   {what}")
            continue
        try:
            error = build(site)
            if error:
                # A mutation the compiler refuses tests nothing: the list must be fixed.
                outcome, detail = "BROKEN", error.splitlines()[0]
            else:
                passed, failure, seconds = suite(site, args.timeout, logs / f"{id_}.txt")
                outcome, detail = ("MISSED", f"suite passed in {seconds:.0f} s") if passed else ("caught", failure)
        finally:
            restore(originals)
        results.append((id_, outcome, detail, what))
        log(f"{id_:5} {outcome:7} {what}: {detail}")
    caught = sum(1 for _, outcome, _, _ in results if outcome == "caught")
    log(f"\nscore: {caught} of {len(results)} caught")
    for id_, outcome, detail, _ in results:
        if outcome != "caught":
            log(f"  {id_}: {outcome} ({detail})")
    if args.report:
        write_report(Path(args.report), results, caught)
    shutil.rmtree(site, ignore_errors=True)
    return 0 if caught == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
