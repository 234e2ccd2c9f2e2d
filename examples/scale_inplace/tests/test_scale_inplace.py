"""The example extension, called on NumPy and torch objects: its writes are seen in the caller's
own object."""

import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bindings" / "python" / "tests"))

import dlbridge
import scale_inplace


def test_scales_numpy_array_in_place():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    scale_inplace.scale(a, 2.0)
    assert a.tolist() == [[0, 2, 4], [6, 8, 10]]
    v = a[:, ::-2]  # negative strides, a view into `a`
    scale_inplace.scale(v, 10.0)
    assert a.tolist() == [[0, 2, 40], [60, 8, 100]]


def test_scales_torch_tensor_in_place():
    x = torch.ones(3, 4)
    scale_inplace.scale(x, 3.0)
    assert torch.equal(x, torch.full((3, 4), 3.0))
    scale_inplace.scale(x.T, 0.5)
    assert torch.equal(x, torch.full((3, 4), 1.5))


def test_refusals():
    with pytest.raises(TypeError, match="expected a float32 CPU tensor, got a numpy.ndarray of float64"):
        scale_inplace.scale(np.ones(3), 2.0)
    ro = np.ones(3, dtype=np.float32)
    ro.flags.writeable = False
    with pytest.raises(BufferError, match="read-only; pass a writable copy"):
        scale_inplace.scale(ro, 2.0)
    with pytest.raises(BufferError, match="overlap"):
        aliased = np.lib.stride_tricks.as_strided(np.ones(1, dtype=np.float32), shape=(4,), strides=(0,))
        scale_inplace.scale(aliased, 2.0)
    with pytest.raises(TypeError, match="cannot make a tensor"):
        scale_inplace.scale("not a tensor", 2.0)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: scale_inplace.scale(np.ones(3), 2.0),
         "expected a float32 CPU tensor, got a numpy.ndarray of float64 with shape (3,) on cpu:0"),
        (lambda: scale_inplace.total(torch.ones(2, 3, 4, dtype=torch.float64)),
         "expected a float32 CPU tensor, got a torch.Tensor of float64 with shape (2, 3, 4) on cpu:0"),
        (lambda: scale_inplace.row_sums(np.ones(3, np.float32)),
         "expected a float32 2-d C-contiguous CPU tensor, got a numpy.ndarray of float32 with shape (3,) on cpu:0"),
        (lambda: scale_inplace.row_sums(np.ones((2, 3), np.float32).T),
         "expected a float32 2-d C-contiguous CPU tensor, got a numpy.ndarray of float32 with shape (3, 2), F-contiguous on cpu:0"),
        (lambda: scale_inplace.row_sums(np.ones((2, 6), np.float32)[:, ::2]),
         "expected a float32 2-d C-contiguous CPU tensor, got a numpy.ndarray of float32 with shape (2, 3), strided on cpu:0"),
    ],
    ids=["dtype", "dtype torch", "rank", "layout F", "layout strided"],
)
def test_a_mismatched_argument_is_a_type_error_that_names_both(call, message):
    with pytest.raises(TypeError) as info:
        call()
    assert str(info.value) == message
    assert info.value.__notes__ == ["while processing 'x'"], "PyO3 names the argument"


def test_device_memory_is_not_a_cpu_argument():
    from dlpack_ctypes import DLDevice, FakeProducer  # the package's test helpers

    p = FakeProducer(values=(1.0, 2.0), shape=(2,))
    p.tensor.device = DLDevice(2, 0)  # host memory labelled CUDA: never read
    t = dlbridge.from_dlpack(p.capsule())
    try:
        scale_inplace.total(t)
    except TypeError as err:
        message = str(err)
    # The fake producer's struct must outlive the tensor that owns it.
    del t
    assert message == "expected a float32 CPU tensor, got a dlbridge.Tensor of float32 with shape (2,) on cuda:0"


def test_an_immutable_jax_array_is_told_to_pass_a_copy():
    jnp = pytest.importorskip("jax.numpy")
    with pytest.raises(BufferError, match=r"legacy DLPack capsule.*pass a writable copy \(e.g. numpy.array\(x\)\)"):
        scale_inplace.scale(jnp.ones(3, dtype=jnp.float32), 2.0)


@pytest.mark.parametrize("framework", ["numpy", "torch", "jax", "dlbridge"])
def test_a_matching_argument_of_each_framework_is_read_without_a_copy(framework):
    base = np.arange(6, dtype=np.float32).reshape(2, 3)
    if framework == "torch":
        x = torch.from_numpy(base)
    elif framework == "jax":
        jnp = pytest.importorskip("jax.numpy")
        x = jnp.asarray(base)
    elif framework == "dlbridge":
        x = dlbridge.from_dlpack(base)
    else:
        x = base
    assert scale_inplace.total(x) == 15.0
    assert scale_inplace.row_sums(x).tolist() == [3.0, 12.0]
    if framework in ("numpy", "torch", "dlbridge"):
        scale_inplace.scale(x, 2.0)  # written in place: seen in the NumPy array underneath
        assert base.tolist() == [[0, 2, 4], [6, 8, 10]]


def test_reads_and_returns():
    assert scale_inplace.total(torch.arange(5, dtype=torch.float32)) == 10.0
    assert scale_inplace.total(np.ones((2, 2), dtype=np.float32)[::-1]) == 4.0
    t = scale_inplace.arange(4)
    assert np.from_dlpack(t).tolist() == [0, 1, 2, 3]
    assert torch.from_dlpack(t).sum().item() == 6


@pytest.mark.parametrize("n", [2**45, 2**61, 2**64 - 1])
def test_a_size_too_large_to_allocate_is_a_memory_error(n):
    # Collecting into a Vec aborted the interpreter (no memory for 2**45 floats, more than the
    # address space) or panicked (capacity overflow).
    code = f"import scale_inplace\ntry:\n    scale_inplace.arange({n})\nexcept MemoryError:\n    print('MemoryError')\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout) == (0, "MemoryError\n"), proc.stderr[-2000:]
    assert scale_inplace.arange(3).tolist() == [0.0, 1.0, 2.0]


def test_a_dlbridge_tensor_is_read_and_written_in_place_with_its_refusals():
    """Another extension's arguments take a dlbridge.Tensor as the package describes it (memory,
    writability, readiness): no export through the exchange table or __dlpack__, and the tensor's
    own writability decides, as it would through an export."""
    from dlbridge import _native

    base = np.arange(4, dtype=np.float32)
    t = dlbridge.from_dlpack(base)
    before = dict(_native._exchange_api_calls())
    assert scale_inplace.total(t) == 6.0
    scale_inplace.scale(t, 2.0)
    assert base.tolist() == [0, 2, 4, 6]
    assert dict(_native._exchange_api_calls()) == before, "exported instead of described"

    ro = np.ones(2, dtype=np.float32)
    ro.flags.writeable = False
    with pytest.raises(BufferError, match="read-only; pass a writable copy"):
        scale_inplace.scale(dlbridge.from_dlpack(ro), 2.0)
    from dlpack_ctypes import FakeProducer

    producer = FakeProducer((1.0, 1.0), shape=(2,), versioned=False)
    legacy = dlbridge.from_dlpack(producer.capsule())
    with pytest.raises(BufferError, match="legacy DLPack capsule"):
        scale_inplace.scale(legacy, 2.0)
    assert scale_inplace.total(legacy) == 2.0


def test_a_tensor_made_by_copying_is_still_written_in_place():
    """IS_COPIED says how a tensor was made, not that writes to it are lost: a dlbridge.Tensor owns
    what it was copied into, and every holder sees the writes (in another extension, and in the
    package's own)."""
    from dlbridge import _native

    t = dlbridge.from_dlpack(np.ones(3, dtype=np.float32), copy=True)
    assert t.is_copied
    scale_inplace.scale(t, 2.0)
    assert t.tolist() == [2.0, 2.0, 2.0]
    u = dlbridge.from_dlpack(np.zeros(2, np.uint8), copy=True)
    _native._read_then_write(np.zeros(1, np.uint8), u)  # the package's own class, in place
    assert u.is_copied and u.tolist() == [1, 1]


def torch_tensors_of_every_provenance():
    """torch tensors whose memory a reader might expect torch to call read-only or copied: from a
    read-only NumPy array, from immutable bytes, made in inference mode, a copy-on-write clone."""
    ro = np.arange(3, dtype=np.float32)
    ro.flags.writeable = False
    with torch.inference_mode():
        inference = torch.ones(3)
    with warnings.catch_warnings():  # torch warns, once, that it will treat these as writable
        warnings.simplefilter("ignore", UserWarning)
        from_ro = torch.from_numpy(ro)
        from_bytes = torch.frombuffer(bytes(12), dtype=torch.float32)  # a fresh object nothing shares
    return {"plain": torch.ones(3), "read-only numpy": from_ro, "bytes": from_bytes, "inference": inference,
            "lazy clone": torch._lazy_clone(torch.ones(3))}


def test_torch_exports_say_writable_unless_asked():
    """What a writable torch argument rests on: it is filled through torch's table, which carries no
    flags, and taken as writable because torch's versioned exports never set READ_ONLY or IS_COPIED
    unless the consumer asks. If a torch release starts to, this fails, and the fill must stop
    being taken for writes (exchange/guard.rs, `fill_writability`)."""
    from dlpack_ctypes import IS_COPIED, READ_ONLY, read_capsule

    for name, t in torch_tensors_of_every_provenance().items():
        flags = read_capsule(t.__dlpack__(max_version=(1, 0))).flags
        assert flags & (READ_ONLY | IS_COPIED) == 0, name
        asked = read_capsule(t.__dlpack__(max_version=(1, 0), read_only=True)).flags
        assert asked & READ_ONLY, f"{name}: torch no longer marks an export read-only when asked"


def test_a_torch_tensor_is_written_in_place_as_its_export_allows():
    """Each kind is written in place as through torch's own export. A copy-on-write clone gets
    its own memory before the write (the fill materialises it, as the export does), so what it was
    cloned from is untouched; torch's refusals and the negative bit still refuse."""
    for name, t in torch_tensors_of_every_provenance().items():
        before = t.clone()
        scale_inplace.scale(t, 2.0)
        assert torch.equal(t, before * 2), name
    base = torch.arange(4, dtype=torch.float32)
    clone = torch._lazy_clone(base)
    scale_inplace.scale(clone, 10.0)
    assert base.tolist() == [0, 1, 2, 3]
    assert clone.tolist() == [0, 10, 20, 30]
    with pytest.raises(BufferError, match="require gradient"):
        scale_inplace.scale(torch.ones(3, requires_grad=True), 2.0)
    neg = torch.tensor([1.0, -2.0])._neg_view()
    with pytest.raises(BufferError, match="negative bit"):
        scale_inplace.scale(neg, 2.0)
    with pytest.raises(BufferError, match="overlap"):
        scale_inplace.scale(torch.ones(1).expand(4), 2.0)
    from dlbridge import _native

    x = torch.zeros(4, dtype=torch.uint8)
    with pytest.raises(BufferError):
        _native._read_then_write(x, x)  # one tensor, read and written by one call
    with pytest.raises(BufferError):
        _native._read_then_write(x[:3], x[2:])
    assert x.tolist() == [0] * 4, "nothing was written through a refused borrow"
    _native._read_then_write(x[:2], x[2:])
    assert x.tolist() == [0, 0, 1, 1]


def test_a_torch_subclass_with_a_read_only_table_is_not_written():
    """Only torch.Tensor's own table is taken as writable: torch's ReadOnlyTensorWrapper publishes a
    table of its own whose exports are read-only (and whose fill does not materialise a copy-on-write
    clone). With its hooks switched off, torch's checks pass; the write must still be refused, and
    the tensor the clone shares memory with left as it was."""
    from torch.utils.dlpack import ReadOnlyTensorWrapper

    base = torch.arange(4, dtype=torch.float32)
    wrapped = ReadOnlyTensorWrapper(torch._lazy_clone(base))
    for hooks_off in (torch._C.DisableTorchFunctionSubclass, torch._C.DisableTorchFunction):
        with hooks_off(), pytest.raises(BufferError, match="read-only"):
            scale_inplace.scale(wrapped, 10.0)
    assert base.tolist() == [0, 1, 2, 3]
    with pytest.raises(BufferError, match="read-only"):
        scale_inplace.scale(wrapped, 10.0)
    assert scale_inplace.total(wrapped) == 6.0


class _ReadOnlyExports(torch.Tensor):
    """Marks its exports read-only in __torch_function__, as torch's __dlpack__ dispatches it."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.__dlpack__:
            kwargs["read_only"] = True
            kwargs.setdefault("max_version", (1, 0))
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)


class _RefusesExport(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.Tensor.__dlpack__:
            raise BufferError("this subclass refuses export")
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


class _ExportsAnother(torch.Tensor):
    other = torch.full((4,), 7.0)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.Tensor.__dlpack__:
            return cls.other.__dlpack__(**(kwargs or {}))
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("hook", ["read-only", "refuses", "another tensor", "mode refuses"])
def test_torch_function_hooks_on_dlpack_are_honoured(hook):
    """torch's __dlpack__ dispatches __torch_function__ (a subclass's, a mode's) first; its exchange
    table does not. A subclass or mode that marks the export read-only, refuses it, or exports
    another tensor was bypassed: the table was used, and the argument written. Now a type with hooks,
    and every type while a mode is active, goes through __dlpack__, and gets what NumPy gets."""
    from torch.overrides import TorchFunctionMode

    class RefusingMode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is torch.Tensor.__dlpack__:
                raise BufferError("mode refuses export")
            return func(*args, **(kwargs or {}))

    kind = {"read-only": _ReadOnlyExports, "refuses": _RefusesExport, "another tensor": _ExportsAnother}
    x = torch.ones(4) if hook == "mode refuses" else torch.ones(4).as_subclass(kind[hook])
    mode = RefusingMode() if hook == "mode refuses" else warnings.catch_warnings()

    def outcome(take):
        try:
            return take()
        except BufferError as err:
            return f"refused: {err}"

    with mode:
        direct = outcome(lambda: np.from_dlpack(x).tolist())
        relayed = outcome(lambda: dlbridge.from_dlpack(x).tolist())
        read = outcome(lambda: scale_inplace.total(x))
        written = outcome(lambda: scale_inplace.scale(x, 2.0))
    assert relayed == direct
    if hook in ("refuses", "mode refuses"):
        assert direct.startswith("refused") and read == direct and written == direct
    elif hook == "read-only":
        assert read == 4.0 and "read-only" in written
    else:
        assert direct == [7.0] * 4 and read == 28.0 and written is None
        assert _ExportsAnother.other.tolist() == [14.0] * 4
        _ExportsAnother.other.fill_(7.0)
    assert x.as_subclass(torch.Tensor).tolist() == [1.0] * 4, "the tensor itself is never written"

