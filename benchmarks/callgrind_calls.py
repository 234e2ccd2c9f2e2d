"""Where a call's time goes: instructions per call under callgrind, by source file and by function.

    DLBRIDGE_CACHE=... ./dev bench --quick          # builds the bench extensions first
    $DLBRIDGE_CACHE/venv/bin/python benchmarks/callgrind_calls.py [PATTERN ...] [--calls N]

Builds copies of dlbridge's native module and the Rust bench extensions with line tables
(release, LTO as shipped; in $DLBRIDGE_CACHE/target-callgrind), then runs every case whose name
matches a PATTERN (fnmatch; default all) in one process under callgrind. Each case is counted
over N and 6N calls after a warm-up, and the difference is divided by 5N, so imports, set-up and
the dumps themselves cancel; what stays is one call plus the Python loop around it (the `loop`
case shows that part alone). Instructions are attributed to the source file they came from,
inlined code included, so LTO does not hide dlbridge-pyo3's modules inside the pyfunction.
"""

import argparse
import fnmatch
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from collections import defaultdict
from itertools import repeat
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The venv's parent, as ./dev lays it out, unless DLBRIDGE_CACHE says otherwise.
CACHE = Path(os.environ.get("DLBRIDGE_CACHE") or Path(sys.prefix).parent)
WORK = CACHE / "callgrind"
MARKS_C = r"""
#include <valgrind/callgrind.h>
void cg_dump(const char *name) { CALLGRIND_DUMP_STATS_AT(name); }
"""


# ---- the cases, run in the child under callgrind ----------------------------------------------

def loop1(fn, x, n):
    for _ in repeat(None, n):  # as timeit loops: no int per iteration
        fn(x)


def loop3(fn, x, n):
    a, b, c = x
    for _ in repeat(None, n):  # as timeit loops: no int per iteration
        fn(a, b, c)


def loop_dunder(_, x, n):
    for _ in repeat(None, n):  # as timeit loops: no int per iteration
        x.__dlpack__(max_version=(1, 0))


def loop_empty(_, x, n):
    for _ in repeat(None, n):  # as timeit loops: no int per iteration
        pass


def cases():
    """{name: (loop, fn, argument)}, built lazily: torch and the peers load only when asked for."""
    import numpy as np

    import bench_extensions
    import dlbridge

    def torch():
        import torch as t

        return t

    made = {"loop": lambda: (loop_empty, None, None)}
    kinds = {"numpy": lambda: np.ones(4, dtype=np.float32), "torch": lambda: torch().ones(4, dtype=torch().float32),
             "dlbridge": lambda: dlbridge.from_dlpack(np.ones(4, dtype=np.float32))}
    modules = {}

    def ext(peer, fn, kind):
        def make():
            if not modules:
                modules.update(bench_extensions.load(CACHE / "bench-ext")[0])
            f = getattr(modules[peer], fn)
            return (loop3, f, tuple(kinds[kind]() for _ in range(3))) if fn.endswith("3") else (loop1, f, kinds[kind]())
        return make

    for peer in ("dlbridge-pyo3", *bench_extensions.PEERS):
        for fn, _, _ in bench_extensions.FUNCTIONS:
            for kind in kinds:
                if kind in bench_extensions.ACCEPTS.get(peer, {kind}):
                    made[f"ext.{fn}.{kind}.{peer}"] = ext(peer, fn, kind)

    def tvm_from_dlpack():
        import tvm_ffi

        return tvm_ffi.from_dlpack

    made["from_dlpack.torch.dlbridge"] = lambda: (loop1, dlbridge.from_dlpack, kinds["torch"]())
    made["from_dlpack.torch.tvm_ffi"] = lambda: (loop1, tvm_from_dlpack(), kinds["torch"]())
    made["from_dlpack.numpy.dlbridge"] = lambda: (loop1, dlbridge.from_dlpack, kinds["numpy"]())
    made["np.from_dlpack.ours"] = lambda: (loop1, np.from_dlpack, kinds["dlbridge"]())
    made["np.from_dlpack.numpy"] = lambda: (loop1, np.from_dlpack, kinds["numpy"]())
    made["__dlpack__v1.ours"] = lambda: (loop_dunder, None, kinds["dlbridge"]())
    made["__dlpack__v1.numpy"] = lambda: (loop_dunder, None, kinds["numpy"]())
    return made


def child(names, n, marks):
    import ctypes

    dump = ctypes.CDLL(marks).cg_dump
    dump(b"set-up")  # ctypes' first call, out of the counted dumps
    made = cases()
    for name in names:
        loop, fn, x = made[name]()
        loop(fn, x, 2000)  # warm-up: caches, lazily built tables, the allocator's free lists
        # Each dump holds what ran since the one before; the first one here takes the set-up's
        # leftovers (deallocations, anything callgrind attributes late) and is not counted.
        dump(f"{name}|warm-up".encode())
        for count in (n, 6 * n):
            label = f"{name}|{count}".encode()
            loop(fn, x, count)
            dump(label)


# ---- the builds --------------------------------------------------------------------------------

def build():
    """Line-table builds of the Rust extensions and of dlbridge's native module, into WORK/prof."""
    prof = WORK / "prof"
    target = CACHE / "target-callgrind"
    env = dict(os.environ, CARGO_TARGET_DIR=str(target), CARGO_PROFILE_RELEASE_DEBUG="line-tables-only",
               PYO3_BUILD_EXTENSION_MODULE="1", PYO3_PYTHON=sys.executable)
    print("==> cargo build --release (line tables) of the bench extensions and dlbridge's native module", file=sys.stderr)
    subprocess.run(["cargo", "build", "--release", "--quiet", "-p", "dlbridge-bench-ext", "-p", "numpy-bench-ext",
                    "-p", "dlbridge-python"], cwd=ROOT, env=env, check=True)
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    shutil.rmtree(prof, ignore_errors=True)
    shutil.copytree(ROOT / "bindings/python/python/dlbridge", prof / "dlbridge",
                    ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    for lib, dest in [("libdlbridge_bench_ext.so", f"dlbridge_bench_ext{suffix}"),
                      ("libnumpy_bench_ext.so", f"numpy_bench_ext{suffix}"),
                      ("lib_native.so", f"dlbridge/_native{suffix}")]:
        shutil.copy(target / "release" / lib, prof / dest)
    marks = WORK / "marks.so"
    (WORK / "marks.c").write_text(MARKS_C)
    subprocess.run(["gcc", "-O1", "-shared", "-fPIC", str(WORK / "marks.c"), "-o", str(marks)], check=True)
    return prof, marks


# ---- reading callgrind's output ---------------------------------------------------------------

def parse(path):
    """One dump (uncompressed names): (label, self costs by (object, file, function), and calls
    by (callee object, callee, caller object, caller file, caller, line) as [count, inclusive])."""
    label, costs, calls = None, defaultdict(int), defaultdict(lambda: [0, 0])
    ob = fl = fi = fn = cob = cfn = None
    call = None  # the count of the call whose inclusive cost the next cost line holds
    for line in Path(path).read_text(errors="replace").splitlines():
        if line.startswith("desc: Trigger: Client Request: "):
            label = line[len("desc: Trigger: Client Request: "):].strip()
        elif line.startswith("ob="):
            ob = line[3:]
        elif line.startswith("fl="):
            fl = fi = line[3:]
        elif line.startswith(("fi=", "fe=")):
            fi = line[3:]
        elif line.startswith("fn="):
            fn, fi, cob = line[3:], fl, None
        elif line.startswith("cob="):
            cob = line[4:]
        elif line.startswith("cfn="):
            cfn = line[4:]
        elif line.startswith("calls="):
            call = int(line[6:].split()[0])
        elif line and (line[0].isdigit() or line[0] in "+-*"):
            parts = line.split()
            if len(parts) < 2:
                continue
            if call is not None:
                entry = calls[(cob or ob, cfn, ob, fi, fn, parts[0])]
                entry[0] += call
                entry[1] += int(parts[1])
                call, cob = None, None
            else:
                costs[(ob, fi, fn)] += int(parts[1])
    return label, costs, calls


SOURCES = [("dlbridge-pyo3/src/borrows/", "registry"), ("dlbridge-pyo3/src/", "dlbridge-pyo3"),
           ("dlbridge/src/", "dlbridge core"), ("bindings/python/src/", "dlbridge module"),
           ("/pyo3-0.", "PyO3"), ("/pyo3-ffi-0.", "PyO3"), ("/numpy-0.", "rust-numpy"),
           ("/ndarray-0.", "ndarray"), ("benchmarks/ext/", "bench function")]


RUST_OBJECTS = ("dlbridge_bench_ext", "_native", "numpy_bench_ext")


def group(ob, file, fn):
    """(group, detail) for one cost's object, source file and function."""
    obname = os.path.basename(ob or "?")
    fn = fn or "?"
    file = file or "?"
    if obname.startswith(("libc.so", "ld-linux")):
        if re.search(r"(malloc|free|calloc|realloc|memalign|tcache)", fn):
            return "allocation (libc)", fn
        if re.search(r"mem(cpy|move|set|cmp)|str(len|cmp)", fn):
            return "memcpy/memset/strlen (libc)", fn
        return "libc other", fn
    for marker, name in SOURCES:
        if marker in file:
            rest = file.split(marker, 1)[1]
            return name, rest.split("/src/", 1)[1] if "/src/" in rest else rest
    if "/rustc/" in file or "/library/" in file:
        if re.search(r"alloc|raw_vec|boxed", file):
            return "Rust alloc (Vec/Box)", file.split("/library/", 1)[-1]
        return "Rust core/std", file.split("/library/", 1)[-1]
    if obname.startswith("python") or obname.startswith("libpython"):
        return "CPython", fn
    if "_multiarray_umath" in obname:
        return "NumPy", fn
    if obname.startswith(("libtorch", "libc10", "libshm")):
        return "torch", fn
    if "tvm_ffi" in obname or obname.startswith("core.cpython"):
        return "tvm-ffi", fn
    if "nanobind" in obname:
        return "nanobind", fn
    if obname.startswith(RUST_OBJECTS):
        return f"{obname.split('.')[0]} (no line info)", fn
    return f"other ({obname})", fn


def report(dumps, top):
    by_case = defaultdict(dict)
    for path in dumps:
        label, costs, calls = parse(path)
        if label and "|" in label and not label.endswith("|warm-up"):
            name, count = label.rsplit("|", 1)
            by_case[name][int(count)] = (costs, calls)
    for name, runs in by_case.items():
        ((n1, (c1, k1)), (n2, (c2, k2))) = sorted(runs.items())
        per = {k: (c2.get(k, 0) - c1.get(k, 0)) / (n2 - n1) for k in set(c1) | set(c2)}
        total = sum(per.values())
        groups, details, functions = defaultdict(float), defaultdict(float), defaultdict(float)
        for (ob, file, fn), v in per.items():
            g, d = group(ob, file, fn)
            groups[g] += v
            details[(g, d)] += v
            functions[(os.path.basename(ob or "?"), fn)] += v
        print(f"\n== {name}: {total:,.0f} instructions per call (incl. the Python loop)")
        print("   by group:   " + ", ".join(f"{g} {v:,.0f}" for g, v in sorted(groups.items(), key=lambda kv: -kv[1])
                                          if abs(v) >= 1))
        print("   by source file or function:")
        for (g, d), v in sorted(details.items(), key=lambda kv: -kv[1])[:top]:
            if v >= 1:
                print(f"     {v:8,.0f}  {g:<28} {d[:100]}")
        print("   by function symbol (self; inlined code counts in its caller):")
        for (ob, fn), v in sorted(functions.items(), key=lambda kv: -kv[1])[:top]:
            if v >= 1:
                print(f"     {v:8,.0f}  {ob[:28]:<28} {fn[:110]}")
        sites = defaultdict(lambda: [0.0, 0.0])
        inclusive = defaultdict(float, functions)
        for key in set(k1) | set(k2):
            cob, cfn, ob, file, fn, line = key
            (a1, i1), (a2, i2) = k1.get(key, (0, 0)), k2.get(key, (0, 0))
            count, cost = (a2 - a1) / (n2 - n1), (i2 - i1) / (n2 - n1)
            if cfn != fn:  # a recursive call is in the function's own cost already
                inclusive[(os.path.basename(ob or "?"), fn)] += cost
            if group(cob, None, cfn)[0].startswith(("allocation", "memcpy")):
                site = sites[(cfn, fn, f"{group(ob, file, fn)[1]}:{line}")]
                site[0] += count
                site[1] += cost
        ours = [(k, v) for k, v in sorted(inclusive.items(), key=lambda kv: -kv[1])
                if k[0].startswith(RUST_OBJECTS) and re.match(r"<?(dlbridge|numpy|pyo3)", k[1] or "") and v >= 1]
        if ours:
            print("   Rust functions of the extension, inclusive (their code, inlined code and all they call):")
            for (ob, fn), v in ours[:top]:
                print(f"     {v:8,.0f}  {ob[:28]:<28} {fn[:110]}")
        shown = [(k, v) for k, v in sorted(sites.items(), key=lambda kv: -kv[1][1]) if v[0] >= 0.01]
        if shown:
            print("   calls into allocation and memcpy, by call site (calls per call, instructions inclusive):")
            for (callee, caller, at), (count, cost) in shown[:top]:
                print(f"     {cost:8,.0f}  {count:4.1f}x {callee[:30]:<30} from {caller[:70]} ({at[-45:]})")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("patterns", nargs="*", default=["*"], help="case names or fnmatch patterns (--list)")
    parser.add_argument("--calls", type=int, default=2000, help="N: each case is counted over N and 6N calls")
    parser.add_argument("--top", type=int, default=18, help="rows per table")
    parser.add_argument("--list", action="store_true", help="print the case names")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    if args.child:
        sys.path.insert(0, args.child[0])
        child(args.patterns, args.calls, args.child[1])
        return
    names = [n for n in cases() if any(fnmatch.fnmatchcase(n, p) for p in args.patterns)]
    if args.list or not names:
        print("\n".join(cases()))
        return
    prof, marks = build()
    out = WORK / "out"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    print(f"==> callgrind over {len(names)} case(s): {', '.join(names)}", file=sys.stderr)
    env = dict(os.environ, PYTHONHASHSEED="0", OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    log = WORK / "valgrind.log"
    with open(log, "w") as f:
        proc = subprocess.run(["valgrind", "--tool=callgrind", "--compress-strings=no", "--compress-pos=no",
                               f"--callgrind-out-file={out}/cg.%p", sys.executable, __file__, "--child", str(prof),
                               str(marks), "--calls", str(args.calls), *names], env=env, stdout=f, stderr=f)
    if proc.returncode != 0:
        sys.exit(f"callgrind run failed ({proc.returncode}); the end of {log}:\n" +
                 "\n".join(log.read_text(errors="replace").splitlines()[-25:]))
    report(sorted(out.glob("cg.*"), key=lambda p: int(p.name.rsplit(".", 1)[-1]) if p.name.count(".") > 1 else 0),
           args.top)


if __name__ == "__main__":
    main()
