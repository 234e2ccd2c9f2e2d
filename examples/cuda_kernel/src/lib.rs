//! GPU kernels in Rust: an extension whose functions take any framework's
//! CUDA tensor (torch, CuPy, JAX, ...) as a typed argument, launch a kernel
//! of their own on the stream its data is ready on, and return a dlbridge
//! `Tensor` in fresh device memory, ready on that same stream.
//!
//! The kernel ships as PTX text (`kernels/scale.ptx`, compiled once from
//! `kernels/scale.cu` with NVRTC and committed), which the driver compiles for
//! the GPU when it is first used on a device. Shipped PTX needs nothing but
//! the driver on the user's machine; compiling CUDA C at run time would also
//! need NVRTC there, a toolkit library of its own version, for no gain with a
//! kernel fixed at build time.
use std::ffi::CStr;
use std::sync::{Mutex, PoisonError};

use dlbridge_pyo3::dlbridge::cuda::{self, Function, KernelArg, LaunchConfig, Module};
use dlbridge_pyo3::dlbridge::streams::Stream;
use dlbridge_pyo3::dlbridge::DataType;
use dlbridge_pyo3::{to_py_err, AnyRank, CContiguous, Cuda, PyTensor, PyTensorMut, Tensor};
use pyo3::prelude::*;

/// `scale_f32(const float* x, float* out, unsigned long long n, float factor)`.
const PTX: &CStr = match CStr::from_bytes_with_nul(concat!(include_str!("../kernels/scale.ptx"), "\0").as_bytes()) {
    Ok(ptx) => ptx,
    Err(_) => panic!("kernels/scale.ptx holds a NUL byte"),
};

/// Threads per block, and at most this many blocks: the kernel's grid-stride
/// loop covers the rest.
const BLOCK: u32 = 256;
const MAX_BLOCKS: u32 = 4096;

/// The kernel on `device_id`, loaded the first time it is needed there, and
/// again after a reset of the device's context (torch's or CuPy's) unloaded it.
fn scale_kernel(device_id: i32) -> PyResult<Function> {
    static LOADED: Mutex<Vec<Function>> = Mutex::new(Vec::new());
    let cached = |loaded: &[Function]| loaded.iter().find(|f| f.module().device_id() == device_id).cloned();
    {
        let mut loaded = LOADED.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(f) = cached(&loaded) {
            if f.module().is_loaded().map_err(to_py_err)? {
                return Ok(f);
            }
            // Unloaded by a reset: forgotten (dropping it calls no driver function).
            loaded.retain(|g| g.module().device_id() != device_id);
        }
    }
    // Loaded without the lock held: the driver's compilation runs without the
    // GIL, and another thread holding the GIL may be waiting for the lock.
    let f = Module::from_ptx(device_id, PTX).and_then(|m| m.function(c"scale_f32")).map_err(to_py_err)?;
    let mut loaded = LOADED.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(first) = cached(&loaded) {
        // Another thread loaded it meanwhile. Our module is unloaded, which
        // releases the GIL: only after the lock is released, or a thread
        // holding the GIL and waiting for the lock would never get it back.
        drop(loaded);
        drop(f);
        return Ok(first);
    }
    loaded.push(f.clone());
    Ok(f)
}

/// Where to launch work on an argument's data: the stream it is ready on, or
/// the legacy default stream when no work is pending on it.
fn launch_stream(ready: Option<i64>) -> Stream {
    match ready {
        // SAFETY: a CUDA argument's ready stream is a live stream of its device
        // for the call (the producer's current stream, or one dlbridge-pyo3 made
        // wait for the producer's work).
        Some(stream) => unsafe { Stream::from_raw(stream) },
        None => Stream::CUDA_LEGACY,
    }
}

/// Queues `out[i] = x[i] * factor` for `i < n` on `stream`.
///
/// # Safety
/// `x` and `out` are device addresses of `n` float32s each on `device_id`
/// (the same ones, or not overlapping), alive until the kernel has run; `x`
/// is ready on `stream`, and nothing else touches `out` until `stream` has run.
unsafe fn launch_scale(device_id: i32, x: u64, out: u64, n: u64, factor: f32, stream: Stream) -> PyResult<()> {
    let kernel = scale_kernel(device_id)?;
    let args = [KernelArg::new(&x), KernelArg::new(&out), KernelArg::new(&n), KernelArg::new(&factor)];
    // SAFETY: the four arguments scale_f32 declares, in order and of its types;
    // the memory and the stream are as the caller vouches.
    unsafe { kernel.launch(LaunchConfig::linear(n, BLOCK, MAX_BLOCKS), stream, &args) }.map_err(to_py_err)
}

/// `x * factor` for a float32 C-contiguous CUDA tensor `x` of any shape and
/// framework, as a new dlbridge tensor on the same device. The kernel runs on
/// the stream `x`'s data is ready on (the producer's current stream, for torch)
/// and the result is ready on that stream: a consumer on another stream is
/// made to wait for it, with no host synchronisation.
#[pyfunction]
fn scale(x: PyTensor<'_, f32, AnyRank, Cuda, CContiguous>, factor: f32) -> PyResult<Tensor> {
    let device_id = x.device_id();
    let stream = launch_stream(x.ready_stream());
    let n = x.view().len() as u64;
    // A replay of a captured graph would write `out` again after Python freed it.
    if n > 0 && cuda::stream_is_capturing(device_id, stream).map_err(to_py_err)? {
        return Err(pyo3::exceptions::PyValueError::new_err(
            "scale allocates its result, which a CUDA graph replaying this launch would write after it is freed: \
             capture scale_ (in place, in memory the graph's owner keeps) instead",
        ));
    }
    // Fresh memory in `stream`'s order (the device's pool, where it has one).
    let out = cuda::empty(DataType::FLOAT32, x.view().shape(), device_id, stream).map_err(to_py_err)?;
    if n > 0 {
        // SAFETY: `x` holds n float32s on `device_id`, ready on `stream` and kept
        // by its producer for the work queued there; `out` is fresh memory of n
        // float32s for work on `stream`, which only this kernel writes before it
        // is handed on, and whose free waits for that work (`written_on` below);
        // no capture is under way on `stream` (checked above).
        unsafe { launch_scale(device_id, x.device_ptr(), out.device_ptr(), n, factor, stream) }?;
    }
    let out = out.written_on(stream).map_err(to_py_err)?;
    Tensor::new(out).with_ready_stream(Some(stream))
}

/// Multiplies a float32 C-contiguous CUDA tensor by `factor` in place, in the
/// caller's own memory, on the stream its data is ready on: the producer's
/// current stream for torch (its later work there sees the result), the
/// legacy default stream for producers that only have `__dlpack__` (CuPy's
/// streams are blocking by default, so they wait for it too).
///
/// The write is queued, not done, when this returns: `x`'s memory must stay
/// allocated until it has run. torch keeps a tensor's memory for the work of
/// the stream it was allocated on; used on another stream
/// (`with torch.cuda.stream(s): scale_(x)`), keep `x` until `s` has run, or
/// call `x.record_stream(s)`, as for torch's own kernels on side streams.
#[pyfunction]
fn scale_(mut x: PyTensorMut<'_, f32, AnyRank, Cuda, CContiguous>, factor: f32) -> PyResult<()> {
    let n = x.view().len() as u64;
    if n == 0 {
        return Ok(());
    }
    let (device_id, stream) = (x.device_id(), launch_stream(x.ready_stream()));
    let data = x.device_ptr_mut();
    // SAFETY: `x` holds n float32s on `device_id`, ready on `stream`, borrowed
    // exclusively for this call and kept by its producer for the work queued
    // there (the caller's part when `stream` is not the one the producer
    // allocated it on: see the doc comment, and README, GPU kernels in Rust);
    // reading and writing each element in place is what the kernel does.
    // Under a graph capture, replays write `x` again: its owner (torch's graph
    // pool, or the caller) keeps that memory for as long as it replays the graph,
    // as for the framework's own kernels captured beside this one.
    unsafe { launch_scale(device_id, data, data, n, factor, stream) }
}

#[pymodule(gil_used = false)]
fn cuda_kernel(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(scale, m)?)?;
    m.add_function(wrap_pyfunction!(scale_, m)?)?;
    Ok(())
}
