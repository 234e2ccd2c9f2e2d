//! Loading the driver: the functions dlbridge calls, declared here with the
//! driver API's C signatures returning the raw `CUresult`, and `cuInit`. The
//! first load runs through the blocking hook (without the GIL in Python):
//! opening the driver and `cuInit` take a while.

use core::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::OnceLock;

use super::{blocking, buffers::Memcpy2D, check, kernels::LaunchKernel, CuResult, DevicePtr, Handle};
use crate::error::Error;

const CUDA_ERROR_STUB_LIBRARY: CuResult = 34;

/// The driver functions dlbridge calls.
pub(super) struct Api {
    pub(super) init: unsafe extern "C" fn(c_uint) -> CuResult,
    pub(super) device_get: unsafe extern "C" fn(*mut c_int, c_int) -> CuResult,
    pub(super) device_get_attribute: unsafe extern "C" fn(*mut c_int, c_int, c_int) -> CuResult,
    pub(super) primary_ctx_retain: unsafe extern "C" fn(*mut Handle, c_int) -> CuResult,
    pub(super) ctx_push: unsafe extern "C" fn(Handle) -> CuResult,
    pub(super) ctx_pop: unsafe extern "C" fn(*mut Handle) -> CuResult,
    pub(super) ctx_get_current: unsafe extern "C" fn(*mut Handle) -> CuResult,
    pub(super) ctx_get_device: unsafe extern "C" fn(*mut c_int) -> CuResult,
    pub(super) event_create: unsafe extern "C" fn(*mut Handle, c_uint) -> CuResult,
    pub(super) event_record: unsafe extern "C" fn(Handle, Handle) -> CuResult,
    pub(super) event_destroy: unsafe extern "C" fn(Handle) -> CuResult,
    pub(super) event_synchronize: unsafe extern "C" fn(Handle) -> CuResult,
    pub(super) event_query: unsafe extern "C" fn(Handle) -> CuResult,
    pub(super) stream_wait_event: unsafe extern "C" fn(Handle, Handle, c_uint) -> CuResult,
    pub(super) stream_synchronize: unsafe extern "C" fn(Handle) -> CuResult,
    pub(super) stream_is_capturing: unsafe extern "C" fn(Handle, *mut c_uint) -> CuResult,
    /// Absent from drivers before CUDA 10.1, which have no capture modes.
    pub(super) exchange_capture_mode: Option<unsafe extern "C" fn(*mut c_uint) -> CuResult>,
    /// Absent from drivers before CUDA 12.0: a context's id, unique for the process.
    pub(super) ctx_get_id: Option<unsafe extern "C" fn(Handle, *mut u64) -> CuResult>,
    pub(super) pointer_get_attribute: unsafe extern "C" fn(*mut c_void, c_uint, DevicePtr) -> CuResult,
    pub(super) mem_alloc: unsafe extern "C" fn(*mut DevicePtr, usize) -> CuResult,
    pub(super) mem_alloc_managed: unsafe extern "C" fn(*mut DevicePtr, usize, c_uint) -> CuResult,
    pub(super) mem_free: unsafe extern "C" fn(DevicePtr) -> CuResult,
    /// The stream-ordered allocator (CUDA 11.2); used where the device also
    /// reports memory pools.
    pub(super) mem_alloc_async: Option<unsafe extern "C" fn(*mut DevicePtr, usize, Handle) -> CuResult>,
    pub(super) mem_free_async: Option<unsafe extern "C" fn(DevicePtr, Handle) -> CuResult>,
    pub(super) mem_alloc_host: unsafe extern "C" fn(*mut *mut c_void, usize) -> CuResult,
    pub(super) mem_free_host: unsafe extern "C" fn(*mut c_void) -> CuResult,
    pub(super) memcpy_dtoh_async: unsafe extern "C" fn(*mut c_void, DevicePtr, usize, Handle) -> CuResult,
    pub(super) memcpy_htod_async: unsafe extern "C" fn(DevicePtr, *const c_void, usize, Handle) -> CuResult,
    pub(super) memcpy_dtod_async: unsafe extern "C" fn(DevicePtr, DevicePtr, usize, Handle) -> CuResult,
    pub(super) memcpy_2d_async: unsafe extern "C" fn(*const Memcpy2D, Handle) -> CuResult,
    pub(super) module_load_data_ex: unsafe extern "C" fn(*mut Handle, *const c_void, c_uint, *mut c_uint, *mut *mut c_void) -> CuResult,
    pub(super) module_get_function: unsafe extern "C" fn(*mut Handle, Handle, *const c_char) -> CuResult,
    pub(super) module_unload: unsafe extern "C" fn(Handle) -> CuResult,
    /// Absent from drivers before CUDA 12.4: a kernel parameter's offset and size.
    pub(super) func_get_param_info: Option<unsafe extern "C" fn(Handle, usize, *mut usize, *mut usize) -> CuResult>,
    pub(super) launch_kernel: LaunchKernel,
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
    macro_rules! optional {
        ($name:literal) => {
            // SAFETY: as for `symbol!`, for a symbol that older drivers lack.
            unsafe { lib.get(concat!($name, "\0").as_bytes()) }.ok().map(|f| *f)
        };
    }
    let api = Api {
        init: symbol!("cuInit"),
        device_get: symbol!("cuDeviceGet"),
        device_get_attribute: symbol!("cuDeviceGetAttribute"),
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
        exchange_capture_mode: optional!("cuThreadExchangeStreamCaptureMode"),
        ctx_get_id: optional!("cuCtxGetId"),
        pointer_get_attribute: symbol!("cuPointerGetAttribute"),
        mem_alloc: symbol!("cuMemAlloc_v2"),
        mem_alloc_managed: symbol!("cuMemAllocManaged"),
        mem_free: symbol!("cuMemFree_v2"),
        mem_alloc_async: optional!("cuMemAllocAsync"),
        mem_free_async: optional!("cuMemFreeAsync"),
        mem_alloc_host: symbol!("cuMemAllocHost_v2"),
        mem_free_host: symbol!("cuMemFreeHost"),
        memcpy_dtoh_async: symbol!("cuMemcpyDtoHAsync_v2"),
        memcpy_htod_async: symbol!("cuMemcpyHtoDAsync_v2"),
        memcpy_dtod_async: symbol!("cuMemcpyDtoDAsync_v2"),
        memcpy_2d_async: symbol!("cuMemcpy2DAsync_v2"),
        module_load_data_ex: symbol!("cuModuleLoadDataEx"),
        module_get_function: symbol!("cuModuleGetFunction"),
        module_unload: symbol!("cuModuleUnload"),
        func_get_param_info: optional!("cuFuncGetParamInfo"),
        launch_kernel: symbol!("cuLaunchKernel"),
    };
    // SAFETY: cuInit may be called any number of times.
    check("cuInit", unsafe { (api.init)(0) })?;
    // The function pointers above point into the library: it is never unloaded.
    core::mem::forget(lib);
    Ok(api)
}

/// The driver, loaded and initialised on first use: through the blocking
/// hook, so that other Python threads run meanwhile (a thread that finds it
/// loading waits without the GIL too).
pub(super) fn api() -> Result<&'static Api, Error> {
    static API: OnceLock<Result<Api, Error>> = OnceLock::new();
    if let Some(loaded) = API.get() {
        return loaded.as_ref().map_err(Clone::clone);
    }
    blocking(|| API.get_or_init(load)).as_ref().map_err(Clone::clone)
}

/// Whether a CUDA driver could be loaded and initialised, or why not.
pub fn driver_available() -> Result<(), Error> {
    api().map(|_| ())
}
