//! CUDA through the driver API (feature `cuda`): stream hand-off with events
//! and no host synchronisation, copies between host and device, what the
//! driver says a pointer is, and for kernels written by hand, device memory
//! that dlbridge owns and PTX modules launched on a stream.
//!
//! The driver is loaded when first needed (`libcuda.so.1`, the driver's own
//! soname, then `libcuda.so`; a toolkit stub that says so is skipped), so a
//! build with this feature runs on a machine with no CUDA: every function here
//! then returns [`Error::CudaUnavailable`]. The few driver functions used are
//! declared here returning the raw `CUresult`, so that an error code newer than
//! any bindings is a number, never an invalid enum.
//!
//! Calls that may block the host, and the ones stream capture calls unsafe
//! (allocations, synchronisation, loading the driver and retaining a context),
//! run through the hook set with [`set_blocking_hook`] (the Python layer
//! releases the GIL there) with this thread's capture mode relaxed, so that
//! they neither stall other threads nor invalidate a CUDA graph another library
//! is capturing.
//!
//! Memory dlbridge allocates is freed stream-ordered on the legacy default
//! stream, after the work dlbridge queued on it elsewhere; no free waits on
//! the host (`release.rs`).
//!
//! Device memory is never read on the host; a view of device memory carries
//! the producer's promise (made to [`TensorView::from_dltensor`]) that the
//! bytes it reaches are valid device memory.
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | contexts, blocking calls, capture status |
//! | `driver.rs` | loading the driver: the functions dlbridge calls |
//! | `handoff.rs` | ordering a consumer's stream after the data's, and events dlbridge keeps |
//! | `buffers.rs` | device, managed and pinned memory the driver allocates for copies |
//! | `release.rs` | freeing that memory in stream order, and the thread that frees what must wait |
//! | `staging.rs` | pinned buffers that host-to-device copies go through |
//! | `copies.rs` | copies to the host, to a device, on a device |
//! | `copy_plan.rs`, `gather.rs` | planning copies of a strided view's elements alone (2-D copies) |
//! | `pointers.rs` | which device, and which kind of memory, a pointer is |
//! | `allocate.rs` | tensors in fresh device memory that dlbridge owns, for kernels to fill |
//! | `kernels.rs`, `params.rs` | modules loaded from PTX, their functions and parameter layouts, launches |

mod allocate;
mod buffers;
mod copies;
mod copy_plan;
mod driver;
mod gather;
mod handoff;
mod kernels;
mod params;
mod pointers;
mod release;
mod staging;

pub use allocate::{empty, Empty};
pub use copies::{copy_on_device, to_device, to_host};
pub use driver::driver_available;
pub use handoff::{carry_out, order_streams, wait_on_host, ReadyEvent};
pub use kernels::{stream_is_capturing, Function, KernelArg, LaunchConfig, Module};
pub use pointers::{pointer_device, pointer_place};

use core::ffi::{c_int, c_uint, c_void};
use std::sync::{Mutex, OnceLock};

use driver::{api, Api};

use crate::error::Error;
#[cfg(doc)]
use crate::view::TensorView;

type CuResult = c_uint;
type Handle = *mut c_void;
type DevicePtr = u64;

const CUDA_SUCCESS: CuResult = 0;
const CUDA_ERROR_INVALID_CONTEXT: CuResult = 201;
const CUDA_ERROR_CONTEXT_IS_DESTROYED: CuResult = 709;
const CUDA_ERROR_STREAM_CAPTURE_IMPLICIT: CuResult = 906;
const CU_STREAM_CAPTURE_STATUS_NONE: c_uint = 0;
const CU_STREAM_CAPTURE_MODE_RELAXED: c_uint = 2;
const CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: c_int = 115;
/// `CU_STREAM_LEGACY`, the stream dlbridge's own memory is freed on.
const LEGACY: i64 = 1;

fn check(call: &'static str, code: CuResult) -> Result<(), Error> {
    if code == CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Error::Cuda { call, code })
    }
}

/// Runs a blocking driver call: set by the Python layer to one that releases
/// the GIL around it. It must call the function it is given, on this thread.
pub type BlockingHook = fn(&mut dyn FnMut());

static BLOCKING_HOOK: OnceLock<BlockingHook> = OnceLock::new();

/// Sets the hook every blocking driver call runs through (the first one set
/// stays): synchronisations, allocations, loading the driver, retaining a
/// context.
pub fn set_blocking_hook(hook: BlockingHook) {
    let _ = BLOCKING_HOOK.set(hook);
}

/// Runs `call` through the blocking hook (without the GIL in Python), on this thread.
fn blocking<T>(call: impl FnOnce() -> T) -> T {
    let mut pending = Some(call);
    let mut out = None;
    {
        let mut run = || {
            if let Some(call) = pending.take() {
                out = Some(call());
            }
        };
        match BLOCKING_HOOK.get() {
            Some(hook) => hook(&mut run),
            None => run(),
        }
        run(); // a hook that did not run it: run here (a no-op otherwise)
    }
    #[allow(clippy::expect_used)] // Cannot fire: `run` ran the call once, just above.
    let out = out.expect("the call ran");
    out
}

/// Runs a call that may block the host, or that stream capture counts as
/// unsafe: through the blocking hook, with this thread's capture mode relaxed
/// (a synchronisation of work outside a graph, or an allocation, is no part of
/// a graph another library captures, and must not invalidate it) and put back
/// afterwards.
fn host_side<T>(api: &Api, call: impl FnOnce() -> T) -> T {
    blocking(|| {
        let mut mode = CU_STREAM_CAPTURE_MODE_RELAXED;
        if let Some(exchange) = api.exchange_capture_mode {
            // SAFETY: swaps this thread's mode with a writable value.
            unsafe { exchange(&mut mode) };
        }
        let out = call();
        if let Some(exchange) = api.exchange_capture_mode {
            // SAFETY: puts the previous mode back.
            unsafe { exchange(&mut mode) };
        }
        out
    })
}

/// The handle of a DLPack stream value: 1 and 2 are the driver's own
/// `CU_STREAM_LEGACY` and `CU_STREAM_PER_THREAD`; others are handles.
fn stream_handle(value: i64) -> Handle {
    // A handle is an opaque number to the host; it is never dereferenced here.
    core::ptr::without_provenance_mut(value as usize)
}

/// The stream to queue work on for data ready on `ready`: the legacy default
/// when none is known (`None`, or -1 from a producer told not to synchronise).
fn queue_on(ready: Option<i64>) -> i64 {
    ready.filter(|&s| s > 0).unwrap_or(LEGACY)
}

/// A primary context dlbridge retained, once per device for the process.
#[derive(Clone, Copy)]
struct Retained {
    device_id: i32,
    context: usize,
    /// Whether the device has memory pools (the stream-ordered allocator).
    pools: bool,
}

static CONTEXTS: Mutex<Vec<Retained>> = Mutex::new(Vec::new());

fn retained(device_id: i32) -> Option<Retained> {
    CONTEXTS.lock().unwrap_or_else(std::sync::PoisonError::into_inner).iter().find(|r| r.device_id == device_id).copied()
}

/// Retains the device's primary context (creating it takes a while where
/// dlbridge is the first to use the device): through the blocking hook, one
/// thread at a time, with no lock held that a thread holding the GIL waits for.
fn retain(api: &Api, device_id: i32) -> Result<Retained, Error> {
    static RETAINING: Mutex<()> = Mutex::new(());
    blocking(|| {
        let _one_at_a_time = RETAINING.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(known) = retained(device_id) {
            return Ok(known);
        }
        let (mut device, mut context, mut pools) = (0, core::ptr::null_mut(), 0);
        // SAFETY: driver calls with writable out pointers.
        unsafe {
            check("cuDeviceGet", (api.device_get)(&mut device, device_id))?;
            check("cuDevicePrimaryCtxRetain", (api.primary_ctx_retain)(&mut context, device))?;
            // An older driver that cannot say has none.
            if (api.device_get_attribute)(&mut pools, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, device) != CUDA_SUCCESS {
                pools = 0;
            }
        }
        let pools = pools != 0 && api.mem_alloc_async.is_some() && api.mem_free_async.is_some();
        let known = Retained { device_id, context: context as usize, pools };
        CONTEXTS.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(known);
        Ok(known)
    })
}

/// Whether dlbridge allocates and frees on device `device_id` in stream order
/// (its context is retained, or this says no).
fn has_pools(device_id: i32) -> bool {
    retained(device_id).is_some_and(|r| r.pools)
}

/// Runs `body` with the device's primary context current (the one torch, CuPy
/// and JAX use), retained once per device for the process. A context another
/// library reset since is retained afresh on the next call.
fn in_context<T>(device_id: i32, body: impl FnOnce(&Api) -> Result<T, Error>) -> Result<T, Error> {
    let api = api()?;
    let context = match retained(device_id) {
        Some(known) => known.context,
        None => retain(api, device_id)?.context,
    };
    // SAFETY: a retained primary context, made current on this thread for the
    // body and popped after it.
    check("cuCtxPushCurrent", unsafe { (api.ctx_push)(core::ptr::without_provenance_mut(context)) })?;
    let out = body(api);
    let mut popped = core::ptr::null_mut();
    // SAFETY: pops the context pushed above.
    let _ = unsafe { (api.ctx_pop)(&mut popped) };
    if let Err(Error::Cuda { code: CUDA_ERROR_CONTEXT_IS_DESTROYED, .. }) = out {
        let mut contexts = CONTEXTS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        contexts.retain(|r| r.device_id != device_id);
    }
    out
}

/// The device of the context current on this thread (torch and CuPy make
/// theirs current), if any.
fn current_device(api: &Api) -> Option<i32> {
    let mut context = core::ptr::null_mut();
    // SAFETY: a query with a writable out value.
    if unsafe { (api.ctx_get_current)(&mut context) } != CUDA_SUCCESS || context.is_null() {
        return None;
    }
    let mut device: c_int = 0;
    // SAFETY: as above, with a context current.
    (unsafe { (api.ctx_get_device)(&mut device) } == CUDA_SUCCESS).then_some(device)
}

/// A device whose context is already awake, for work that needs some context
/// (pinned host memory of host data, pointer queries): the one current on this
/// thread, else one dlbridge holds; device 0 only when there is none, so that
/// no other device's context is woken needlessly.
fn awake_device(api: &Api) -> i32 {
    current_device(api)
        .or_else(|| CONTEXTS.lock().unwrap_or_else(std::sync::PoisonError::into_inner).first().map(|r| r.device_id))
        .unwrap_or(0)
}

/// Whether `stream` is capturing a CUDA graph (an invalidated capture counts:
/// its stream takes no work either). The legacy stream cannot be used at all
/// while a blocking stream of its context captures: a clear error then.
fn capturing(api: &Api, stream: i64) -> Result<bool, Error> {
    let mut status = CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: a query of a stream the caller vouches for, with a writable out value.
    match unsafe { (api.stream_is_capturing)(stream_handle(stream), &mut status) } {
        CUDA_SUCCESS => Ok(status != CU_STREAM_CAPTURE_STATUS_NONE),
        CUDA_ERROR_STREAM_CAPTURE_IMPLICIT => Err(Error::StreamCapture {
            reason: "the legacy default stream (1) cannot be used while a blocking stream of its context captures a CUDA graph; \
                     name the capturing stream (stream=) or capture on a non-blocking stream"
                .into(),
        }),
        code => Err(Error::Cuda { call: "cuStreamIsCapturing", code }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(miri, ignore = "loads a shared library")]
    fn without_a_driver_every_call_says_so() {
        if driver_available().is_ok() {
            return; // a machine with CUDA: the GPU suite covers it
        }
        assert!(matches!(driver_available(), Err(Error::CudaUnavailable { .. })));
        // SAFETY: the two default streams; no driver is loaded anyway.
        assert!(matches!(unsafe { order_streams(0, 1, 2) }, Err(Error::CudaUnavailable { .. })));
        assert!(matches!(pointer_device(0x1000, 0), Err(Error::CudaUnavailable { .. })));
        let t = crate::OwnedTensor::from_vec(vec![1.0f32; 4], &[4]).unwrap();
        assert!(matches!(to_device::<crate::ffi::DLManagedTensorVersioned>(t.view(), 0), Err(Error::CudaUnavailable { .. })));
        let message = driver_available().unwrap_err().to_string();
        assert!(message.contains("libcuda"), "{message}");
    }
}
