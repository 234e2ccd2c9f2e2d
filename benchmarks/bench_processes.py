"""Handing a 256 MiB float32 tensor to a child process and back, side by side in one run.

    python benchmarks/bench_processes.py [--json FILE] [--quick] [--mib N] [--no-engines]

Contenders, each a round trip through one persistent child over a multiprocessing Pipe:
- dlbridge shared memory: a tensor made with `empty(..., shared=True)`; only a handle travels;
- dlbridge pickle 5: protocol-5 pickle with the bytes sent out of band, as their own messages;
- numpy pickle: `conn.send(array)`, NumPy's own pickling through the same pipe;
- torch.multiprocessing: `conn.send(tensor)` of a shared torch tensor (torch's fd passing).
The child reads the first and last element of what it receives and sends it back. Rounds are
interleaved, and each contender's best round is reported, with its ratio to torch and to numpy.

Then the engines (bench_engines.py, unless --no-engines): Dask scatter+gather through one worker
process, Ray put+get and a Ray remote identity task, for a writable and a read-only dlbridge tensor,
a NumPy array and a torch tensor; medians of interleaved rounds, with ratios.
"""

import argparse
import json
import multiprocessing as mp
import pickle
import sys
import time


def child(conn):
    import numpy as np
    import torch  # noqa: F401  (registers torch's reductions for received tensors)
    import torch.multiprocessing  # noqa: F401

    import dlbridge  # noqa: F401

    while True:
        kind, payload = conn.recv()
        if kind == "stop":
            return
        if kind == "pickle5":
            n = payload
            data = conn.recv_bytes()
            buffers = [conn.recv_bytes() for _ in range(n)]
            obj = pickle.loads(data, buffers=buffers)
            a = np.from_dlpack(obj)
            _ = float(a.flat[0]) + float(a.flat[-1])
            out = []
            data = pickle.dumps(obj, protocol=5, buffer_callback=out.append)
            conn.send(("pickle5", len(out)))
            conn.send_bytes(data)
            for b in out:
                conn.send_bytes(b.raw())
        else:
            a = np.from_dlpack(payload) if kind != "torch" else payload.numpy()
            _ = float(a.flat[0]) + float(a.flat[-1])
            conn.send((kind, payload))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--no-engines", action="store_true", help="skip the Dask and Ray rows")
    args = parser.parse_args()
    rounds = 2 if args.quick else 5

    import numpy as np
    import torch
    import torch.multiprocessing  # noqa: F401

    import dlbridge

    n = args.mib * (1 << 20) // 4
    shared = dlbridge.empty(n, "float32", shared=True)
    np.from_dlpack(shared)[:] = 1.0
    plain = dlbridge.from_dlpack(np.ones(n, dtype=np.float32))
    array = np.ones(n, dtype=np.float32)
    tt = torch.ones(n, dtype=torch.float32).share_memory_()

    ctx = mp.get_context("fork")
    parent, child_end = ctx.Pipe()
    proc = ctx.Process(target=child, args=(child_end,))
    proc.start()

    def shm():
        parent.send(("shm", shared))
        parent.recv()

    def pickle5():
        out = []
        data = pickle.dumps(plain, protocol=5, buffer_callback=out.append)
        parent.send(("pickle5", len(out)))
        parent.send_bytes(data)
        for b in out:
            parent.send_bytes(b.raw())
        _, count = parent.recv()
        data = parent.recv_bytes()
        buffers = [parent.recv_bytes() for _ in range(count)]
        pickle.loads(data, buffers=buffers)

    def numpy_pickle():
        parent.send(("numpy", array))
        parent.recv()

    def torch_mp():
        parent.send(("torch", tt))
        parent.recv()

    contenders = {"dlbridge shared memory": shm, "dlbridge pickle 5": pickle5, "numpy pickle": numpy_pickle,
                  "torch.multiprocessing": torch_mp}
    best = {k: float("inf") for k in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - start)
    parent.send(("stop", None))
    proc.join(60)

    print(f"{args.mib} MiB float32 to a child and back, best of {rounds} interleaved rounds\n")
    print(f"{'contender':<26} {'ms':>10} {'vs torch':>10} {'vs numpy':>10}")
    rows = []
    for name, seconds in best.items():
        row = {"contender": name, "ms": round(seconds * 1e3, 3),
               "ratio_to_torch": round(seconds / best["torch.multiprocessing"], 3),
               "ratio_to_numpy": round(seconds / best["numpy pickle"], 4)}
        rows.append(row)
        print(f"{name:<26} {row['ms']:>10.2f} {row['ratio_to_torch']:>9.2f}x {row['ratio_to_numpy']:>9.4f}x")
    print("\ntargets: shared memory <= 1.0x torch, and <= 0.1x numpy pickle")
    report = {"rows": rows, "mib": args.mib, "python": sys.version}
    if not args.no_engines:
        from bench_engines import engine_rows

        report["engines"] = engine_rows(args.mib, 3 if args.quick else 7)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
