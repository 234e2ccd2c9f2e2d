"""Dask (`distributed`) as a transport: `import dlbridge` registers Tensor with distributed's
serialization, dask.sizeof and Dask's tokens in any process that imports them, and imports none of
them itself. A tensor travels as a header and one frame, its own bytes (no copy on the sending side);
every kind of writability arrives as it was sent (unknown stays unknown), in this process and through
a LocalCluster's worker process and back. Sizes as Dask reports them are the bytes a tensor spans."""

import subprocess
import sys

import numpy as np
import pytest
from dask.sizeof import sizeof
from distributed import Client, LocalCluster
from distributed.protocol import deserialize, serialize

import dlbridge
from dlpack_ctypes import FakeProducer
from test_pickle_routes import SOURCES, readonly_tensor, unknown_from_a_legacy_capsule

ENGINES = ("dask", "distributed", "ray")
_KEEP = []


def tensor(kind):
    """Every kind of tensor a user may send: the three writabilities (and their origins), the dtypes
    NumPy lacks, non-contiguous views, a tensor in shared memory and an empty one."""
    if kind in SOURCES:
        return SOURCES[kind]()
    import ml_dtypes

    values = np.arange(12, dtype=np.float32).reshape(3, 4)
    made = {
        "bfloat16": lambda: dlbridge.from_dlpack(values.astype(ml_dtypes.bfloat16)),
        "float4, one per byte": lambda: dlbridge.from_dlpack((values % 6).astype(ml_dtypes.float4_e2m1fn)),
        "float4, packed": lambda: dlbridge.zeros(5, "float4_e2m1fn"),
        "non-contiguous": lambda: dlbridge.from_dlpack(values[:, ::2]),
        "read-only, non-contiguous": lambda: dlbridge.from_dlpack(np.frombuffer(values.tobytes(), np.float32)[::3]),
        "shared memory": lambda: dlbridge.from_dlpack(values).share_memory(),
        "empty": lambda: dlbridge.zeros((0, 3), "int64"),
    }
    return made[kind]()


KINDS = [*SOURCES, "bfloat16", "float4, one per byte", "float4, packed", "non-contiguous",
         "read-only, non-contiguous", "shared memory", "empty"]


def contiguous(t):
    return t.strides == t.copy().strides


def described(t):
    """What must survive a transport."""
    return t._writability, str(t.dtype), t.shape, t._subbyte_padded, bytes(memoryview(t.copy()._bytes()))


def imported_engines(code):
    result = subprocess.run([sys.executable, "-c", code + "\nimport sys\n"
                             f"print(sorted(m for m in sys.modules if m.split('.')[0] in {ENGINES}))"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()


def test_import_dlbridge_imports_no_engine():
    assert imported_engines("import dlbridge; dlbridge.zeros(2).share_memory()") == ["[]"]


@pytest.mark.parametrize("order", ["import dlbridge; import distributed",
                                   "import distributed; import dlbridge",
                                   "import dask; import dlbridge; import distributed.protocol"])
def test_registered_whichever_is_imported_first(order):
    code = f"""{order}
from dask.sizeof import sizeof
from dask.base import tokenize
from distributed.protocol import serialize
t = dlbridge.zeros(1024)
header, frames = serialize(t)
print(header["serializer"], len(frames), sizeof(t), tokenize(t) == tokenize(dlbridge.zeros(1024)))"""
    assert imported_engines(code)[0] == "dask 1 4096 True"


def test_a_registration_that_fails_warns_and_the_import_goes_on():
    code = """import warnings, dlbridge._after_import as after
def fails(module):
    raise RuntimeError("no")
after.when_imported("colorsys", fails)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import colorsys
print(colorsys.rgb_to_hsv(0, 0, 0), [str(w.message) for w in caught])"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "(0.0, 0.0, 0) [\"dlbridge could not register with colorsys: RuntimeError('no')\"]", out


@pytest.mark.parametrize("kind", KINDS)
def test_one_frame_over_the_tensors_own_bytes(kind):
    t = tensor(kind)
    header, frames = serialize(t, serializers=["dask"], on_error="raise")
    assert header["serializer"] == "dask" and len(frames) == 1 and memoryview(frames[0]).nbytes == len(described(t)[4])
    if contiguous(t):  # contiguous: the frame is the tensor's memory
        assert np.frombuffer(frames[0], np.uint8).ctypes.data == t.data_ptr or t.size == 0
    here = deserialize(header, frames)  # the frames as given, in this process
    assert described(here) == described(t)
    if t._writability != "unknown" and contiguous(t) and not t.is_shared and t.size:
        assert here.data_ptr == t.data_ptr, "over the same bytes, as NumPy's deserializer is"


@pytest.mark.parametrize("as_received", [bytes, bytearray, lambda b: memoryview(bytes(b))])
@pytest.mark.parametrize("source", SOURCES)
def test_frames_as_a_transport_delivers_them(source, as_received):
    t = SOURCES[source]()
    header, frames = serialize(t, serializers=["dask"], on_error="raise")
    received = as_received(memoryview(frames[0]))
    u = deserialize(header, [received])
    assert described(u) == described(t)
    buffer_writable = not memoryview(received).readonly
    if buffer_writable or t._writability == "readonly":
        assert u.data_ptr == np.frombuffer(received, np.uint8).ctypes.data, "no copy"
    else:
        assert u.data_ptr != np.frombuffer(received, np.uint8).ctypes.data, "read-only bytes: copied once"


def test_frames_keep_writers_out_while_they_live():
    import scale_inplace  # an example extension (examples/), built by ./dev

    a = np.ones(4, np.float32)
    header, frames = serialize(dlbridge.from_dlpack(a), serializers=["dask"])
    with pytest.raises(BufferError, match="already borrowed as read"):
        scale_inplace.scale(a, 2.0)  # distributed may still be sending the frame
    here = deserialize(header, frames)  # over the same bytes: their hold passes to it
    scale_inplace.scale(here, 3.0)
    assert a.tolist() == [3.0] * 4
    del here, frames
    scale_inplace.scale(a, 2.0)


def test_sizeof_is_the_bytes_spanned():
    a = np.arange(48, dtype=np.float64).reshape(6, 8)
    views = {"contiguous": a, "every other column": a[:, ::2], "reversed rows": a[::-1], "transposed": a.T,
             "a broadcast row": np.broadcast_to(a[:1], (1000, 8)), "one element": a[2:3, 5:6], "empty": a[:0]}
    for name, view in views.items():
        low, high = np.lib.array_utils.byte_bounds(view)
        assert sizeof(dlbridge.from_dlpack(view)) == (high - low if view.size else 0), name
    assert sizeof(dlbridge.zeros(5, "float4_e2m1fn")) == 3  # packed two per byte
    assert sizeof(dlbridge.zeros((1 << 20,), "float32")) == 4 << 20  # not sys.getsizeof's few dozen bytes


def test_tokens_follow_the_content():
    from dask.base import tokenize

    shared = dlbridge.from_dlpack(np.arange(4.0)).share_memory()
    before = tokenize(shared)
    np.from_dlpack(shared)[0] = 7  # written in place: a scatter must not find the old key
    assert tokenize(shared) != before
    assert tokenize(readonly_tensor()) != tokenize(dlbridge.from_dlpack(np.arange(6, dtype=np.float32).reshape(2, 3)))


def test_refusals():
    p = FakeProducer()
    p.tensor.device.device_type = 2
    _KEEP.append(p)  # its deleter must outlive the tensor, which the exception's traceback keeps
    cuda = dlbridge.from_dlpack(p.capsule())
    with pytest.raises(TypeError, match="Could not serialize object of type Tensor") as refused:
        serialize(cuda, on_error="raise")
    assert "cannot pickle a tensor on cuda:0" in str(refused.value.__cause__), "pickling's refusal, as its cause"
    header, frames = serialize(dlbridge.zeros(4), serializers=["dask"])
    with pytest.raises(ValueError, match="one frame, not 2"):
        deserialize(header, frames * 2)
    with pytest.raises(ValueError, match="holds 15 bytes"):
        deserialize(header, [bytes(15)])


# --- through a LocalCluster's worker process ---------------------------------------------------


@pytest.fixture(scope="module")
def client():
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        with Client(cluster) as c:
            yield c


def on_the_worker(t):
    """What the worker process received, and whether it used dlbridge's serializer to receive it."""
    from dask.sizeof import sizeof
    from distributed.protocol.serialize import dask_deserialize

    import dlbridge._engines

    registered = dask_deserialize.dispatch(dlbridge.Tensor) is dlbridge._engines.dask_deserialize
    return described(t), sizeof(t), registered


def made_on_the_worker(t):
    """A new tensor the worker makes, of the same writability: sent back by the worker's serializer."""
    made = dlbridge.from_dlpack(-np.asarray(t.copy()))
    return made if t._writability == "writable" else dlbridge._rebuild_tensor(
        bytes(memoryview(made._bytes())), str(t.dtype), t.shape, t._writability, False)


@pytest.mark.parametrize("kind", KINDS)
def test_through_a_worker_process_and_back(client, kind):
    t = tensor(kind)
    [future] = client.scatter([t], hash=False)  # equal tensors of two tests: two keys
    (worker_saw, worker_sizeof, registered), = client.gather([client.submit(on_the_worker, future)])
    assert worker_saw == described(t) and registered
    assert worker_sizeof == described(t)[4].__len__() == client.nbytes(summary=False)[future.key]
    back = future.result()
    assert described(back) == described(t) and not back.is_shared  # a segment's tensor goes as its bytes


@pytest.mark.parametrize("source", ["writable", "readonly", "unknown (legacy capsule)"])
def test_a_task_returns_a_new_tensor(client, source):
    t = SOURCES[source]()
    got = client.submit(made_on_the_worker, t).result()
    assert (got._writability, got.tolist()) == (t._writability, (-np.asarray(t.copy())).tolist())


def test_unknown_stays_unknown_for_a_legacy_consumer(client):
    jnp = pytest.importorskip("jax.numpy")
    t = unknown_from_a_legacy_capsule()
    back = client.scatter(t, hash=False).result()
    assert back._writability == "unknown" and jnp.from_dlpack(back).tolist() == t.tolist()
