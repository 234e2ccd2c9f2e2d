"""Dask and Ray as transports for a 256 MiB float32 tensor, side by side in one run.

    python benchmarks/bench_engines.py [--mib N] [--rounds N]    (./dev bench-processes runs it too)

Contenders: a writable dlbridge tensor, a read-only one, a NumPy array and a torch tensor. Transports:
- Dask: `client.scatter(x, direct=True, hash=False)` to a LocalCluster's one worker process, then
  `.result()`, which gathers it back (hash=False: Dask's hashing of the data is not timed, for any
  contender);
- Ray: `ray.get(ray.put(x))` in the driver; the same followed by a writable copy of what came back
  (`copy()`, torch's `clone()`: what a writable tensor would cost if Ray's get copied it to keep it
  writable, the choice dlbridge did not make); and a remote identity task (driver, worker, driver),
  in a session of one CPU.
Each result is checked (type, size, first and last values, and a dlbridge tensor's writability:
Dask keeps it, Ray hands back read-only memory). Rounds interleave the contenders, in a rotating
order, after one warm-up round; the median and best of the rounds are printed, with ratios (of the
medians) to NumPy and torch.
"""

import argparse
import statistics
import time

EXPECTED_WRITABILITY = {  # transport -> contender -> what a dlbridge result must say
    "dask scatter+gather": {"dlbridge (writable)": "writable", "dlbridge (read-only)": "readonly"},
    "ray put+get": {"dlbridge (writable)": "readonly", "dlbridge (read-only)": "readonly"},
    "ray put+get, then a copy": {"dlbridge (writable)": "writable", "dlbridge (read-only)": "writable"},
    "ray remote identity": {"dlbridge (writable)": "readonly", "dlbridge (read-only)": "readonly"},
}


def contenders(mib):
    import numpy as np
    import torch

    import dlbridge

    n = mib * (1 << 20) // 4
    frozen = np.ones(n, dtype=np.float32)
    frozen.flags.writeable = False
    return {
        "dlbridge (writable)": dlbridge.from_dlpack(np.ones(n, dtype=np.float32)),
        "dlbridge (read-only)": dlbridge.from_dlpack(frozen),
        "numpy": np.ones(n, dtype=np.float32),
        "torch": torch.ones(n, dtype=torch.float32),
    }


def check(transport, name, sent, got):
    import numpy as np

    assert type(got) is type(sent) and got is not sent, (transport, name, type(got))
    values = np.asarray(got)
    assert values.size == np.asarray(sent).size and values[0] == 1 and values[-1] == 1, (transport, name)
    want = EXPECTED_WRITABILITY[transport].get(name)
    assert want is None or got._writability == want, (transport, name, got._writability)


def time_rounds(transport, round_trip, data, rounds):
    """{contender: [seconds per round]}, contenders interleaved, after an untimed warm-up round. Each
    round starts one contender further on, so that none always follows the same one (a contender
    that frees 256 MiB changes what the next one's allocations cost)."""
    times = {name: [] for name in data}
    names = list(data)
    for round_number in range(rounds + 1):
        for i in range(len(names)):
            name = names[(round_number + i) % len(names)]
            x = data[name]
            start = time.perf_counter()
            got = round_trip(x)
            elapsed = time.perf_counter() - start
            check(transport, name, x, got)
            del got
            if round_number:
                times[name].append(elapsed)
    return times


def dask_times(data, rounds):
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None)
    with cluster, Client(cluster) as client:

        def scatter_gather(x):
            future = client.scatter(x, direct=True, hash=False)
            got = future.result()
            future.release()
            return got

        return {"dask scatter+gather": time_rounds("dask scatter+gather", scatter_gather, data, rounds)}


def ray_times(data, rounds):
    import ray

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        # Defined here, so that Ray ships it by value (this module is not importable in its workers).
        identity = ray.remote(lambda x: x)

        def writable_copy(x):
            got = ray.get(ray.put(x))
            return got.clone() if hasattr(got, "clone") else got.copy()

        return {
            "ray put+get": time_rounds("ray put+get", lambda x: ray.get(ray.put(x)), data, rounds),
            "ray put+get, then a copy": time_rounds("ray put+get, then a copy", writable_copy, data, rounds),
            "ray remote identity": time_rounds("ray remote identity", lambda x: ray.get(identity.remote(x)), data,
                                               rounds),
        }
    finally:
        ray.shutdown()


def engine_rows(mib, rounds):
    """Times every transport and contender, prints the table, and returns its rows."""
    data = contenders(mib)
    times = {**dask_times(data, rounds), **ray_times(data, rounds)}
    print(f"\n{mib} MiB float32 through Dask and Ray, median (best) of {rounds} interleaved rounds, seconds")
    print(f"{'transport':<25} {'contender':<22} {'median':>8} {'best':>8} {'vs numpy':>9} {'vs torch':>9}")
    rows = []
    for transport, by_name in times.items():
        medians = {name: statistics.median(t) for name, t in by_name.items()}
        for name, seconds in by_name.items():
            row = {"transport": transport, "contender": name, "median_s": round(medians[name], 4),
                   "best_s": round(min(seconds), 4), "rounds_s": [round(t, 4) for t in seconds],
                   "ratio_to_numpy": round(medians[name] / medians["numpy"], 3),
                   "ratio_to_torch": round(medians[name] / medians["torch"], 3)}
            rows.append(row)
            print(f"{transport:<25} {name:<22} {row['median_s']:>8.3f} {row['best_s']:>8.3f} "
                  f"{row['ratio_to_numpy']:>8.2f}x {row['ratio_to_torch']:>8.2f}x")
    print("\ntargets: Dask scatter+gather <= 1.1x numpy (writable and read-only); Ray read-only <= 1.1x numpy")
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    engine_rows(args.mib, args.rounds)
