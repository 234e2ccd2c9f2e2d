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
//! (allocations, frees, synchronisation), run through the hook set with
//! [`set_blocking_hook`] (the Python layer releases the GIL there) with this
//! thread's capture mode relaxed, so that they neither stall other threads nor
//! invalidate a CUDA graph another library is capturing.
//!
//! Device memory is never read on the host; a view of device memory carries
//! the producer's promise (made to [`TensorView::from_dltensor`]) that the
//! bytes it reaches are valid device memory.
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | loading the driver, contexts, blocking calls, capture status |
//! | `handoff.rs` | ordering a consumer's stream after the data's, and events dlbridge keeps |
//! | `buffers.rs` | device, managed and pinned memory the driver allocates for copies |
//! | `copies.rs` | copies to the host, to a device, on a device |
//! | `gather.rs` | planning copies of a strided view's elements alone (2-D copies) |
//! | `pointers.rs` | which device, and which kind of memory, a pointer is |
//! | `allocate.rs` | tensors in fresh device memory that dlbridge owns, for kernels to fill |
//! | `kernels.rs` | modules loaded from PTX, their functions, and launches on a stream |

mod allocate;
mod buffers;
mod copies;
mod copy_plan;
mod gather;
mod handoff;
mod kernels;
mod pointers;

pub use allocate::empty;
pub use copies::{copy_on_device, to_device, to_host};
pub use handoff::{carry_out, order_streams, wait_on_host, ReadyEvent};
pub use kernels::{stream_is_capturing, Function, KernelArg, LaunchConfig, Module};
pub use pointers::{pointer_device, pointer_place};

use core::ffi::{c_int, c_uint, c_void};
use std::sync::{Mutex, OnceLock};

use crate::error::Error;
#[cfg(doc)]
use crate::view::TensorView;

type CuResult = c_uint;
type Handle = *mut c_void;
type DevicePtr = u64;

const CUDA_SUCCESS: CuResult = 0;
const CUDA_ERROR_STUB_LIBRARY: CuResult = 34;
const CUDA_ERROR_INVALID_CONTEXT: CuResult = 201;
const CUDA_ERROR_CONTEXT_IS_DESTROYED: CuResult = 709;
const CUDA_ERROR_STREAM_CAPTURE_IMPLICIT: CuResult = 906;
const CU_STREAM_CAPTURE_STATUS_NONE: c_uint = 0;
const CU_STREAM_CAPTURE_MODE_RELAXED: c_uint = 2;

/// The driver functions dlbridge calls.
struct Api {
    init: unsafe extern "C" fn(c_uint) -> CuResult,
    device_get: unsafe extern "C" fn(*mut c_int, c_int) -> CuResult,
    primary_ctx_retain: unsafe extern "C" fn(*mut Handle, c_int) -> CuResult,
    ctx_push: unsafe extern "C" fn(Handle) -> CuResult,
    ctx_pop: unsafe extern "C" fn(*mut Handle) -> CuResult,
    ctx_get_current: unsafe extern "C" fn(*mut Handle) -> CuResult,
    ctx_get_device: unsafe extern "C" fn(*mut c_int) -> CuResult,
    event_create: unsafe extern "C" fn(*mut Handle, c_uint) -> CuResult,
    event_record: unsafe extern "C" fn(Handle, Handle) -> CuResult,
    event_destroy: unsafe extern "C" fn(Handle) -> CuResult,
    event_synchronize: unsafe extern "C" fn(Handle) -> CuResult,
    event_query: unsafe extern "C" fn(Handle) -> CuResult,
    stream_wait_event: unsafe extern "C" fn(Handle, Handle, c_uint) -> CuResult,
    stream_synchronize: unsafe extern "C" fn(Handle) -> CuResult,
    stream_is_capturing: unsafe extern "C" fn(Handle, *mut c_uint) -> CuResult,
    /// Absent from drivers before CUDA 10.1, which have no capture modes.
    exchange_capture_mode: Option<unsafe extern "C" fn(*mut c_uint) -> CuResult>,
    /// Absent from drivers before CUDA 12.0: a context's id, unique for the process.
    ctx_get_id: Option<unsafe extern "C" fn(Handle, *mut u64) -> CuResult>,
    pointer_get_attribute: unsafe extern "C" fn(*mut c_void, c_uint, DevicePtr) -> CuResult,
    mem_alloc: unsafe extern "C" fn(*mut DevicePtr, usize) -> CuResult,
    mem_alloc_managed: unsafe extern "C" fn(*mut DevicePtr, usize, c_uint) -> CuResult,
    mem_free: unsafe extern "C" fn(DevicePtr) -> CuResult,
    mem_alloc_host: unsafe extern "C" fn(*mut *mut c_void, usize) -> CuResult,
    mem_free_host: unsafe extern "C" fn(*mut c_void) -> CuResult,
    memcpy_dtoh_async: unsafe extern "C" fn(*mut c_void, DevicePtr, usize, Handle) -> CuResult,
    memcpy_htod: unsafe extern "C" fn(DevicePtr, *const c_void, usize) -> CuResult,
    memcpy_dtod_async: unsafe extern "C" fn(DevicePtr, DevicePtr, usize, Handle) -> CuResult,
    memcpy_2d_async: unsafe extern "C" fn(*const buffers::Memcpy2D, Handle) -> CuResult,
    module_load_data: unsafe extern "C" fn(*mut Handle, *const c_void) -> CuResult,
    module_get_function: unsafe extern "C" fn(*mut Handle, Handle, *const core::ffi::c_char) -> CuResult,
    module_unload: unsafe extern "C" fn(Handle) -> CuResult,
    launch_kernel: kernels::LaunchKernel,
}

fn check(call: &'static str, code: CuResult) -> Result<(), Error> {
    if code == CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Error::Cuda { call, code })
    }
}

/// The names the driver is tried under, its own soname first: a toolkit's
/// `stubs/libcuda.so` on the library path must not shadow it.
const LIBRARY_NAMES: &[&str] = if cfg!(windows) { &["nvcuda.dll"] } else { &["libcuda.so.1", "libcuda.so"] };

fn load() -> Result<Api, Error> {
    let mut why = format!("the CUDA driver library ({}) was not found", LIBRARY_NAMES.join(" or "));
    for &name in LIBRARY_NAMES {
        // SAFETY: opening the driver runs its initialisers, as for any program that uses CUDA.
        let Ok(lib) = (unsafe { libloading::Library::new(name) }) else { continue };
        match api_of(lib) {
            Ok(api) => return Ok(api),
            // A stub: the real driver may still be found under the next name.
            Err(Error::Cuda { code: CUDA_ERROR_STUB_LIBRARY, .. }) => why = format!("{name} is the toolkit's stub (cuInit says CUDA_ERROR_STUB_LIBRARY, 34), not a driver"),
            Err(err) => return Err(Error::CudaUnavailable { reason: err.to_string() }),
        }
    }
    Err(Error::CudaUnavailable { reason: why })
}

/// The driver functions of `lib`, after `cuInit`; the library stays loaded
/// for the process when it is one.
fn api_of(lib: libloading::Library) -> Result<Api, Error> {
    macro_rules! symbol {
        ($name:literal) => {
            // SAFETY: each symbol is declared with the driver API's C signature
            // (`CUresult` as its underlying unsigned int); the library is kept
            // loaded below for as long as the process runs.
            *unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                .map_err(|_| Error::CudaUnavailable { reason: format!("the CUDA driver has no {}", $name) })?
        };
    }
    let api = Api {
        init: symbol!("cuInit"),
        device_get: symbol!("cuDeviceGet"),
        primary_ctx_retain: symbol!("cuDevicePrimaryCtxRetain"),
        ctx_push: symbol!("cuCtxPushCurrent_v2"),
        ctx_pop: symbol!("cuCtxPopCurrent_v2"),
        ctx_get_current: symbol!("cuCtxGetCurrent"),
        ctx_get_device: symbol!("cuCtxGetDevice"),
        event_create: symbol!("cuEventCreate"),
        event_record: symbol!("cuEventRecord"),
        event_destroy: symbol!("cuEventDestroy_v2"),
        event_synchronize: symbol!("cuEventSynchronize"),
        event_query: symbol!("cuEventQuery"),
        stream_wait_event: symbol!("cuStreamWaitEvent"),
        stream_synchronize: symbol!("cuStreamSynchronize"),
        stream_is_capturing: symbol!("cuStreamIsCapturing"),
        // SAFETY: as above, for an optional symbol.
        exchange_capture_mode: unsafe { lib.get(b"cuThreadExchangeStreamCaptureMode\0") }.ok().map(|f| *f),
        // SAFETY: as above, for an optional symbol.
        ctx_get_id: unsafe { lib.get(b"cuCtxGetId\0") }.ok().map(|f| *f),
        pointer_get_attribute: symbol!("cuPointerGetAttribute"),
        mem_alloc: symbol!("cuMemAlloc_v2"),
        mem_alloc_managed: symbol!("cuMemAllocManaged"),
        mem_free: symbol!("cuMemFree_v2"),
        mem_alloc_host: symbol!("cuMemAllocHost_v2"),
        mem_free_host: symbol!("cuMemFreeHost"),
        memcpy_dtoh_async: symbol!("cuMemcpyDtoHAsync_v2"),
        memcpy_htod: symbol!("cuMemcpyHtoD_v2"),
        memcpy_dtod_async: symbol!("cuMemcpyDtoDAsync_v2"),
        memcpy_2d_async: symbol!("cuMemcpy2DAsync_v2"),
        module_load_data: symbol!("cuModuleLoadData"),
        module_get_function: symbol!("cuModuleGetFunction"),
        module_unload: symbol!("cuModuleUnload"),
        launch_kernel: symbol!("cuLaunchKernel"),
    };
    // SAFETY: cuInit may be called any number of times.
    check("cuInit", unsafe { (api.init)(0) })?;
    // The function pointers above point into the library: it is never unloaded.
    core::mem::forget(lib);
    Ok(api)
}

fn api() -> Result<&'static Api, Error> {
    static API: OnceLock<Result<Api, Error>> = OnceLock::new();
    API.get_or_init(load).as_ref().map_err(Clone::clone)
}

/// Whether a CUDA driver could be loaded and initialised, or why not.
pub fn driver_available() -> Result<(), Error> {
    api().map(|_| ())
}

/// Runs a blocking driver call: set by the Python layer to one that releases
/// the GIL around it. It must call the function it is given, on this thread.
pub type BlockingHook = fn(&mut dyn FnMut());

static BLOCKING_HOOK: OnceLock<BlockingHook> = OnceLock::new();

/// Sets the hook every blocking driver call runs through (the first one set
/// stays): synchronisations, synchronous copies, allocations and frees.
pub fn set_blocking_hook(hook: BlockingHook) {
    let _ = BLOCKING_HOOK.set(hook);
}

/// Runs a call that may block the host, or that stream capture counts as
/// unsafe: through the blocking hook, with this thread's capture mode relaxed
/// (a synchronisation of work outside a graph, or an allocation, is no part of
/// a graph another library captures, and must not invalidate it).
fn host_side<T>(api: &Api, call: impl FnOnce() -> T) -> T {
    let mut pending = Some(call);
    let mut out = None;
    {
        let mut run = || {
            if let Some(call) = pending.take() {
                let mut mode = CU_STREAM_CAPTURE_MODE_RELAXED;
                if let Some(exchange) = api.exchange_capture_mode {
                    // SAFETY: swaps this thread's mode with a writable value.
                    unsafe { exchange(&mut mode) };
                }
                out = Some(call());
                if let Some(exchange) = api.exchange_capture_mode {
                    // SAFETY: puts the previous mode back.
                    unsafe { exchange(&mut mode) };
                }
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

/// The handle of a DLPack stream value: 1 and 2 are the driver's own
/// `CU_STREAM_LEGACY` and `CU_STREAM_PER_THREAD`; others are handles.
fn stream_handle(value: i64) -> Handle {
    // A handle is an opaque number to the host; it is never dereferenced here.
    core::ptr::without_provenance_mut(value as usize)
}

/// The stream to queue work on for data ready on `ready`: the legacy default
/// when none is known (`None`, or -1 from a producer told not to synchronise).
fn queue_on(ready: Option<i64>) -> i64 {
    ready.filter(|&s| s > 0).unwrap_or(1)
}

/// Primary contexts dlbridge retained, once per device for the process.
static CONTEXTS: Mutex<Vec<(i32, usize)>> = Mutex::new(Vec::new());

/// Runs `body` with the device's primary context current (the one torch, CuPy
/// and JAX use), retained once per device for the process. A context another
/// library reset since is retained afresh on the next call.
fn in_context<T>(device_id: i32, body: impl FnOnce(&Api) -> Result<T, Error>) -> Result<T, Error> {
    let api = api()?;
    let mut contexts = CONTEXTS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let context = match contexts.iter().find(|(id, _)| *id == device_id) {
        Some(&(_, context)) => context,
        None => {
            let (mut device, mut context) = (0, core::ptr::null_mut());
            // SAFETY: driver calls with writable out pointers.
            unsafe {
                check("cuDeviceGet", (api.device_get)(&mut device, device_id))?;
                check("cuDevicePrimaryCtxRetain", (api.primary_ctx_retain)(&mut context, device))?;
            }
            contexts.push((device_id, context as usize));
            context as usize
        }
    };
    drop(contexts);
    // SAFETY: a retained primary context, made current on this thread for the
    // body and popped after it.
    check("cuCtxPushCurrent", unsafe { (api.ctx_push)(core::ptr::without_provenance_mut(context)) })?;
    let out = body(api);
    let mut popped = core::ptr::null_mut();
    // SAFETY: pops the context pushed above.
    let _ = unsafe { (api.ctx_pop)(&mut popped) };
    if let Err(Error::Cuda { code: CUDA_ERROR_CONTEXT_IS_DESTROYED, .. }) = out {
        let mut contexts = CONTEXTS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        contexts.retain(|&(id, _)| id != device_id);
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
        .or_else(|| CONTEXTS.lock().unwrap_or_else(std::sync::PoisonError::into_inner).first().map(|&(id, _)| id))
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
