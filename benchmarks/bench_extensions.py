"""The extension-call rows of `./dev bench`: one function per peer, called from Python.

Each peer's extension (benchmarks/ext/, built by benchmarks/ext/build.py) has the same four
functions on 4-element float32 tensors: sum1(x) and sum3(a, b, c) read (return the sum),
scale1(x) and scale3(a, b, c) write (double in place). Each row times one of them for one kind
of argument (NumPy array, torch tensor, dlbridge tensor) against every peer that accepts it:
rust-numpy takes only NumPy arrays; nanobind and tvm-ffi take anything with DLPack.
"""

import importlib
import json
import sys
from pathlib import Path

import numpy as np

import dlbridge

OURS = "dlbridge-pyo3"
PEERS = ("rust-numpy", "nanobind", "tvm-ffi")
ACCEPTS = {"rust-numpy": {"numpy"}}  # the others accept every kind
FUNCTIONS = [("sum1", "read 1 tensor", 1), ("sum3", "read 3 tensors", 3),
             ("scale1", "write 1 tensor", 1), ("scale3", "write 3 tensors", 3)]


def load(ext_dir):
    """{peer: module} for what was built, and {peer: why} for what was not."""
    manifest = json.loads((Path(ext_dir) / "manifest.json").read_text())
    sys.path.insert(0, str(ext_dir))
    modules, missing = {}, {}
    for name, entry in manifest.items():
        try:
            if "error" in entry:
                raise RuntimeError(entry["error"])
            if "module" in entry:
                modules[name] = importlib.import_module(entry["module"])
            elif name == "tvm-ffi":
                import tvm_ffi

                modules[name] = tvm_ffi.load_module(entry["path"])
            else:
                modules[name] = importlib.import_module(Path(entry["path"]).name.split(".")[0])
        except Exception as err:  # a peer that does not load is reported, not fatal
            missing[name] = f"{type(err).__name__}: {err}"
    return modules, missing


def makers():
    import torch

    return {"numpy": lambda: np.ones(4, dtype=np.float32),
            "torch": lambda: torch.ones(4, dtype=torch.float32),
            "dlbridge": lambda: dlbridge.from_dlpack(np.ones(4, dtype=np.float32))}


def check(label, fn, make, arity, writes):
    """Fails loudly unless fn computes the right thing on fresh ones: a row never times an error."""
    args = [make() for _ in range(arity)]
    result = fn(*args)
    if writes:
        values = [np.from_dlpack(a).tolist() for a in args]
        ok = result is None and all(v == [2.0] * 4 for v in values)
    else:
        values = result
        ok = result == 4.0 * arity
    if not ok:
        raise AssertionError(f"{label}: wrong result {values!r}")


def bind(fn, args):
    """fn called on args with a plain call, as a user writes it (no *args unpacking)."""
    if len(args) == 1:
        (x,) = args
        return lambda: fn(x)
    a, b, c = args
    return lambda: fn(a, b, c)


def check_can_fail():
    """check() must refuse a reader with the wrong sum and a writer that does not write."""
    make = makers()["numpy"]
    for fn, writes in [(lambda x: 0.0, False), (lambda x: None, True)]:
        try:
            check("a broken function", fn, make, 1, writes)
        except AssertionError:
            continue
        raise RuntimeError("bench_extensions.check passed a broken function: the rows would prove nothing")


def run(row, header, number, repeat, ext_dir):
    """Times every function for every argument kind; returns {kind: {function: ratio to best peer}}."""
    check_can_fail()
    modules, missing = load(ext_dir)
    for name, why in missing.items():
        print(f"  {name}: not built, so left out of these rows: {why}")
    header()
    if OURS not in modules:
        raise RuntimeError(f"the dlbridge-pyo3 bench extension did not load: {missing.get(OURS)}")
    ratios = {}
    for kind, make in makers().items():
        peers = [p for p in PEERS if p in modules and kind in ACCEPTS.get(p, {kind})]
        ratios[kind] = {}
        for fn_name, what, arity in FUNCTIONS:
            writes = fn_name.startswith("scale")
            fns = {OURS: getattr(modules[OURS], fn_name)}
            check(f"{OURS} {fn_name}({kind})", fns[OURS], make, arity, writes)
            for name in peers:
                fn = getattr(modules[name], fn_name)
                try:
                    check(f"{name} {fn_name}({kind})", fn, make, arity, writes)
                    fns[name] = fn
                except Exception as err:  # a peer that fails is reported and left out, never timed
                    print(f"  {name} left out of {fn_name}({kind}): {type(err).__name__}: {err}")
            contenders = {name: bind(fn, [make() for _ in range(arity)]) for name, fn in fns.items()}
            ours = contenders.pop(OURS)
            target = "<= 1.0" if kind in ("numpy", "torch") else None
            result = row(f"ext {what} ({kind})", ours, contenders, number, repeat, target)
            ratios[kind][what] = result
    return ratios


def print_summary(ratios):
    whats = [what for _, what, _ in FUNCTIONS]
    print(f"\nextension calls, dlbridge-pyo3 / best peer:\n  {'argument':<10}" + "".join(f"{w:>17}" for w in whats))
    for kind, by_what in ratios.items():
        cells = "".join(f"{'-':>17}" if by_what[w][0] is None else f"{by_what[w][0]:>6.2f}x {by_what[w][1]:<10}"
                        for w in whats)
        print(f"  {kind:<10}{cells}")
