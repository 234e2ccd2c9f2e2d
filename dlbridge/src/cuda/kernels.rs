//! Kernels of one's own: PTX text loaded as a module into a device's primary
//! context (the one torch, CuPy and JAX use), its functions, and launches on
//! a stream. The driver compiles the PTX for the device when it is loaded.

use core::ffi::{c_uint, c_void, CStr};
use core::marker::PhantomData;
use std::sync::Arc;

use super::params::{check_arguments, layout};
use super::{check, host_side, in_context, stream_handle, Handle};
use crate::error::Error;
use crate::streams::Stream;
use crate::DeviceType;

/// A module loaded from PTX into one device's primary context, unloaded
/// (`cuModuleUnload`, in that context) when the last clone of it, and of its
/// [`Function`]s, is dropped. Clones share the one loaded module.
#[derive(Clone, Debug)]
pub struct Module {
    loaded: Arc<Loaded>,
}

#[derive(Debug)]
struct Loaded {
    /// The `CUmodule`.
    handle: usize,
    device_id: i32,
    /// The id of the context it was loaded in (`cuCtxGetId`; `None` on drivers
    /// before CUDA 12.0). A reset of the device's primary context unloads the
    /// module with the context; the one retained after it has another id.
    context: Option<u64>,
}

/// The id of the context current on this thread, where the driver tells it.
fn current_context_id(api: &super::Api) -> Option<u64> {
    let get_id = api.ctx_get_id?;
    let (mut context, mut id) = (core::ptr::null_mut(), 0u64);
    // SAFETY: queries with writable out values; the context is the current one.
    let known = unsafe { (api.ctx_get_current)(&mut context) == 0 && !context.is_null() && get_id(context, &mut id) == 0 };
    known.then_some(id)
}

impl Loaded {
    /// Whether the module is still loaded in the current context (pushed by
    /// `in_context`): false once the context it was loaded in was reset.
    fn alive(&self, api: &super::Api) -> bool {
        match (self.context, current_context_id(api)) {
            (Some(loaded_in), Some(now)) => loaded_in == now,
            _ => true, // a driver that cannot tell: trusted, as the launch contract asks
        }
    }

    /// CUDA_ERROR_CONTEXT_IS_DESTROYED, from `call`, for a module a reset unloaded.
    fn require_alive(&self, api: &super::Api, call: &'static str) -> Result<(), Error> {
        if self.alive(api) {
            Ok(())
        } else {
            check(call, super::CUDA_ERROR_CONTEXT_IS_DESTROYED)
        }
    }
}

impl Drop for Loaded {
    fn drop(&mut self) {
        let handle = core::ptr::without_provenance_mut(self.handle);
        let _ = in_context(self.device_id, |api| {
            // A module a context reset unloaded is gone; its handle may since
            // name another library's module.
            if !self.alive(api) {
                return Ok(());
            }
            // SAFETY: loaded by `from_ptx` in this context, unloaded once.
            host_side(api, || check("cuModuleUnload", unsafe { (api.module_unload)(handle) }))
        });
    }
}

/// Why `image` is not PTX text, if it is not: the driver tells PTX from a
/// cubin or fatbin by its first bytes, and reads those binary images by the
/// lengths their headers state, past the end of a short buffer.
fn not_ptx(image: &[u8]) -> Option<&'static str> {
    if image.is_empty() {
        Some("it is empty")
    } else if image.starts_with(b"\x7fELF") {
        Some("it is an ELF image (a cubin)")
    } else if !image.is_ascii() {
        Some("it holds bytes that are not ASCII (a fatbin, or not text)")
    } else {
        None
    }
}

impl Module {
    /// Loads NUL-terminated PTX text into device `device_id`'s primary
    /// context (`cuModuleLoadDataEx`); the driver JIT-compiles it for that
    /// device, which takes a while the first time (its cache keeps the result).
    ///
    /// Errors: [`Error::NotPtx`] for an image that is not PTX text (cubins and
    /// fatbins are refused: the driver would read them past the end of the
    /// buffer); [`Error::PtxRejected`] with the JIT compiler's log for PTX it
    /// refuses (CUDA_ERROR_INVALID_PTX, or CUDA_ERROR_UNSUPPORTED_PTX_VERSION
    /// for a `.version` newer than the driver), or [`Error::Cuda`] where it
    /// wrote no log; [`Error::CudaUnavailable`] without a driver.
    pub fn from_ptx(device_id: i32, ptx: &CStr) -> Result<Module, Error> {
        if let Some(reason) = not_ptx(ptx.to_bytes()) {
            return Err(Error::NotPtx { reason });
        }
        let image = ptx.as_ptr().cast::<c_void>();
        let handle = in_context(device_id, |api| {
            let mut module = core::ptr::null_mut();
            // A compilation that may take long: off the GIL, and no part of a capture.
            host_side(api, || {
                // SAFETY: NUL-terminated PTX text (checked above), kept alive by
                // the caller for this call.
                module = unsafe { super::params::load(api, image) }?;
                Ok::<(), Error>(())
            })?;
            Ok((module as usize, current_context_id(api)))
        })?;
        let (handle, context) = handle;
        Ok(Module { loaded: Arc::new(Loaded { handle, device_id, context }) })
    }

    /// The kernel named `name` (its `.entry` name in the PTX; `extern "C"` in
    /// CUDA C keeps it unmangled). CUDA_ERROR_NOT_FOUND when there is none.
    ///
    /// The driver's account of its parameters (CUDA 12.4 and later) is kept,
    /// and each launch's arguments are checked against it.
    pub fn function(&self, name: &CStr) -> Result<Function, Error> {
        let module = self.loaded.handle;
        let (handle, params) = in_context(self.loaded.device_id, |api| {
            self.loaded.require_alive(api, "cuModuleGetFunction")?;
            let mut function = core::ptr::null_mut();
            // SAFETY: this loaded module, a NUL-terminated name, a writable out value.
            check("cuModuleGetFunction", unsafe {
                (api.module_get_function)(&mut function, core::ptr::without_provenance_mut(module), name.as_ptr())
            })?;
            Ok((function as usize, layout(api, function)))
        })?;
        Ok(Function { module: self.clone(), handle, params })
    }

    /// The device whose context holds the module.
    pub fn device_id(&self) -> i32 {
        self.loaded.device_id
    }

    /// Whether the module is still loaded: false once the device's primary
    /// context was reset (by any library) since it was loaded, when the driver
    /// can tell (CUDA 12.0 and later); a cache of modules drops such ones.
    /// An error when the device's context cannot be made current.
    pub fn is_loaded(&self) -> Result<bool, Error> {
        in_context(self.loaded.device_id, |api| Ok(self.loaded.alive(api)))
    }
}

/// A kernel of a loaded [`Module`], which it keeps loaded.
#[derive(Clone, Debug)]
pub struct Function {
    module: Module,
    /// The `CUfunction`.
    handle: usize,
    /// Each parameter's offset and size, where the driver reports them.
    params: Option<Vec<(usize, usize)>>,
}

/// One kernel argument: a pointer to its value, which the driver copies when
/// the kernel is launched (an element of `cuLaunchKernel`'s `kernelParams`),
/// and the value's size, checked against the parameter's where the driver
/// reports it. The borrow keeps the value alive for the launch.
#[derive(Clone, Copy, Debug)]
pub struct KernelArg<'a> {
    value: *mut c_void,
    size: usize,
    _value: PhantomData<&'a ()>,
}

impl<'a> KernelArg<'a> {
    /// The argument whose value is `*value`: a device address as `u64`
    /// (`CUdeviceptr`), or a scalar of the kernel parameter's C type.
    pub fn new<T: Copy>(value: &'a T) -> Self {
        // The driver only reads through it.
        KernelArg { value: (value as *const T).cast_mut().cast(), size: core::mem::size_of::<T>(), _value: PhantomData }
    }

    /// The size of the value, in bytes.
    pub fn size(&self) -> usize {
        self.size
    }
}

/// A launch's grid and block sizes, in threads, and its dynamic shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Blocks in x, y and z.
    pub grid: [u32; 3],
    /// Threads per block in x, y and z.
    pub block: [u32; 3],
    /// Dynamic shared memory per block, in bytes.
    pub shared_mem_bytes: u32,
}

impl LaunchConfig {
    /// A one-dimensional launch of `block` threads per block, enough blocks
    /// for `n` threads but at most `max_blocks` (a grid-stride loop covers the
    /// rest); one block for `n == 0`.
    pub fn linear(n: u64, block: u32, max_blocks: u32) -> Self {
        let block = block.max(1);
        let blocks = n.div_ceil(u64::from(block)).clamp(1, u64::from(max_blocks.max(1)));
        LaunchConfig { grid: [blocks as u32, 1, 1], block: [block, 1, 1], shared_mem_bytes: 0 }
    }
}

impl Function {
    /// Queues the kernel on `stream` (`cuLaunchKernel`, with the module's
    /// device context current) and returns without waiting for it. Inside a
    /// CUDA graph capture on `stream` the launch becomes part of the graph.
    ///
    /// Launch errors the driver reports at once are returned (grid or block
    /// sizes out of range, too many resources); faults while the kernel runs
    /// are reported by later calls on the device, as with any launch.
    ///
    /// Errors: [`Error::InvalidStream`] for [`Stream::NO_SYNC`] and 0, which
    /// are no CUDA streams; [`Error::KernelArguments`] for arguments whose
    /// number or sizes differ from the kernel's parameters, where the driver
    /// reports them (CUDA 12.4 and later, [`Function::parameter_sizes`]).
    ///
    /// # Safety
    /// - `args` has one element per parameter of the kernel, in order, each
    ///   pointing at a value of that parameter's type (the driver reads as
    ///   many parameters as the kernel declares; their number and sizes are
    ///   checked only where the driver reports them);
    /// - whatever memory the kernel reads or writes is device memory of this
    ///   module's device (or memory it may reach) that stays allocated until
    ///   the kernel has run, and that no other work touches meanwhile unless
    ///   ordered on the GPU (data ready on another stream must be waited for
    ///   first, and readers of what it writes must wait for `stream`);
    /// - `stream` is 1, 2 or a live stream of this module's device;
    /// - inside a graph capture on `stream` ([`stream_is_capturing`]), the kernel
    ///   runs again at every replay of the graph: the module and that memory
    ///   must then stay loaded and allocated, and ordered as above, for as long
    ///   as the graph or an executable made from it may be launched;
    /// - the device's primary context has not been reset
    ///   (`cuDevicePrimaryCtxReset`, `torch.cuda` or CuPy device resets) since
    ///   the module was loaded: a reset unloads it with everything else.
    pub unsafe fn launch(&self, config: LaunchConfig, stream: Stream, args: &[KernelArg<'_>]) -> Result<(), Error> {
        let stream = stream.value();
        if !DeviceType::CUDA.accepts_stream(stream) || stream == -1 {
            return Err(Error::InvalidStream { device: DeviceType::CUDA, stream });
        }
        if let Some(layout) = &self.params {
            check_arguments(layout, args.iter().map(KernelArg::size))?;
        }
        let LaunchConfig { grid: [gx, gy, gz], block: [bx, by, bz], shared_mem_bytes } = config;
        let mut values: Vec<*mut c_void> = args.iter().map(|a| a.value).collect();
        // NULL for a kernel without parameters.
        let params: *mut *mut c_void = if values.is_empty() { core::ptr::null_mut() } else { values.as_mut_ptr() };
        let function = self.handle;
        in_context(self.module.loaded.device_id, |api| {
            self.module.loaded.require_alive(api, "cuLaunchKernel")?;
            // SAFETY: this module's function in its own context; `params` is an
            // array of pointers to the arguments' live values, whose types the
            // caller vouches for; no `extra`; the caller's stream.
            check("cuLaunchKernel", unsafe {
                (api.launch_kernel)(
                    core::ptr::without_provenance_mut(function),
                    gx,
                    gy,
                    gz,
                    bx,
                    by,
                    bz,
                    shared_mem_bytes,
                    stream_handle(stream),
                    params,
                    core::ptr::null_mut(),
                )
            })
        })
    }

    /// The module the kernel is in.
    pub fn module(&self) -> &Module {
        &self.module
    }

    /// The size of each parameter in bytes, in order, where the driver reports
    /// them (CUDA 12.4 and later): what launches are checked against.
    pub fn parameter_sizes(&self) -> Option<Vec<usize>> {
        self.params.as_ref().map(|layout| layout.iter().map(|&(_, size)| size).collect())
    }
}

/// Whether `stream` of device `device_id` is capturing a CUDA graph
/// (`cuStreamIsCapturing`): work queued there then runs at each replay of the
/// graph, not now. An error for the legacy stream (1) while a blocking stream
/// of the context captures, where the driver forbids using it.
pub fn stream_is_capturing(device_id: i32, stream: Stream) -> Result<bool, Error> {
    let stream = stream.value();
    if !DeviceType::CUDA.accepts_stream(stream) || stream == -1 {
        return Err(Error::InvalidStream { device: DeviceType::CUDA, stream });
    }
    in_context(device_id, |api| super::capturing(api, stream))
}

/// `cuLaunchKernel`'s signature.
pub(super) type LaunchKernel = unsafe extern "C" fn(
    Handle,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    Handle,
    *mut *mut c_void,
    *mut *mut c_void,
) -> super::CuResult;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_ptx_text_is_loaded() {
        assert_eq!(not_ptx(b".version 7.0\n.target sm_75\n"), None);
        assert!(not_ptx(b"").is_some());
        assert!(not_ptx(b"\x7fELF\x02\x01\x01").unwrap().contains("cubin"));
        assert!(not_ptx(b"\x50\xed\x55\xba\x01\x00").unwrap().contains("fatbin"), "a fatbin's magic");
        // Refused before any driver is loaded.
        let err = Module::from_ptx(0, c"\x7fELF").unwrap_err();
        assert!(matches!(err, Error::NotPtx { .. }), "{err}");
    }

    #[test]
    fn linear_launches_cover_the_elements_or_stride() {
        assert_eq!(LaunchConfig::linear(1000, 256, 1024).grid, [4, 1, 1]);
        assert_eq!(LaunchConfig::linear(0, 256, 1024).grid, [1, 1, 1]);
        assert_eq!(LaunchConfig::linear(u64::MAX, 256, 1024).grid, [1024, 1, 1]);
        assert_eq!(LaunchConfig::linear(5, 0, 0), LaunchConfig { grid: [1, 1, 1], block: [1, 1, 1], shared_mem_bytes: 0 });
    }

    #[test]
    fn a_kernel_arg_points_at_its_value_and_knows_its_size() {
        let (x, n) = (3.5f32, 7u64);
        assert_eq!(KernelArg::new(&x).value as usize, &x as *const f32 as usize);
        assert_eq!((KernelArg::new(&x).size(), KernelArg::new(&n).size()), (4, 8));
    }
}
