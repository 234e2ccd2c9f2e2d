//! Modules and kernel launches. `cuModuleLoadData(Ex)` takes PTX text (as a
//! CUDA 13.0 driver: ISA 9.0 at most) and finds its `.entry` kernels and
//! their parameter types; `cuLaunchKernel` queues a launch on its stream like
//! any other work. The fake cannot run PTX: a kernel it knows by its entry
//! name ([`KNOWN`]) runs, when its stream runs, as the Rust below, on the
//! host memory that stands in for device memory. A known name whose PTX
//! parameters differ from the fake's model fails to load, so that the model
//! and the shipped PTX cannot drift apart; other kernels load, and their
//! launches fail with CUDA_ERROR_NOT_SUPPORTED.
//!
//! A launch checks what a GPU would fault on later: every byte a known kernel
//! will touch must be memory of the launching context's device
//! (CUDA_ERROR_ILLEGAL_ADDRESS otherwise, at the launch).

use std::ffi::{c_char, c_void, CStr};

use crate::blocks::range_of;
use crate::driver::stream_in_context;
use crate::kernels::{Known, Param, KNOWN};
use crate::ptx::{compile, invalid, JitError};
use crate::timeline::Work;
use crate::*;

const NOT_FOUND: CuResult = 500;
const ILLEGAL_ADDRESS: CuResult = 700;
/// Module and function handles start here, far from streams and events.
const FIRST_MODULE: usize = 0x6d00_0000;

/// A loaded module.
pub(crate) struct Module {
    device: i64,
    /// Its entries: name and parameters.
    entries: Vec<(String, Vec<Param>)>,
}

/// A function of a module.
pub(crate) struct Function {
    module: usize,
    name: String,
    device: i64,
    params: Vec<Param>,
    known: Option<&'static Known>,
}

/// A queued launch: the kernel and a copy of its parameter bytes.
#[derive(Clone)]
pub(crate) struct Launch {
    known: &'static Known,
    params: Vec<u8>,
    threads: u64,
}

impl Launch {
    pub(crate) fn run(&self) {
        (self.known.run)(&self.params, self.threads);
    }

    /// The bytes the kernel reads and writes.
    pub(crate) fn touches(&self) -> Vec<(usize, usize)> {
        (self.known.touches)(&self.params)
    }
}

fn new_handle(s: &mut State) -> usize {
    let handle = FIRST_MODULE + 0x10 * s.next_module;
    s.next_module += 1;
    handle
}

/// Loads PTX text (a NUL-terminated string) into the current context, or
/// fails with what the JIT's log would say.
///
/// # Safety
/// `image` is a NUL-terminated string.
unsafe fn load(image: *const c_void) -> Result<usize, JitError> {
    let quiet = |code| (code, String::new());
    initialized().map_err(quiet)?;
    let device = context().map_err(quiet)?;
    with_state(State::check_unsafe_call).map_err(quiet)?;
    // SAFETY: the caller's NUL-terminated text.
    let text = unsafe { CStr::from_ptr(image.cast::<c_char>()) }.to_str().map_err(|_| invalid("the image is not UTF-8 text"))?;
    let entries = compile(text)?;
    blocking_delay();
    let count = entries.len() as i64;
    let handle = with_state(|s| {
        let handle = new_handle(s);
        s.modules.insert(handle, Module { device, entries });
        handle
    });
    log(Kind::ModuleLoad, handle as i64, count);
    Ok(handle)
}

/// Loads PTX text: INVALID_PTX for what is no PTX, UNSUPPORTED_PTX_VERSION
/// for an ISA newer than 9.0, INVALID_PTX for a kernel the fake knows whose
/// parameters differ from its model.
///
/// # Safety
/// `module` is writable; `image` is a NUL-terminated string (a cubin would
/// be read by its headers' lengths, which the fake does not model).
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadData(module: *mut usize, image: *const c_void) -> CuResult {
    // SAFETY: forwarded from the caller.
    match unsafe { load(image) } {
        Ok(handle) => {
            // SAFETY: the caller's out value.
            unsafe { *module = handle };
            SUCCESS
        }
        Err((code, _)) => code,
    }
}

/// `CU_JIT_ERROR_LOG_BUFFER` and `CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES`.
const JIT_ERROR_LOG_BUFFER: u32 = 5;
const JIT_ERROR_LOG_BUFFER_SIZE_BYTES: u32 = 6;

/// [`cuModuleLoadData`] with JIT options: the error log is written to
/// `CU_JIT_ERROR_LOG_BUFFER` (NUL-terminated, cut to the size given with
/// `CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES`, which is set to the bytes written);
/// other options are ignored.
///
/// # Safety
/// As [`cuModuleLoadData`]; `options` and `values` hold `count` entries, and a
/// log buffer holds as many bytes as its size option says.
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadDataEx(module: *mut usize, image: *const c_void, count: u32, options: *const u32, values: *mut *mut c_void) -> CuResult {
    let (mut buffer, mut size_slot) = (None, None);
    for i in 0..count as usize {
        // SAFETY: the caller's arrays of `count` entries.
        match unsafe { *options.add(i) } {
            JIT_ERROR_LOG_BUFFER => buffer = Some(unsafe { *values.add(i) }.cast::<u8>()),
            // SAFETY: as above; the slot holds the size as an integer.
            JIT_ERROR_LOG_BUFFER_SIZE_BYTES => size_slot = Some(unsafe { values.add(i) }),
            _ => {}
        }
    }
    // SAFETY: forwarded from the caller.
    match unsafe { load(image) } {
        Ok(handle) => {
            // SAFETY: the caller's out value.
            unsafe { *module = handle };
            SUCCESS
        }
        Err((code, message)) => {
            if let (Some(buffer), Some(slot)) = (buffer, size_slot) {
                // SAFETY: the caller's slot and buffer of that many bytes.
                unsafe {
                    let room = *slot as usize;
                    let n = message.len().min(room.saturating_sub(1));
                    if room > 0 && !buffer.is_null() {
                        std::ptr::copy_nonoverlapping(message.as_ptr(), buffer, n);
                        *buffer.add(n) = 0;
                    }
                    *slot = std::ptr::without_provenance_mut(n);
                }
            }
            code
        }
    }
}

/// # Safety
/// `function` is writable; `name` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn cuModuleGetFunction(function: *mut usize, module: usize, name: *const c_char) -> CuResult {
    result((|| {
        initialized()?;
        context()?;
        // SAFETY: the caller's NUL-terminated name.
        let name = unsafe { CStr::from_ptr(name) }.to_str().map_err(|_| NOT_FOUND)?;
        let handle = with_state(|s| {
            note_stale(s, module);
            let m = s.modules.get(&module).ok_or(INVALID_HANDLE)?;
            let (_, params) = m.entries.iter().find(|(n, _)| n == name).ok_or(NOT_FOUND)?;
            let f = Function { module, name: name.to_owned(), device: m.device, params: params.clone(), known: KNOWN.iter().find(|k| k.name == name) };
            // The same handle for the same kernel, as the driver.
            if let Some((&handle, _)) = s.functions.iter().find(|(_, g)| g.module == module && g.name == name) {
                return Ok(handle);
            }
            let handle = new_handle(s);
            s.functions.insert(handle, f);
            Ok::<usize, CuResult>(handle)
        })?;
        log(Kind::GetFunction, handle as i64, module as i64);
        // SAFETY: the caller's out value.
        unsafe { *function = handle };
        Ok(())
    })())
}

/// The offset and size of parameter `index` of a kernel, as the driver lays
/// them out (each at a multiple of its size), CUDA 12.4's `cuFuncGetParamInfo`;
/// INVALID_VALUE past the last. NOT_SUPPORTED when a test turned it off, as
/// for drivers that lack it.
///
/// # Safety
/// `offset` and `size` are writable.
#[no_mangle]
pub unsafe extern "C" fn cuFuncGetParamInfo(function: usize, index: usize, offset: *mut usize, size: *mut usize) -> CuResult {
    result((|| {
        initialized()?;
        let params = with_state(|s| {
            if !s.param_info {
                return Err(NOT_SUPPORTED);
            }
            note_stale(s, function);
            s.functions.get(&function).map(|f| f.params.clone()).ok_or(INVALID_HANDLE)
        })?;
        let mut at = 0usize;
        for (i, p) in params.iter().enumerate() {
            at = at.next_multiple_of(p.size());
            if i == index {
                // SAFETY: the caller's out values.
                unsafe { (*offset, *size) = (at, p.size()) };
                return Ok(());
            }
            at += p.size();
        }
        Err(INVALID_VALUE)
    })())
}

/// Makes `cuFuncGetParamInfo` answer (the default) or not.
#[no_mangle]
pub extern "C" fn fake_cuda_set_param_info(supported: bool) {
    with_state(|s| s.param_info = supported);
}

/// Unloads a module; its functions are dead handles from then on (launches
/// already queued still run).
#[no_mangle]
pub extern "C" fn cuModuleUnload(module: usize) -> CuResult {
    result((|| {
        initialized()?;
        with_state(|s| {
            s.check_unsafe_call()?;
            note_stale(s, module);
            s.modules.remove(&module).ok_or(INVALID_HANDLE)?;
            s.functions.retain(|_, f| f.module != module);
            Ok::<(), CuResult>(())
        })?;
        // The real unload waits for the device's work that uses the module.
        blocking_delay();
        let extra = with_state(|s| s.unload_delay_ms);
        std::thread::sleep(std::time::Duration::from_millis(extra));
        log(Kind::ModuleUnload, module as i64, 0);
        Ok(())
    })())
}

/// Whether every range is memory of `device` (device or managed memory).
fn on_device(ranges: &[(usize, usize)], device: i64) -> bool {
    ranges.iter().filter(|&&(_, len)| len > 0).all(|&(start, len)| {
        matches!(range_of(start, len), Some((_, Place::Device(d) | Place::Managed(d))) if d == device)
    })
}

/// Queues a launch on `stream` of the current context: INVALID_HANDLE for a
/// function of another context's module, INVALID_VALUE for sizes out of
/// range, NULL parameters or any `extra`, NOT_SUPPORTED for a kernel the fake
/// cannot run, ILLEGAL_ADDRESS for memory the kernel would touch that is not
/// the device's.
///
/// # Safety
/// `params` points to one readable pointer per kernel parameter, each to a
/// value of that parameter's size.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuLaunchKernel(
    function: usize,
    grid_x: u32,
    grid_y: u32,
    grid_z: u32,
    block_x: u32,
    block_y: u32,
    block_z: u32,
    shared_mem_bytes: u32,
    stream: usize,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CuResult {
    result((|| {
        let (device, key) = stream_in_context(stream)?;
        let (param_types, known) = with_state(|s| {
            note_stale(s, function);
            match s.functions.get(&function) {
                Some(f) if f.device == device => Ok((f.params.clone(), f.known)),
                _ => Err(INVALID_HANDLE),
            }
        })?;
        let grid = [grid_x, grid_y, grid_z];
        let block = [block_x, block_y, block_z];
        let sizes_ok = grid.iter().chain(&block).all(|&d| d >= 1)
            && grid_x < (1 << 31)
            && grid_y <= 65535
            && grid_z <= 65535
            && block_x <= 1024
            && block_y <= 1024
            && block_z <= 64
            && u64::from(block_x) * u64::from(block_y) * u64::from(block_z) <= 1024
            && shared_mem_bytes <= 48 * 1024;
        if !sizes_ok || !extra.is_null() || (params.is_null() && !param_types.is_empty()) {
            return Err(INVALID_VALUE);
        }
        let known = known.ok_or(NOT_SUPPORTED)?;
        let mut bytes = Vec::new();
        for (i, p) in param_types.iter().enumerate() {
            // SAFETY: the caller's array of one pointer per parameter, each to a value of its size.
            let value = unsafe { std::slice::from_raw_parts((*params.add(i)).cast::<u8>(), p.size()) };
            bytes.extend_from_slice(value);
        }
        if !on_device(&(known.touches)(&bytes), device) {
            return Err(ILLEGAL_ADDRESS);
        }
        let threads = u64::from(grid_x) * u64::from(block_x);
        with_state(|s| {
            s.check_legacy_use(key, false)?;
            s.enqueue(key, Work::Kernel(Launch { known, params: bytes, threads }), Vec::new())
        })?;
        log(Kind::Launch, stream as i64, function as i64);
        Ok(())
    })())
}

// --- test hooks ------------------------------------------------------------------------------

/// Modules loaded and not unloaded.
#[no_mangle]
pub extern "C" fn fake_cuda_live_modules() -> usize {
    with_state(|s| s.modules.len())
}

/// Forgets the modules and functions of `device` (its context was reset).
pub(crate) fn forget_device(s: &mut State, device: i64) {
    let doomed = s.modules.iter().filter(|(_, m)| m.device == device).map(|(&h, _)| h);
    let doomed: Vec<usize> = doomed.chain(s.functions.iter().filter(|(_, f)| f.device == device).map(|(&h, _)| h)).collect();
    s.destroyed_handles.extend(doomed);
    s.modules.retain(|_, m| m.device != device);
    s.functions.retain(|_, f| f.device != device);
}

/// Counts a use of a handle that a context reset destroyed.
fn note_stale(s: &mut State, handle: usize) {
    if s.destroyed_handles.contains(&handle) {
        s.stale_handle_uses += 1;
    }
}

/// How many calls used a module or function handle after a context reset
/// destroyed it.
#[no_mangle]
pub extern "C" fn fake_cuda_stale_handle_uses() -> usize {
    with_state(|s| s.stale_handle_uses)
}
