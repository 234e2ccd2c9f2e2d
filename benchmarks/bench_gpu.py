"""CUDA transfers and per-call exchange cost: dlbridge beside torch, CuPy and tvm-ffi, in one process.

    python benchmarks/bench_gpu.py [--json FILE] [--quick] [--mib 256]
    (on a GPU machine: scripts/gpu-test.sh run, which runs this after the GPU tests)

Five parts, each with its contenders interleaved within every round and each contender's best
round kept, so that drift (clocks, another process) hits them alike:

1. device -> host copy of a 16 MiB and a 256 MiB float32 tensor: `dlbridge.from_dlpack(x, device="cpu")`
   against `x.cpu()`, as speed relative to torch (target >= 0.9x);
2. device -> pinned host memory: `dlbridge.from_dlpack(x, device=(3, 0))` (allocation included)
   against the link, measured as a copy into pinned memory allocated once beforehand, in GB/s;
   torch's `empty(pin_memory=True).copy_(x)` (its caching host allocator) is shown beside them;
3. host -> device from pageable memory, 16 and 256 MiB: `dlbridge.from_dlpack(a, device=(2, 0))`
   (staged through pinned buffers, queued on the legacy stream) against `torch.from_numpy(a).cuda()`
   (target >= 0.9x);
4. per-call time of `dlbridge.from_dlpack(x)` on a small CUDA torch tensor against
   `tvm_ffi.from_dlpack(x)` (left out if tvm_ffi is missing) and `cupy.from_dlpack(x)`;
5. per-call cost of a stream hand-off (an event recorded on the producer's stream and waited for by
   the consumer's): `dlbridge.from_dlpack(x, stream=B)` with torch's current stream A, and a
   dlbridge tensor's `__dlpack__(stream=C)`, against torch's own `x.__dlpack__(stream=B)`.

A contender that raises is reported with its error and left out of its row. Absolute times depend
on the machine; the ratios within one run are what matter.
"""

import argparse
import ctypes
import json
import subprocess
import sys
import time

import numpy as np
import torch

import dlbridge

GB = 1e9
ROWS = []


def best_seconds(contenders, rounds, sync=True):
    """Best wall time of one call of each contender, interleaved within each round. Each call is
    bracketed by device synchronisation, so that a contender that returned before its copy was
    done is charged for it. Results are dropped (freed) before the next contender runs."""
    best = {label: float("inf") for label in contenders}
    errors = {}
    for _ in range(rounds):
        for label, fn in contenders.items():
            if label in errors:
                continue
            torch.cuda.synchronize()
            start = time.perf_counter()
            try:
                out = fn()
            except Exception as e:  # a contender that is not there yet
                errors[label] = f"{type(e).__name__}: {e}"
                continue
            if sync:
                torch.cuda.synchronize()
            elapsed = time.perf_counter() - start
            del out
            best[label] = min(best[label], elapsed)
    return {k: v for k, v in best.items() if k not in errors}, errors


def best_ns_per_call(contenders, number, rounds):
    """Best ns per call of each contender over `number` calls, interleaved within each round."""
    best = {label: float("inf") for label in contenders}
    errors = {}
    for label, fn in contenders.items():
        try:
            fn()
        except Exception as e:
            errors[label] = f"{type(e).__name__}: {e}"
    live = {k: v for k, v in contenders.items() if k not in errors}
    for _ in range(rounds):
        for label, fn in live.items():
            start = time.perf_counter_ns()
            for _ in range(number):
                fn()
            best[label] = min(best[label], (time.perf_counter_ns() - start) / number)
    return {k: best[k] for k in live}, errors


def report_errors(errors):
    for label, error in errors.items():
        print(f"    {label}: not measured ({error})", flush=True)


def timed(title, nbytes, contenders, rounds):
    """Times the contenders, interleaved, and prints each one's time and bandwidth under `title`."""
    times, errors = best_seconds(contenders, rounds)
    print(f"\n{title}, best of {rounds}")
    for label, seconds in times.items():
        print(f"    {label:<44} {seconds * 1e3:8.2f} ms  {nbytes / seconds / GB:6.2f} GB/s", flush=True)
    report_errors(errors)
    return times, errors


def against_torch(part, title, nbytes, ours, theirs, contenders, rounds, short):
    """A copy timed against torch's own (`theirs`), with the 0.9x speed target; `short` names it."""
    times, errors = timed(title, nbytes, contenders, rounds)
    row = {"part": part, "bytes": nbytes, "seconds": times, "errors": errors, "target": ">= 0.9"}
    if ours in times:
        row["speed_ratio_to_torch"] = round(times[theirs] / times[ours], 3)
        ok = "meets" if row["speed_ratio_to_torch"] >= 0.9 else "MISSES"
        print(f"    dlbridge at {row['speed_ratio_to_torch']:.2f}x the speed of {short} ({ok} the 0.9x target)")
    ROWS.append(row)


def device_to_host(x, rounds):
    nbytes = x.numel() * x.element_size()
    ours = "dlbridge.from_dlpack(x, device='cpu')"
    contenders = {ours: lambda: dlbridge.from_dlpack(x, device="cpu"), "x.cpu()": lambda: x.cpu()}
    against_torch("device_to_host", f"1. device -> host, {nbytes / 2**20:.0f} MiB (pageable host memory)", nbytes,
                  ours, "x.cpu()", contenders, rounds, "x.cpu()")


def device_to_pinned(x, rounds):
    nbytes = x.numel() * x.element_size()
    ours = "dlbridge.from_dlpack(x, device=(3, 0))"
    link = "copy_ into pinned allocated once (link)"
    pinned = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
    contenders = {
        ours: lambda: dlbridge.from_dlpack(x, device=(3, 0)),
        link: lambda: pinned.copy_(x),
        "torch.empty(pin_memory=True).copy_(x)": lambda: torch.empty(x.shape, dtype=x.dtype, pin_memory=True).copy_(x),
    }
    times, errors = timed(f"2. device -> pinned host, {nbytes / 2**20:.0f} MiB", nbytes, contenders, rounds)
    row = {"part": "device_to_pinned", "bytes": nbytes, "seconds": times, "errors": errors,
           "gb_per_s": {k: round(nbytes / v / GB, 2) for k, v in times.items()}}
    if ours in times:
        row["fraction_of_link"] = round(times[link] / times[ours], 3)
        print(f"    dlbridge at {row['fraction_of_link']:.2f}x the link's measured bandwidth "
              f"({row['gb_per_s'][ours]:.1f} of {row['gb_per_s'][link]:.1f} GB/s, allocation included)")
    ROWS.append(row)


def host_to_device(nbytes, rounds):
    a = np.random.default_rng(0).standard_normal(nbytes // 4, dtype=np.float32)
    ours = "dlbridge.from_dlpack(a, device=(2, 0))"
    theirs = "torch.from_numpy(a).cuda()"
    contenders = {ours: lambda: dlbridge.from_dlpack(a, device=(2, 0)), theirs: lambda: torch.from_numpy(a).cuda()}
    against_torch("host_to_device", f"3. host -> device, {nbytes / 2**20:.0f} MiB (pageable host memory)", nbytes,
                  ours, theirs, contenders, rounds, ".cuda()")


def hand_off(number, rounds):
    x = torch.ones((4, 4), device="cuda")
    A, B, C = torch.cuda.Stream(), torch.cuda.Stream(), torch.cuda.Stream()
    b, c = B.cuda_stream, C.cuda_stream
    t = dlbridge.from_dlpack(x, stream=b)
    contenders = {
        "dlbridge.from_dlpack(x, stream=B)": lambda: dlbridge.from_dlpack(x, stream=b),
        "dlbridge tensor.__dlpack__(stream=C)": lambda: t.__dlpack__(stream=c),
        "torch x.__dlpack__(stream=B)": lambda: x.__dlpack__(stream=b),
    }
    with torch.cuda.stream(A):  # torch's current stream, so that every call needs an event
        times, errors = best_ns_per_call(contenders, number, rounds)
    torch.cuda.synchronize()
    print(f"\n5. per stream hand-off (event record + wait), a (4, 4) float32 tensor, best of {rounds} x {number:,}")
    for label, ns in times.items():
        print(f"    {label:<44} {ns:10,.0f} ns", flush=True)
    report_errors(errors)
    ROWS.append({"part": "hand_off", "ns": times, "errors": errors})


def per_call(number, rounds):
    x = torch.ones((4, 4), device="cuda")
    ours = "dlbridge.from_dlpack(x)"
    contenders = {ours: lambda: dlbridge.from_dlpack(x)}
    missing = []
    try:
        import tvm_ffi

        contenders["tvm_ffi.from_dlpack(x)"] = lambda: tvm_ffi.from_dlpack(x)
    except ImportError:
        missing.append("tvm_ffi")
    try:
        import cupy

        contenders["cupy.from_dlpack(x)"] = lambda: cupy.from_dlpack(x)
    except ImportError:
        missing.append("cupy")
    times, errors = best_ns_per_call(contenders, number, rounds)
    print(f"\n4. per call, a (4, 4) float32 CUDA torch tensor, best of {rounds} x {number:,}")
    for label, ns in times.items():
        ratio = "" if label == ours or ours not in times else f"  (dlbridge {times[ours] / ns:.2f}x)"
        print(f"    {label:<44} {ns:10,.0f} ns{ratio}", flush=True)
    report_errors(errors)
    if missing:
        print(f"    not installed, left out: {', '.join(missing)}")
    row = {"part": "per_call", "ns": times, "errors": errors, "missing": missing}
    peers = {k: v for k, v in times.items() if k != ours}
    if ours in times and peers:
        best_peer = min(peers, key=peers.get)
        row["best_peer"], row["ratio"] = best_peer, round(times[ours] / peers[best_peer], 3)
        print(f"    dlbridge {row['ratio']:.2f}x the time of the best peer ({best_peer})")
    ROWS.append(row)


def link_description():
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,pcie.link.gen.current,pcie.link.width.current,driver_version",
             "--format=csv,noheader"], capture_output=True, text=True, timeout=20, check=True).stdout.strip()
        return out.splitlines()[0] if out else None
    except (OSError, subprocess.SubprocessError):
        return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    parser.add_argument("--mib", type=int, default=256, help="size of the copied tensor (default 256)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to measure", file=sys.stderr)
        return 0
    rounds, number = (3, 2_000) if args.quick else (7, 20_000)
    name = torch.cuda.get_device_name()
    link = link_description()
    print(f"dlbridge {dlbridge.__version__}, torch {torch.__version__}, numpy {np.__version__}; {name}")
    if link:
        print(f"nvidia-smi: {link}  (name, PCIe generation, width, driver)")

    sizes = sorted({16, args.mib})
    x = torch.randn(args.mib * 2**20 // 4, device="cuda")
    try:  # the copies must hold the right values before they are worth timing
        h = dlbridge.from_dlpack(x, device="cpu")
        assert np.array_equal(np.asarray(h), x.cpu().numpy()), "dlbridge's host copy differs from x.cpu()"
        del h
    except (BufferError, RuntimeError, TypeError, ValueError) as e:
        print(f"(dlbridge's device -> host copy is not available: {type(e).__name__}: {e})")
    try:
        p = dlbridge.from_dlpack(x, device=(3, 0))
        view = np.ctypeslib.as_array((ctypes.c_float * x.numel()).from_address(p.data_ptr))
        assert p.strides == (1,) and np.array_equal(view, x.cpu().numpy()), "dlbridge's pinned copy differs"
        del view, p
    except (BufferError, RuntimeError, TypeError, ValueError) as e:
        print(f"(dlbridge's device -> pinned copy is not available: {type(e).__name__}: {e})")
    try:
        a = np.random.default_rng(1).standard_normal(1 << 20, dtype=np.float32)
        assert np.array_equal(torch.from_dlpack(dlbridge.from_dlpack(a, device=(2, 0))).cpu().numpy(), a), \
            "dlbridge's host -> device copy differs"
    except (BufferError, RuntimeError, TypeError, ValueError) as e:
        print(f"(dlbridge's host -> device copy is not available: {type(e).__name__}: {e})")
    for mib in sizes:
        device_to_host(x[: mib * 2**20 // 4], rounds)
    device_to_pinned(x, rounds)
    del x
    torch.cuda.empty_cache()
    for mib in sizes:
        host_to_device(mib * 2**20, rounds)
        torch.cuda.empty_cache()
    per_call(number, rounds)
    hand_off(number // 4, rounds)

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "link": link, "rows": ROWS}, f, indent=1)
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
