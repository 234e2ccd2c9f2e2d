"""Ray as a transport: `import dlbridge` registers Tensor with Ray's serialization in any process that
imports Ray. A tensor goes into the object store as its bytes, out of band, and comes back zero-copy
over the store's read-only memory: writable and read-only tensors arrive read-only (as NumPy's arrays
do; `copy()` gives writable memory), never as a writable view of the store; an unknown tensor stays
unknown, copied once per get, so that legacy consumers (JAX) still take it. In the driver and in a
worker process, with every kind of tensor of test_dask."""

import subprocess
import sys

import numpy as np
import pytest
import ray

import dlbridge
import test_dask
from dlpack_ctypes import FakeProducer
from test_dask import KINDS, described, tensor
from test_pickle_routes import unknown_from_a_legacy_capsule, writable_tensor

_KEEP = []


def after_ray(t):
    """What a tensor must be after the object store: read-only over the store, unless unknown."""
    writability, *rest = described(t)
    return ("unknown" if writability == "unknown" else "readonly", *rest)


@pytest.fixture(scope="module")
def session():
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    # The tests' functions are shipped by value: the workers cannot import the tests' modules.
    modules = [sys.modules[__name__], test_dask]
    for module in modules:
        ray.cloudpickle.register_pickle_by_value(module)
    yield
    for module in modules:
        ray.cloudpickle.unregister_pickle_by_value(module)
    ray.shutdown()


@pytest.mark.parametrize("kind", KINDS)
def test_put_and_get(session, kind):
    t = tensor(kind)
    ref = ray.put(t)
    first, second = ray.get(ref), ray.get(ref)
    assert described(first) == described(second) == after_ray(t) and not first.is_shared
    if t.size:
        zero_copy = t._writability != "unknown"
        assert (first.data_ptr == second.data_ptr) == zero_copy, "the store's memory, or a copy per get"


def test_a_writable_tensor_comes_back_read_only_and_copy_makes_it_writable(session):
    t = writable_tensor()
    got = ray.get(ray.put(t))
    assert got.readonly and not np.from_dlpack(got).flags.writeable and memoryview(got).readonly
    with pytest.raises(BufferError, match="read-only"):
        got.__dlpack__()  # a legacy capsule cannot say read-only
    writable = got.copy()
    assert not writable.readonly and writable.tolist() == t.tolist() and writable.data_ptr != got.data_ptr


def test_unknown_stays_unknown_for_a_legacy_consumer(session):
    jnp = pytest.importorskip("jax.numpy")
    t = unknown_from_a_legacy_capsule()
    got = ray.get(ray.put(t))
    assert got._writability == "unknown" and jnp.from_dlpack(got).tolist() == t.tolist()


def on_the_worker(t, again):
    """What a worker received, and whether the same object passed twice is one piece of memory."""
    return described(t), t.data_ptr == again.data_ptr


@pytest.mark.parametrize("kind", KINDS)
def test_through_a_worker_process_and_back(session, kind):
    t = tensor(kind)
    ref = ray.put(t)
    worker_saw, one_memory = ray.get(ray.remote(on_the_worker).remote(ref, ref))
    assert worker_saw == after_ray(t)
    assert one_memory == (t._writability != "unknown" or t.size == 0)
    identity = ray.remote(lambda x: x)
    assert described(ray.get(identity.remote(t))) == after_ray(t)


def made_on_the_worker(n):
    """A writable tensor the worker makes: the worker's registration sends it, so it arrives read-only."""
    return dlbridge.from_dlpack(np.arange(n, dtype=np.float32))


def test_a_task_returns_a_new_tensor(session):
    got = ray.get(ray.remote(made_on_the_worker).remote(1 << 16))
    assert got._writability == "readonly" and got.tolist() == list(range(1 << 16))


def test_a_cuda_tensor_is_refused(session):
    p = FakeProducer()
    p.tensor.device.device_type = 2
    _KEEP.append(p)  # its deleter must outlive the tensor, which the exception's traceback keeps
    with pytest.raises(TypeError, match="cannot pickle a tensor on cuda:0"):
        ray.put(dlbridge.from_dlpack(p.capsule()))


@pytest.mark.parametrize("order", ["import dlbridge; import ray", "import ray; import dlbridge"])
def test_registered_whichever_is_imported_first(order):
    code = f"""{order}
import ray.cloudpickle
t = dlbridge.zeros(3)
print(ray.cloudpickle.loads(ray.cloudpickle.dumps(t))._writability)"""  # in band: not the store, the same rule
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.split() == ["readonly"], result.stderr
