"""Device producers made of host memory, for tests that need no GPU: fake tensors labelled CUDA or
ROCm, handed out through `__dlpack__` or through a C exchange table. dlbridge carries them without
touching the memory (or, under the fake driver, copies it as if it were device memory)."""

import ctypes

import dlbridge

from dlbridge._check import abi
from dlpack_ctypes import FakeProducer

_KEEP = []  # fakes, tables and callbacks outlive every tensor made from them


def labelled(fake, device):
    """`fake`, relabelled as memory of `device`; kept alive for the process."""
    fake.tensor.device.device_type, fake.tensor.device.device_id = device
    _KEEP.append(fake)
    return fake


def table_producer(device=(2, 0), work_stream=0x5000, has_stream_function=True, make=None):
    """An object whose class publishes an exchange table that exports a fresh fake tensor on
    `device` (`make()` makes it; 2x2 float32 by default) and reports `work_stream`; its
    `__dlpack__` records the stream it was given. Returns (object, calls)."""
    make = make or (lambda: FakeProducer())
    calls = {"table": 0, "dunder": [], "stream_queries": []}

    @abi.FROM_PY
    def from_py(obj, out):
        fake = labelled(make(), device)
        calls["table"] += 1
        out[0] = ctypes.addressof(fake.managed)
        return 0

    @abi.STREAM
    def current_work_stream(device_type, device_id, out):
        calls["stream_queries"].append((device_type, device_id))
        out[0] = work_stream
        return 0

    table = abi.ExchangeAPI()
    table.header.version = abi.DLPackVersion(1, 3)
    table.managed_tensor_from_py_object_no_sync = ctypes.cast(from_py, ctypes.c_void_p).value
    if has_stream_function:
        table.current_work_stream = ctypes.cast(current_work_stream, ctypes.c_void_p).value
    _KEEP.extend([from_py, current_work_stream, table])
    capsule = abi.api.PyCapsule_New(ctypes.addressof(table), ctypes.addressof(abi.static_name("dlpack_exchange_api")), None)
    # A table on a class Python code made is never trusted (it could be a copy): the testing
    # feature's hook trusts this one, so that the table path can be driven here.
    dlbridge._native._trust_table_for_tests(capsule)

    class Producer:
        __dlpack_c_exchange_api__ = capsule

        def __dlpack_device__(self):
            return device

        def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
            calls["dunder"].append(stream)
            return labelled(make(), device).capsule()

    return Producer(), calls


class DunderProducer:
    """A producer on `device` that hands out `make()`'s fake through `__dlpack__` and records the
    keywords of each call."""

    def __init__(self, device=(2, 0), make=None):
        self.device, self.make, self.calls = device, make or (lambda: FakeProducer()), []

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, **kwargs):
        self.calls.append(kwargs)
        return labelled(self.make(), self.device).capsule()


def ready_stream(tensor):
    """The stream a dlbridge tensor says its data is ready on."""
    return tensor.__cuda_array_interface__["stream"]
