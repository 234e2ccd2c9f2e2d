"""Producers that change things after they handed them over (attack class 1): a ctypes producer that
rewrites, then frees, its shape and strides after export; torch's in-place metadata ops
(`unsqueeze_`, `t_`, `as_strided_`); a torch subclass whose `__torch_function__` resizes the storage
in every hook. Each case runs in its own interpreter, through every import path and every extension
argument type: a read of freed memory there is a crash or garbage, which the child reports.

NumPy is the control: it copies metadata at import, and torch runs its hooks before it exports."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HERE = Path(__file__).parent

PRELUDE = f"""
import sys; sys.path.insert(0, {str(HERE)!r})
import ctypes, gc
import numpy as np
import dlbridge, scale_inplace
from dlbridge import _native
from dlpack_ctypes import FakeProducer
"""


def run_child(setup, code, timeout=300):
    """Runs `setup` (module-level code) then `code` (dedented) in a fresh interpreter; returns its stdout."""
    source = PRELUDE + setup + textwrap.dedent(code)
    proc = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"child died with {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


# --- a C producer that rewrites and frees its metadata --------------------------------------------

# A producer object over a FakeProducer whose shape and strides live in malloc'd memory: each
# `__dlpack__` hands out a fresh capsule; `vandalise()` then claims 4x the elements at 16x the
# stride, frees the arrays (no Python object keeps them), and fills the blocks malloc hands out next
# with 0xff, so a view that kept the producer's pointers reads garbage (or, under valgrind, freed
# memory).
VANDAL = """
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
class Vandal:
    def __init__(self):
        self.fake = FakeProducer(values=[float(v) for v in range(8)], shape=(2, 4))
        self.arrays = libc.malloc(32)
        (ctypes.c_int64 * 4).from_address(self.arrays)[:] = [2, 4, 4, 1]
        pointer = ctypes.POINTER(ctypes.c_int64)
        self.fake.tensor.shape = ctypes.cast(ctypes.c_void_p(self.arrays), pointer)
        self.fake.tensor.strides = ctypes.cast(ctypes.c_void_p(self.arrays + 16), pointer)
    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        return self.fake.capsule()
    def __dlpack_device__(self):
        return (1, 0)
    def vandalise(self):
        (ctypes.c_int64 * 4).from_address(self.arrays)[:] = [8, 16, 64, 4]
        libc.free(self.arrays)
        junk = [libc.malloc(32) for _ in range(64)]
        for block in junk:
            ctypes.memset(block, 0xff, 32)
        return junk
"""


@pytest.mark.parametrize("route", ["from_dlpack", "asarray", "capsule", "copy"])
def test_a_producer_that_rewrites_its_metadata_after_export_changes_nothing(route):
    out = run_child(VANDAL, f"""
        import pickle
        v = Vandal()
        route = {route!r}
        if route == "capsule":
            t = dlbridge.from_dlpack(v.__dlpack__())
        elif route == "copy":
            t = dlbridge.from_dlpack(v, copy=True)
        else:
            t = getattr(dlbridge, route)(v)
        junk = v.vandalise()
        print(t.shape, t.strides, t.size, t.nbytes)
        print(t.tolist(), t.copy().tolist(), np.asarray(t).tolist(), memoryview(t).tolist())
        print(np.from_dlpack(t).tolist(), pickle.loads(pickle.dumps(t)).tolist())
        for block in junk:
            libc.free(block)
    """)
    values = "[[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]"
    assert out.splitlines() == ["(2, 4) (4, 1) 8 32", " ".join([values] * 4), f"{values} {values}"]


def test_an_argument_whose_producer_changes_while_it_is_held_keeps_its_layout():
    # An extension holds its arguments while Python runs: PyO3 extracts later arguments (their
    # __dlpack__, __index__...), and extensions call back. The argument keeps its validated layout.
    out = run_child(VANDAL, """
        v = Vandal()
        junk, shape = _native._while_borrowed(v, v.vandalise)
        print(shape)
        for block in junk:
            libc.free(block)
    """)
    assert out.split() == ["[2,", "4]"]


# --- torch rewrites shape and strides in place ----------------------------------------------------

TORCH_ROUTES = ["from_dlpack", "asarray", "dunder", "total", "scale"]

TORCH_PRELUDE = """
import torch
class Dunder(torch.Tensor):
    # Overrides __dlpack__, so it goes through torch's capsule instead of its C table.
    def __dlpack__(self, *args, **kwargs):
        return super().__dlpack__(*args, **kwargs)
def take(x, route):
    if route == "dunder":
        return dlbridge.from_dlpack(x.as_subclass(Dunder))
    return getattr(dlbridge, route)(x)
"""


@pytest.mark.parametrize("route", ["from_dlpack", "asarray", "dunder"])
def test_torch_unsqueeze_in_place_after_import(route):
    out = run_child(TORCH_PRELUDE, f"""
        x = torch.zeros(2, 2, 2, 2, 2, 2)
        t = take(x, {route!r})
        for _ in range(4):
            x.unsqueeze_(0)   # torch reallocates its out-of-line metadata past 5 dims
        junk = [torch.zeros(1, 1, 1, 1, 1, 1, 1) for _ in range(64)]
        print(t.shape, t.strides, t.size)
        print(sum(sum(row) for row in np.asarray(t).reshape(8, 8).tolist()))
    """)
    assert out.splitlines() == ["(2, 2, 2, 2, 2, 2) (32, 16, 8, 4, 2, 1) 64", "0.0"]


@pytest.mark.parametrize("route", ["from_dlpack", "asarray", "dunder"])
def test_torch_as_strided_in_place_after_import_cannot_widen_a_copy(route):
    out = run_child(TORCH_PRELUDE, f"""
        N = 1 << 20
        base = torch.arange(4 * N, dtype=torch.float32)
        x = base[:N]
        t = take(x, {route!r})
        x.as_strided_((2 * N,), (2,))
        x.t_()
        c = t.copy()
        print(t.shape, t.strides, t.nbytes, c.shape, c.nbytes)
        print(np.array_equal(np.asarray(c), np.arange(N, dtype=np.float32)))
    """)
    assert out.splitlines() == ["(1048576,) (1,) 4194304 (1048576,) 4194304", "True"]


def test_torch_metadata_changes_between_extension_calls():
    out = run_child(TORCH_PRELUDE, """
        x = torch.ones(4, 1, 1, 1, 1, 1)
        print(scale_inplace.total(x))
        x.unsqueeze_(0); x.unsqueeze_(0)
        scale_inplace.scale(x, 2.0)
        print(scale_inplace.total(x), x.sum().item())
    """)
    assert out.split() == ["4.0", "8.0", "8.0"]


# --- a torch subclass whose hooks resize the storage ----------------------------------------------

RESIZER = """
import torch
N = 1 << 20
class Resizer(torch.Tensor):
    # Every hook grows the storage, which torch reallocates: any pointer taken before the hook
    # points at freed memory afterwards.
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        with torch._C.DisableTorchFunctionSubclass():
            for a in args:
                if isinstance(a, Resizer) and a.dim() == 1:
                    n = a.shape[0]
                    a.resize_(n + N)
                    a[n:] = 1.0
        return super().__torch_function__(func, types, args, kwargs)
def fresh():
    return torch.ones(N).as_subclass(Resizer)
"""


@pytest.mark.parametrize("route", TORCH_ROUTES + ["read_then_write"])
def test_a_subclass_that_resizes_in_every_hook_is_exported_after_its_hooks(route):
    # The table's checks (requires_grad, is_conj, is_neg) dispatch __torch_function__; they run
    # before the table exports or fills, so dlbridge holds the storage as it is afterwards.
    out = run_child(RESIZER, f"""
        route = {route!r}
        x = fresh()
        if route == "total":
            r = scale_inplace.total(x)
            print(r % N == 0 and r > 0)
        elif route == "scale":
            scale_inplace.scale(x, 3.0)
            print(x.as_subclass(torch.Tensor).sum().item() % (3 * N) == 0)
        elif route == "read_then_write":
            y = fresh()
            print(_native._read_then_write(x, torch.zeros(8, dtype=torch.uint8)) % N == 0)
        else:
            t = dlbridge.from_dlpack(x) if route == "from_dlpack" else (dlbridge.asarray(x) if route == "asarray" else
                dlbridge.from_dlpack(x.as_subclass(torch.Tensor)))
            c = np.asarray(t.copy())
            print(c.size % N == 0 and bool((c == 1.0).all()))
    """)
    assert out.split() == ["True"]


def test_a_subclass_that_becomes_a_conjugate_view_in_its_hooks_is_refused():
    # The conjugate bit is asked only of complex tensors, as a first look at the dtype says; a hook
    # that makes the tensor a complex conjugate view afterwards must not slip through un-conjugated.
    out = run_child("", """
        import torch
        class Shifty(torch.Tensor):
            @classmethod
            def __torch_function__(cls, func, types, args=(), kwargs=None):
                with torch._C.DisableTorchFunctionSubclass():
                    for a in args:
                        if isinstance(a, Shifty) and not a.is_complex():
                            a.data = torch.tensor([1 + 2j, 3 - 4j]).conj()
                return super().__torch_function__(func, types, args, kwargs)
        for take in (dlbridge.from_dlpack, dlbridge.asarray, scale_inplace.total):
            x = torch.ones(2).as_subclass(Shifty)
            try:
                r = take(x)
                print("taken", r if isinstance(r, float) else np.asarray(r).tolist())
            except (BufferError, TypeError, RuntimeError) as err:
                print("refused")
    """)
    assert all(line in ("refused", "taken [1.0, 1.0]", "taken 2.0") for line in out.splitlines()), out
    assert "(1+2j)" not in out and "(3-4j)" not in out


@pytest.mark.parametrize("route", ["from_dlpack", "asarray", "total", "scale"])
def test_a_torch_function_mode_that_resizes_plain_tensors_runs_before_the_export(route):
    # A mode intercepts the checks of a plain torch.Tensor too: the checks then run first.
    out = run_child(RESIZER, f"""
        from torch.overrides import TorchFunctionMode
        class Grow(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                with torch._C.DisableTorchFunction():
                    for a in args:
                        if isinstance(a, torch.Tensor) and a.dim() == 1 and a.shape[0] < 8 * N:
                            n = a.shape[0]
                            a.resize_(n + N)
                            a[n:] = 1.0
                return func(*args, **(kwargs or {{}}))
        x = torch.ones(N)
        with Grow():
            route = {route!r}
            if route == "total":
                r = scale_inplace.total(x)
                print(r % N == 0 and r > 0)
            elif route == "scale":
                scale_inplace.scale(x, 3.0)
                print(True)
            else:
                t = getattr(dlbridge, route)(x)
        if route in ("from_dlpack", "asarray"):
            c = np.asarray(t.copy())
            print(c.size % N == 0 and bool((c == 1.0).all()))
    """)
    assert out.split() == ["True"]
