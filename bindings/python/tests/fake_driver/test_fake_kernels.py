"""examples/cuda_kernel against the fake driver: a kernel written in Rust, launched on a producer's
tensor. The fake runs the example's `scale_f32` (known by its PTX entry name) on its host-memory
"device" buffers when the launch, queued on its stream, is reached. A producer's kernel fills its
buffer with VALUE on stream P and stays queued, so a launch that does not wait for it reads the zeros
that were there, and a reader that does not wait for the launch reads the zeros of fresh memory."""

import gc
import textwrap

import numpy as np
import pytest

import cuda_kernel  # examples/cuda_kernel, which ./dev builds into the venv
import dlbridge
from fake_cuda import StreamProducer, run_fresh
from producers import ready_stream, table_producer

VALUE = 7.0
N = 4


def busy(driver, stream, device=(2, 0), value=VALUE, count=N):
    """`count` float32s of device memory, zero now, that a kernel queued on `stream` fills with `value`."""
    a = driver.device_array(count, device)
    driver.fill(stream, a.ctypes.data, count, value, device[1])
    return a


def rows(driver, *kinds):
    """The log's rows of these kinds ("alloc" stands for both kinds of device allocation)."""
    kinds = kinds + (("alloc_async",) if "alloc" in kinds else ())
    return [r for r in driver.log() if r[0] in kinds]


def no_host_sync(driver):
    assert not rows(driver, "sync", "event_sync"), f"a host synchronisation: {driver.log()}"


def test_scale_runs_after_the_producers_work_and_its_result_is_ready_on_that_stream(driver):
    P, C = driver.stream(), driver.stream()
    a = busy(driver, P)
    x, _ = table_producer(work_stream=P, make=lambda: driver.over(a))  # torch's way: the exchange table
    driver.clear()
    r = cuda_kernel.scale(x, 2.0)
    assert isinstance(r, dlbridge.Tensor) and r.device == (2, 0) and r.shape == (N,) and r.dtype == "float32"
    assert r._writability == "writable" and not r.readonly, "fresh memory the caller owns"
    no_host_sync(driver)
    calls = [(k, a if k in ("launch", "wait", "alloc_async") else b if k == "record" else None)
             for k, a, b, _ in driver.log() if k not in ("module_load", "get_function")]  # loaded once per process
    assert calls == [("alloc_async", P), ("launch", P), ("create", None), ("record", P), ("create", None), ("record", P),
                     ("wait", 1), ("destroy", None)], (
        "the result's memory from the pool on P, the launch on P, an event recorded after it for the free to wait "
        "for; handed to dlbridge.Tensor, another event, which the legacy stream waits for and is then released: "
        f"{driver.log()}")
    assert driver.pending(P) == 2, "the producer's kernel and the launch wait on P: nothing ran on the host's behalf"
    assert driver.peek(r.data_ptr, N) == [0.0] * N, "fresh memory, not yet written"
    r.__dlpack__(stream=C, max_version=(1, 3))
    assert driver.read(C, r.data_ptr, N) == [2 * VALUE] * N, "C read before the launch, or the launch before the fill"
    assert driver.peek(a.ctypes.data, N) == [VALUE] * N, "the argument is left as it was"


def test_a_dunder_dlpack_producers_tensor_is_launched_on_the_legacy_stream(driver):
    """CuPy's way: `__dlpack__(stream=1)` makes the legacy stream wait for the producer's work; the
    kernel runs there, and a consumer on the legacy stream needs no wait at all."""
    P = driver.stream()
    x = StreamProducer(driver, busy(driver, P), P)
    driver.clear()
    r = cuda_kernel.scale(x, 0.5)
    assert x.calls[-1]["stream"] == 1
    assert [r_[1] for r_ in rows(driver, "launch")] == [1]
    assert not rows(driver, "record"), "ready on the legacy stream: no event to keep"
    assert ready_stream(r) == 1
    assert dlbridge.from_dlpack(r, device="cpu").tolist() == [VALUE / 2] * N


def test_scale_in_place_writes_the_callers_memory_on_its_stream(driver):
    P = driver.stream()
    a = busy(driver, P)
    x, _ = table_producer(work_stream=P, make=lambda: driver.over(a))
    driver.clear()
    assert cuda_kernel.scale_(x, 3.0) is None
    assert [r_[1] for r_ in rows(driver, "launch")] == [P]
    assert not rows(driver, "alloc", "record", "wait"), driver.log()
    assert driver.peek(a.ctypes.data, N) == [0.0] * N, "queued, not run"
    assert driver.read(P, a.ctypes.data, N) == [3 * VALUE] * N, "the caller's later work on P sees the result"


def test_a_consumer_on_another_stream_waits_through_dlbridges_own_import(driver):
    P, C = driver.stream(), driver.stream()
    x, _ = table_producer(work_stream=P, make=lambda: driver.over(busy(driver, P)))
    r = cuda_kernel.scale(x, -1.0)
    t = dlbridge.from_dlpack(r, stream=C)
    no_host_sync(driver)
    assert driver.read(C, t.data_ptr, N) == [-VALUE] * N


def test_a_tensor_on_device_1_gets_a_module_and_memory_there(driver):
    P = driver.stream(device=1)
    a = busy(driver, P, (2, 1))
    x, _ = table_producer(device=(2, 1), work_stream=P, make=lambda: driver.over(a, (2, 1)))
    driver.clear()
    r = cuda_kernel.scale(x, 2.0)
    assert r.device == (2, 1)
    for kind in ("alloc", "launch", "module_load", "get_function"):
        assert all(row[3] == 1 for row in rows(driver, kind)), f"{kind} outside device 1's context: {driver.log()}"
    assert dlbridge.from_dlpack(r, device="cpu").tolist() == [2 * VALUE] * N


def test_the_module_is_loaded_once_per_device(driver):
    P = driver.stream()
    x, _ = table_producer(work_stream=P, make=lambda: driver.over(busy(driver, P)))
    cuda_kernel.scale(x, 2.0)
    live = driver.live_modules()
    driver.clear()
    for _ in range(3):
        cuda_kernel.scale(x, 2.0)
        cuda_kernel.scale_(x, 1.0)
    assert not rows(driver, "module_load", "get_function") and driver.live_modules() == live
    assert len(rows(driver, "launch")) == 6


def test_many_elements_are_covered_by_the_grid_stride_loop(driver):
    """More elements than the example's largest grid has threads (256 x 4096)."""
    n = 256 * 4096 + 1000
    P = driver.stream()
    a = busy(driver, P, count=n, value=1.5)
    x, _ = table_producer(work_stream=P, make=lambda: driver.over(a))
    cuda_kernel.scale_(x, 2.0)
    driver.run(P)
    assert a[0] == 3.0 and a[-1] == 3.0 and (a == 3.0).all()


def test_the_result_is_freed_after_the_kernel_ran_without_a_host_wait(driver):
    """Dropped while its kernel is still queued on P: the free is queued on the legacy stream after a
    wait for the event recorded after the kernel; when the legacy stream reaches it, the block goes
    back to the pool, and the next allocation that reuses it sees nothing of the kernel."""
    P, n = driver.stream(), 4099  # a size no other freed block has: the pool's reuse is then predictable
    x, _ = table_producer(work_stream=P, make=lambda: driver.over(busy(driver, P, count=n)))
    before = driver.live_allocations()
    r = cuda_kernel.scale(x, 2.0)
    address = r.data_ptr
    assert driver.live_allocations() == before + 1
    driver.clear()
    del r
    gc.collect()
    assert driver.live_allocations() == before
    log = driver.log()
    assert not rows(driver, "sync", "event_sync"), f"a host wait: {log}"
    assert [(k, a) for k, a, _, _ in log if k in ("wait", "free_async")] == [("wait", 1), ("free_async", address)], log
    assert driver.pending(P) == 2, "the producer's fill and the kernel are still queued"
    driver.run(1)  # the legacy stream reaches the free, after P's kernel
    reused = dlbridge.from_dlpack(np.full(n, 5.0, dtype=np.float32), device=(2, 0))
    assert reused.data_ptr == address, "the pool hands the block out again"
    driver.run_all()
    assert (np.from_dlpack(dlbridge.from_dlpack(reused, device="cpu")) == 5.0).all(), "the kernel wrote the block after its free"


def test_empty_tensors_launch_nothing(driver):
    empty, _ = table_producer(work_stream=driver.stream(), make=lambda: driver.over(driver.device_array(0)))
    driver.clear()
    r = cuda_kernel.scale(empty, 2.0)
    cuda_kernel.scale_(empty, 2.0)
    assert r.shape == (0,) and not rows(driver, "launch")


@pytest.mark.parametrize("call", ["scale", "scale_"])
def test_a_mismatched_argument_is_a_type_error_naming_both(driver, call):
    # Capsules kept in variables: the test helper's destructor (a ctypes callback) must not run while
    # the call's exception is set.
    f64 = driver.device_fake([0.0] * 8, shape=(4,))
    f64.tensor.dtype.bits = 64
    capsule = f64.capsule()
    with pytest.raises(TypeError, match=r"^expected a float32 C-contiguous CUDA tensor, got a PyCapsule of float64 with shape \(4,\) on cuda:0"):
        getattr(cuda_kernel, call)(capsule, 2.0)
    capsule = driver.device_fake([1.0, 2.0, 3.0, 4.0], shape=(2,), strides=(2,)).capsule()
    with pytest.raises(TypeError, match=r"^expected a float32 C-contiguous CUDA tensor, got a PyCapsule of float32 with shape \(2,\), strided on cuda:0"):
        getattr(cuda_kernel, call)(capsule, 2.0)
    assert not rows(driver, "launch", "alloc")


def test_a_read_only_argument_is_scaled_into_a_copy_and_refused_in_place(driver):
    P = driver.stream()
    a = busy(driver, P)

    def read_only():
        fake = driver.over(a)
        fake.managed.flags = 1  # DLPACK_FLAG_BITMASK_READ_ONLY
        return fake

    x, _ = table_producer(work_stream=P, make=read_only)
    assert dlbridge.from_dlpack(cuda_kernel.scale(x, 2.0), device="cpu").tolist() == [2 * VALUE] * N
    driver.clear()
    with pytest.raises(BufferError, match="marked it read-only"):
        cuda_kernel.scale_(x, 2.0)
    assert not rows(driver, "launch")
    assert driver.peek(a.ctypes.data, N) == [VALUE] * N


def test_a_result_too_large_for_the_device_is_a_memory_error(driver):
    """The fake's devices hold 1 GiB; the argument claims 4 GiB (its memory is never touched)."""
    big = driver.over(driver.device_array(4))
    big.shape[0] = 1 << 30
    x, _ = table_producer(work_stream=driver.stream(), make=lambda: big)
    driver.clear()
    with pytest.raises(MemoryError, match=r"cuMemAllocAsync failed with CUresult 2 \(CUDA_ERROR_OUT_OF_MEMORY\)"):
        cuda_kernel.scale(x, 2.0)
    assert not rows(driver, "launch", "alloc")


def test_threads_loading_the_kernel_at_once_neither_deadlock_nor_leak_a_module():
    """In a fresh process, with every blocking call (the PTX compilation included) slowed to 0.3 s:
    the first calls of two threads load the module without the GIL; neither waits for the other
    while holding it (the duplicate is unloaded after the lock is released, as later calls of the
    other thread wait for that lock), and a module loaded twice is unloaded once."""
    code = textwrap.dedent("""
        import threading, time
        import cuda_kernel, dlbridge
        from fake_cuda import FakeDriver
        from producers import table_producer
        driver = FakeDriver()
        a = driver.device_array(4, value=2.0)
        x, _ = table_producer(work_stream=0, make=lambda: driver.over(a))
        driver.sync_delay(300)
        driver.unload_delay(1500)
        out = {}
        def call(i):
            # Calls for a second: the thread that loaded first keeps looking the kernel up while
            # the other unloads the module it loaded twice (which takes 1.8 s here).
            end = time.monotonic() + 1.0
            while True:
                r = cuda_kernel.scale(x, float(i))
                if time.monotonic() > end:
                    break
            out[i] = dlbridge.from_dlpack(r, device="cpu").tolist()
        threads = [threading.Thread(target=call, args=(i,)) for i in (1, 3)]
        for t in threads: t.start()
        for t in threads: t.join()
        driver.sync_delay(0)
        driver.unload_delay(0)
        kinds = driver.kinds()
        loads, unloads = kinds.count("module_load"), kinds.count("module_unload")
        assert out == {1: [2.0] * 4, 3: [6.0] * 4}, out
        assert loads - unloads == 1 and driver.live_modules() == 1, (loads, unloads, driver.live_modules())
        print("done", loads)
    """)
    assert "done" in run_fresh(code, hang="deadlock: a thread waited for the kernel's lock while holding the GIL the loader needs")


def test_scale_refuses_a_graph_capture_and_scale_in_place_joins_it(driver):
    """A captured launch runs again at each replay: `scale`'s result, freed when Python drops it,
    would be written after it is freed, so it refuses; `scale_` writes memory its owner keeps, and
    is captured into the graph (nothing runs now; the replay does the work)."""
    P = driver.stream()
    a = busy(driver, P)
    driver.run_all()  # the producer's fill is done: only what is captured is pending
    x, _ = table_producer(work_stream=P, make=lambda: driver.over(a))
    driver.begin_capture(P, mode="relaxed")
    try:
        with pytest.raises(ValueError, match="capture scale_"):
            cuda_kernel.scale(x, 2.0)
        cuda_kernel.scale_(x, 2.0)
        assert driver.peek(a.ctypes.data, N) == [VALUE] * N, "captured, not run"
    finally:
        graph = driver.end_capture(P)
    assert graph > 1000 or graph < 900, f"the capture ended with CUresult {graph}"
    assert driver.launch_graph(graph, P) == 0
    assert driver.read(P, a.ctypes.data, N) == [2 * VALUE] * N, "the replay scaled in place"


def test_a_context_reset_unloads_the_kernel_and_the_next_call_loads_it_again():
    """A reset of the device's primary context (torch.cuda or CuPy device resets) unloads every
    module. The kernel cached in the extension is then forgotten, never used or unloaded again (its
    handle may name another library's module by then), and loaded afresh."""
    code = textwrap.dedent("""
        import gc
        import cuda_kernel, dlbridge
        from fake_cuda import FakeDriver
        from producers import table_producer
        driver = FakeDriver()
        def scaled():
            a = driver.device_array(4, value=2.0)
            x, _ = table_producer(work_stream=0, make=lambda: driver.over(a))
            return dlbridge.from_dlpack(cuda_kernel.scale(x, 3.0), device="cpu").tolist()
        assert scaled() == [6.0] * 4
        gc.collect()
        driver.lib.fake_cuda_primary_reset(0)
        # The first call of each extension's copy of dlbridge (the example's, the package's) to
        # meet the reset says so, and retains the context afresh.
        for attempt in range(3):
            try:
                values = scaled()
                break
            except BufferError as e:
                assert "CUDA_ERROR_CONTEXT_IS_DESTROYED" in str(e), e
        assert values == [6.0] * 4 and attempt <= 2, (values, attempt)
        assert driver.lib.fake_cuda_stale_handle_uses() == 0, "a handle from before the reset was used"
        print("done")
    """)
    assert "done" in run_fresh(code)


PTX = """.version 7.0
.target sm_75
.address_size 64
.visible .entry scale_f32(
	.param .u64 scale_f32_param_0,
	.param .u64 scale_f32_param_1,
	.param .u64 scale_f32_param_2,
	.param .f32 scale_f32_param_3
)
{
	ret;
}
"""
# scale_f32 on no elements (n = 0): it touches no memory.
ARGS = [("u64", 0), ("u64", 0), ("u64", 0), ("f32", 2.0)]


def test_launch_arguments_are_checked_against_the_kernels_parameters(driver):
    """C10: where the driver reports the parameters (cuFuncGetParamInfo), an argument of the wrong
    size, or a missing one, is refused before the launch instead of passing garbage."""
    from dlbridge import _native

    S = driver.stream()
    _native._cuda_launch(0, PTX, "scale_f32", ARGS, S)
    with pytest.raises(BufferError, match=r"parameter 3 takes 4 bytes, and its argument is a value of 8 bytes"):
        _native._cuda_launch(0, PTX, "scale_f32", ARGS[:3] + [("f64", 2.0)], S)
    with pytest.raises(BufferError, match=r"the kernel takes 4 parameters, and 3 arguments were given"):
        _native._cuda_launch(0, PTX, "scale_f32", ARGS[:3], S)
    assert len(rows(driver, "launch")) == 1
    driver.param_info(False)  # a driver before CUDA 12.4: nothing to check against
    try:
        _native._cuda_launch(0, PTX, "scale_f32", ARGS[:3] + [("f64", 2.0)], S)
    finally:
        driver.param_info(True)
    assert len(rows(driver, "launch")) == 2
    driver.run_all()
    gc.collect()


@pytest.mark.parametrize("ptx, log", [
    (".version 7.0\n.visible .entry k()\n{ ret; }\n", "Missing .target directive"),
    (".version 9.9\n.target sm_90\n", "Unsupported .version 9.9; current version is '9.0'"),
])
def test_ptx_the_driver_refuses_is_reported_with_the_jit_log(driver, ptx, log):
    from dlbridge import _native

    with pytest.raises(BufferError, match=r"cuModuleLoadDataEx failed with CUresult 2\d\d \(CUDA_ERROR_(INVALID_PTX|UNSUPPORTED_PTX_VERSION)\)"
                                          r"; the JIT compiler's log: fake ptxas.*" + log.replace(".", r"\.")):
        _native._cuda_launch(0, ptx, "k", [], 1)
