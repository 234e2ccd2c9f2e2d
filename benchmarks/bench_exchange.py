"""Per-call cost of DLPack exchanges: dlbridge and its peers, side by side, in one process.

    ./dev bench            # or: python benchmarks/bench_exchange.py [--json FILE] [--quick] [--ext-dir DIR]

`./dev bench` measures the release wheel users install (`maturin build --release` of the tree, or
the wheel DLBRIDGE_BENCH_WHEEL names), not the development build, and says which in the header
(--build). It first builds the extensions of benchmarks/ext/ (benchmarks/ext/build.py) and passes
their folder as --ext-dir: the extension-call rows (bench_extensions.py) time the same functions
written with dlbridge-pyo3, rust-numpy, nanobind and tvm-ffi's C++ API.

Rows that allocate allocate afresh on both sides in every call, and free it: a 64 MiB buffer is a
fresh mapping for NumPy (glibc maps it anew) and for dlbridge alike, so no row depends on what an
allocator kept from an earlier call.

Each row times one operation for dlbridge and for each peer doing the same thing, in turn within
each of several rounds, reports each one's best round in ns per call, and the ratio of dlbridge's
time to each peer's (the best peer's first). Absolute
times on a shared machine are noise; the ratios within one run are what matter.
"""

import os

# NumPy's BLAS threads spin between calls and steal a core from the code being timed.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import json
import sys
import timeit

import numpy as np

import bench_extensions
import dlbridge

ROWS = []


def best_ns(stmt, number, repeat):
    timer = timeit.Timer(stmt)
    return min(timer.repeat(repeat=repeat, number=number)) / number * 1e9


def interleaved_best_ns(contenders, number, repeat):
    """Best ns per call of each contender, timed in turn within each round, so that drift on a
    shared machine (another process, a frequency change) hits all of them alike."""
    timers = {label: timeit.Timer(fn) for label, fn in contenders.items()}
    best = {label: float("inf") for label in contenders}
    for _ in range(repeat):
        for label, timer in timers.items():
            best[label] = min(best[label], timer.timeit(number) / number * 1e9)
    return best


def row(name, ours, peers, number, repeat, target=None):
    times = interleaved_best_ns({"dlbridge": ours, **peers}, number, repeat)
    ours_ns = times.pop("dlbridge")
    peer_ns = times
    best_label = min(peer_ns, key=peer_ns.get) if peer_ns else None
    ratio = ours_ns / peer_ns[best_label] if peer_ns else None
    ROWS.append({"operation": name, "dlbridge_ns": round(ours_ns, 1),
                 "peers_ns": {k: round(v, 1) for k, v in peer_ns.items()},
                 "ratios": {k: round(ours_ns / v, 3) for k, v in peer_ns.items()},
                 "best_peer": best_label, "ratio": None if ratio is None else round(ratio, 3), "target": target})
    peers_text = ", ".join(f"{k} {v:,.0f} ({ours_ns / v:.2f}x)" for k, v in peer_ns.items())
    ratio_text = "" if ratio is None else f"{ratio:5.2f}x {best_label}"
    target_text = f"  (target {target})" if target else ""
    print(f"{name:<44} {ours_ns:>12,.0f} ns   {ratio_text:<28} [{peers_text}]{target_text}", flush=True)
    return ratio, best_label


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--quick", action="store_true", help="fewer repeats (a smoke run)")
    parser.add_argument("--ext-dir", help="where benchmarks/ext/build.py put the extensions (./dev bench passes it)")
    parser.add_argument("--ext-only", action="store_true", help="only the extension-call rows")
    parser.add_argument("--rounds", type=int, help="rounds per row (default 7; more on a busy machine)")
    parser.add_argument("--build", help="what dlbridge build this measures (./dev bench names its release wheel)")
    args = parser.parse_args()
    number, repeat = (2_000, 3) if args.quick else (20_000, 7)
    repeat = args.rounds or repeat

    import torch
    import tvm_ffi

    build = args.build or f"NOT the release wheel: the dlbridge importable here ({dlbridge.__file__})"
    print(f"dlbridge {dlbridge.__version__}: {build}")
    print(f"numpy {np.__version__}, torch {torch.__version__}, tvm_ffi {tvm_ffi.__version__}; "
          f"best of {repeat} rounds x {number} calls")
    if not args.ext_only:
        module_rows(args, number, repeat)
    extension_ratios = extension_rows(args.ext_dir, number, repeat)
    if extension_ratios:
        bench_extensions.print_summary(extension_ratios)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": ROWS, "extension_ratios": extension_ratios, "python": sys.version, "build": build}, f, indent=2)


def extension_rows(ext_dir, number, repeat):
    if not ext_dir:
        print("extension-call rows left out: no --ext-dir (./dev bench builds the extensions and passes it)")
        return None
    print(f"\nextension calls (benchmarks/ext/): dlbridge = dlbridge-pyo3; peers {', '.join(bench_extensions.PEERS)}")
    return bench_extensions.run(row, print_header, number, repeat, ext_dir)


def print_header():
    print(f"{'operation':<44} {'dlbridge':>15}   {'ratio to best peer':<28} [peers, ns]")


def module_rows(args, number, repeat):
    import torch
    import tvm_ffi

    a = np.ones((4, 4), dtype=np.float32)
    x = torch.ones((4, 4), dtype=torch.float32)
    ours = dlbridge.from_dlpack(a)
    print("\nmodule calls")
    print_header()
    row("from_dlpack(numpy (4,4))", lambda: dlbridge.from_dlpack(a),
        {"tvm_ffi.from_dlpack": lambda: tvm_ffi.from_dlpack(a), "np.from_dlpack": lambda: np.from_dlpack(a)},
        number, repeat, "<= 0.8")
    conj = torch.ones((4, 4), dtype=torch.complex64).conj()

    def refused(fn):
        def call():
            try:
                fn()
            except BufferError:
                pass
        return call

    row("from_dlpack(torch conj) refused", refused(lambda: dlbridge.from_dlpack(conj)),
        {"torch __dlpack__ refusal": refused(lambda: conj.__dlpack__())}, number // 4, repeat)
    row("from_dlpack(torch (4,4))", lambda: dlbridge.from_dlpack(x),
        {"tvm_ffi.from_dlpack": lambda: tvm_ffi.from_dlpack(x), "np.from_dlpack": lambda: np.from_dlpack(x)},
        number, repeat, "<= 0.8 x tvm_ffi")
    row("np.from_dlpack(ours) vs (numpy)", lambda: np.from_dlpack(ours),
        {"np.from_dlpack(numpy)": lambda: np.from_dlpack(a)}, number, repeat, "<= 1.0")
    row("torch.from_dlpack(ours) vs (numpy)", lambda: torch.from_dlpack(ours),
        {"torch.from_dlpack(numpy)": lambda: torch.from_dlpack(a)}, number // 4, repeat, "<= 1.0")
    row("ours.__dlpack__(max_version=(1,0))", lambda: ours.__dlpack__(max_version=(1, 0)),
        {"numpy": lambda: a.__dlpack__(max_version=(1, 0))}, number, repeat, "<= 1.0")
    row("ours.__dlpack__() legacy", lambda: ours.__dlpack__(), {"numpy": lambda: a.__dlpack__()}, number, repeat)
    ro, ro_t = a.copy(), None
    ro.flags.writeable = False
    ro_t = dlbridge.from_dlpack(ro)
    row("read-only __dlpack__() refused", refused(lambda: ro_t.__dlpack__()), {"numpy": refused(lambda: ro.__dlpack__())},
        number, repeat)
    row("memoryview(ours)", lambda: memoryview(ours), {"numpy": lambda: memoryview(a)}, number, repeat)

    big = np.ones((4096, 4096), dtype=np.float32)  # 64 MiB
    strided = np.ones((4096, 8192), dtype=np.float32)[:, ::2]
    big_t, strided_t = dlbridge.from_dlpack(big), dlbridge.from_dlpack(strided)
    n, r = (3, 3) if args.quick else (5, 5)
    # Fresh memory on both sides (no copy into memory an earlier call left mapped).
    row("copy 64 MiB contiguous", lambda: big_t.copy(), {"np.array(copy=True)": lambda: np.array(big, copy=True)},
        n, r, "<= 1.1")
    row("copy 64 MiB strided [:, ::2]", lambda: strided_t.copy(),
        {"np.ascontiguousarray": lambda: np.ascontiguousarray(strided)}, n, r)
    transposed_t = dlbridge.from_dlpack(big.T)
    row("copy 64 MiB transposed", lambda: transposed_t.copy(),
        {"np.ascontiguousarray": lambda: np.ascontiguousarray(big.T)}, n, r)

    allocation_rows(n, r)

    print("\nsize independence of the zero-copy paths (ns per call; ratio = largest / smallest):")
    for label, make in [("from_dlpack(numpy)", lambda arr: (lambda: dlbridge.from_dlpack(arr))),
                        ("np.from_dlpack(ours)", lambda arr: (lambda t=dlbridge.from_dlpack(arr): np.from_dlpack(t)))]:
        times = {}
        for nbytes in (16, 1 << 10, 1 << 20, 1 << 26, 1 << 30):
            arr = np.ones(nbytes // 4, dtype=np.float32)
            times[nbytes] = best_ns(make(arr), number // 4, repeat)
            del arr
        ratio = max(times.values()) / min(times.values())
        ROWS.append({"operation": f"size independence {label}", "ns_by_bytes": {str(k): round(v, 1) for k, v in times.items()},
                     "ratio": round(ratio, 3), "target": "<= 1.05"})
        print(f"  {label:<24} " + "  ".join(f"{k:>10}B {v:6.0f}" for k, v in times.items()) + f"   ratio {ratio:.3f}")


def allocation_rows(number, repeat):
    """64 MiB, allocated afresh in every call (and freed), alone and then written once whole."""
    count = 1 << 24  # float32: 64 MiB

    def filled(make):
        return lambda: make().fill(1.0)

    row("zeros 64 MiB", lambda: dlbridge.zeros(count), {"np.zeros": lambda: np.zeros(count, np.float32)},
        number * 20, repeat, "<= 10")
    row("empty 64 MiB", lambda: dlbridge.empty(count), {"np.empty": lambda: np.empty(count, np.float32)},
        number * 20, repeat, "<= 10 x np.zeros")
    row("zeros 64 MiB, then every element written", filled(lambda: np.from_dlpack(dlbridge.zeros(count))),
        {"np.zeros": filled(lambda: np.zeros(count, np.float32))}, number, repeat, "<= 1.1")
    row("empty 64 MiB, then every element written", filled(lambda: np.from_dlpack(dlbridge.empty(count))),
        {"np.empty": filled(lambda: np.empty(count, np.float32))}, number, repeat, "<= 1.1")


if __name__ == "__main__":
    main()
