"""python -m dlbridge [--markdown]: an interop report for the array libraries installed here.

Each row is a case (a dtype, a layout, read-only data, a copy, a capsule version), and each column a
producer -> consumer path through dlbridge: the producer's object goes into dlbridge.from_dlpack, and
the resulting dlbridge.Tensor into the consumer's from_dlpack. A cell is

  ✔        the consumer sees the right values in the producer's own memory (zero-copy),
  copy     the right values, in other memory,
  error    the exact exception, from whichever step raised it.

Libraries that can take the process down on a case (TensorFlow aborts on misaligned data) are probed
in a subprocess, one case at a time, so a crash becomes a cell.
"""

import argparse
import importlib
import json
import subprocess
import sys

import numpy as np

import dlbridge

LIBRARIES = ["numpy", "torch", "jax", "tvm_ffi", "tensorflow", "cupy", "pyarrow"]
CONSUMERS = {"numpy", "torch", "jax", "tvm_ffi", "tensorflow", "cupy"}
IN_SUBPROCESS = {"tensorflow"}

ML_DTYPES = ["bfloat16", "float8_e4m3fn", "float8_e5m2"]
DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64", "complex64", "complex128"] + ML_DTYPES

LAYOUTS = {
    "C-contiguous": lambda a: a,
    "F-contiguous": np.asfortranarray,
    "negative strides": lambda a: a[::-1, ::-1],
    "0-d": lambda a: np.array(a[1, 1]),
    "zero-size": lambda a: a[:0],
    "broadcast (stride 0)": lambda a: np.broadcast_to(a[:1], a.shape),
    "strided, offset": lambda a: a[1:, ::2],
}


def cases():
    rows = [(f"dtype {d}", {"dtype": d}) for d in DTYPES]
    rows += [(f"layout {name}", {"layout": name}) for name in LAYOUTS]
    rows += [
        ("read-only source", {"readonly": True}),
        ("from_dlpack(copy=True)", {"copy": True}),
        ("producer gives a legacy capsule", {"capsule": "legacy"}),
        ("producer gives a versioned capsule", {"capsule": "versioned"}),
    ]
    return rows


def reference(case):
    dtype = case.get("dtype", "float32")
    if dtype in ML_DTYPES:
        import ml_dtypes

        dtype = getattr(ml_dtypes, dtype)
    a = (np.arange(12) % 5).astype(dtype).reshape(3, 4)
    a = LAYOUTS[case.get("layout", "C-contiguous")](a)
    if case.get("readonly"):
        a = a.copy() if a.flags.writeable is False else a
        a.flags.writeable = False
    return a


def make(producer, a):
    """The producer's own object holding `a` (with its layout where the producer can hold one)."""
    if producer == "numpy":
        return a
    if producer == "torch":
        import torch

        if a.dtype.name in ML_DTYPES:
            bits = np.uint16 if a.dtype.itemsize == 2 else np.uint8
            return torch.from_numpy(np.ascontiguousarray(a).view(bits)).view(getattr(torch, a.dtype.name))
        return torch.from_dlpack(a)
    if producer == "jax":
        import jax.numpy as jnp

        return jnp.asarray(a)
    if producer == "tvm_ffi":
        import tvm_ffi

        if a.dtype.name in ML_DTYPES and "torch" in available():
            return tvm_ffi.from_dlpack(make("torch", a))  # NumPy cannot export these dtypes
        return tvm_ffi.from_dlpack(a)
    if producer == "tensorflow":
        import tensorflow as tf

        return tf.constant(a)
    if producer == "cupy":
        import cupy

        return cupy.asarray(a)
    if producer == "pyarrow":
        import pyarrow as pa

        if a.ndim != 1:
            raise ValueError("pyarrow arrays are 1-d")
        return pa.array(a)
    raise ValueError(producer)


def consume(consumer, t):
    if consumer == "numpy":
        return np.from_dlpack(t)
    if consumer == "torch":
        import torch

        return torch.from_dlpack(t)
    if consumer == "jax":
        import jax.numpy as jnp

        return jnp.from_dlpack(t)
    if consumer == "tvm_ffi":
        import tvm_ffi

        return tvm_ffi.from_dlpack(t)
    if consumer == "tensorflow":
        import tensorflow as tf

        return tf.experimental.dlpack.from_dlpack(t.__dlpack__())
    if consumer == "cupy":
        import cupy

        return cupy.from_dlpack(t)
    raise ValueError(consumer)


def to_numpy(obj, like):
    """The consumer's result as a NumPy array of `like`'s dtype, read through the consumer's own API
    (NumPy before 2.5 cannot import bfloat16 or float8, so those are read through torch)."""
    if like.dtype.name in ML_DTYPES and type(obj).__module__.startswith("tvm_ffi") and "torch" in sys.modules:
        obj = sys.modules["torch"].from_dlpack(obj)
    if type(obj).__module__.startswith("torch") and like.dtype.name in ML_DTYPES:
        import torch

        bits = torch.int16 if like.dtype.itemsize == 2 else torch.uint8
        return obj.view(bits).numpy().view(like.dtype)
    if hasattr(obj, "numpy") and not isinstance(obj, np.ndarray):
        try:
            return obj.numpy()
        except Exception:
            pass
    if type(obj).__module__.startswith("tvm_ffi"):
        return np.from_dlpack(obj)
    return np.asarray(obj)


def address(obj):
    for attr in ("data_ptr", "unsafe_buffer_pointer"):
        value = getattr(obj, attr, None)
        if value is not None:
            return value() if callable(value) else value
    if isinstance(obj, np.ndarray):
        return obj.__array_interface__["data"][0]
    try:
        return dlbridge.from_dlpack(obj).data_ptr
    except Exception:
        return None


class _Wrapper:
    """Hands out one kind of capsule whatever the consumer asks for."""

    def __init__(self, t, versioned):
        self.t, self.versioned = t, versioned

    def __dlpack__(self, **kw):
        return self.t.__dlpack__(max_version=(1, 0) if self.versioned else None)

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()


def cell(producer, consumer, case):
    a = reference(case)
    step = "producer"
    try:
        x = make(producer, a)
        source = address(x)
        step = "into dlbridge"
        t = dlbridge.from_dlpack(x, copy=True if case.get("copy") else None)
        if case.get("capsule"):
            t = _Wrapper(t, case["capsule"] == "versioned")
        step = consumer
        y = consume(consumer, t)
        expected = np.asarray(a)
        values = to_numpy(y, expected)
        same = values.shape == expected.shape and np.array_equal(values, expected)
        if not same:
            return f"wrong values ({values.dtype}{list(values.shape)})"
        zero_copy = expected.size == 0 or (source is not None and address(y) == source)
        note = ""
        if case.get("readonly"):
            writable = getattr(getattr(y, "flags", None), "writeable", None)
            note = " (writable!)" if writable else ""
        return ("✔" if zero_copy else "copy") + note
    except BaseException as exc:  # report every failure, whatever its type
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        where = "" if step == consumer else f"[{step}] "
        return f"{where}{type(exc).__name__}: {message}"


_AVAILABLE = None


def available():
    global _AVAILABLE
    if _AVAILABLE is not None:
        return _AVAILABLE
    found = []
    for name in LIBRARIES:
        try:
            importlib.import_module(name)
            found.append(name)
        except Exception:
            pass
    _AVAILABLE = found
    return found


def column_in_subprocess(producer, consumer, rows):
    """Runs one column in child processes; a child that dies marks its case and the rest go on."""
    results = {}
    pending = [name for name, _ in rows]
    while pending:
        proc = subprocess.run(
            [sys.executable, "-m", "dlbridge", "--cells", producer, consumer, *pending],
            capture_output=True, text=True, timeout=600,
        )
        done = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        for item in done:
            results[item["case"]] = item["cell"]
        pending = [p for p in pending if p not in results]
        if proc.returncode != 0 and pending:
            results[pending.pop(0)] = f"process crashed (exit {proc.returncode})"
        elif proc.returncode == 0:
            break
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m dlbridge", description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    parser.add_argument("--cells", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    rows = cases()
    if args.cells:
        producer, consumer, *names = args.cells
        wanted = dict(rows)
        for name in names:
            print(json.dumps({"case": name, "cell": cell(producer, consumer, wanted[name])}), flush=True)
        return 0

    libraries = available()
    columns = [(p, c) for p in libraries for c in libraries if c in CONSUMERS]
    table = {name: {} for name, _ in rows}
    for producer, consumer in columns:
        key = f"{producer} → {consumer}"
        if IN_SUBPROCESS & {producer, consumer}:
            for name, value in column_in_subprocess(producer, consumer, rows).items():
                table[name][key] = value
        else:
            for name, case in rows:
                table[name][key] = cell(producer, consumer, case)
    keys = [f"{p} → {c}" for p, c in columns]
    versions = ", ".join(f"{n} {getattr(sys.modules[n], '__version__', '?')}" for n in libraries)
    print(f"dlbridge {dlbridge.__version__} (DLPack {dlbridge.DLPACK_VERSION[0]}.{dlbridge.DLPACK_VERSION[1]}); "
          f"paths are producer → dlbridge → consumer; {versions}\n")
    if args.markdown:
        print("| case | " + " | ".join(keys) + " |")
        print("|---|" + "---|" * len(keys))
        for name, _ in rows:
            print(f"| {name} | " + " | ".join(table[name][k].replace("|", "\\|") for k in keys) + " |")
    else:
        for producer in libraries:
            group = [k for k in keys if k.startswith(producer + " →")]
            if not group:
                continue
            width = max(len(n) for n, _ in rows)
            print(f"producer: {producer}")
            print("  " + "case".ljust(width) + "  " + "  ".join(k.split("→ ")[1][:14].ljust(14) for k in group))
            for name, _ in rows:
                cells = [table[name][k] for k in group]
                short = [(c if len(c) <= 14 else c[:13] + "…").ljust(14) for c in cells]
                print("  " + name.ljust(width) + "  " + "  ".join(short))
            print()
        errors = sorted({(k, n, table[n][k]) for n, _ in rows for k in keys if table[n][k] not in ("✔", "copy")})
        if errors:
            print("errors in full:")
            for key, name, value in errors:
                print(f"  {key:>22}  {name}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
