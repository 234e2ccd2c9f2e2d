//! Modules and kernel launches. `cuModuleLoadData` takes PTX text (as a
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

use crate::driver::stream_in_context;
use crate::timeline::Work;
use crate::*;

const INVALID_PTX: CuResult = 218;
const UNSUPPORTED_PTX_VERSION: CuResult = 222;
const NOT_FOUND: CuResult = 500;
const ILLEGAL_ADDRESS: CuResult = 700;
const NOT_SUPPORTED: CuResult = 801;
/// The newest PTX ISA a CUDA 13.0 driver (the lent GPU machines' 580) loads.
const NEWEST_ISA: (u32, u32) = (9, 0);
/// Module and function handles start here, far from streams and events.
const FIRST_MODULE: usize = 0x6d00_0000;

/// A kernel parameter's PTX type, by its size.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Param {
    U64,
    F32,
    Other(usize),
}

impl Param {
    fn parse(ty: &str) -> Param {
        match ty {
            ".u64" | ".s64" | ".b64" => Param::U64,
            ".f32" => Param::F32,
            ".u32" | ".s32" | ".b32" => Param::Other(4),
            ".f64" => Param::Other(8),
            ".u16" | ".s16" | ".b16" | ".f16" => Param::Other(2),
            _ => Param::Other(1),
        }
    }

    fn size(self) -> usize {
        match self {
            Param::U64 => 8,
            Param::F32 => 4,
            Param::Other(n) => n,
        }
    }
}

/// A kernel the fake can run: its entry name, parameters, and what it does.
pub(crate) struct Known {
    name: &'static str,
    params: &'static [Param],
    /// The bytes it reads and writes, from its parameters: `(address, len)`.
    touches: fn(&[u8]) -> Vec<(usize, usize)>,
    /// Runs the whole grid, from its parameters and the grid's total x threads.
    run: fn(&[u8], u64),
}

fn u64_at(params: &[u8], index: usize) -> u64 {
    u64::from_ne_bytes(params[index * 8..index * 8 + 8].try_into().unwrap_or_default())
}

fn f32_at(params: &[u8], offset: usize) -> f32 {
    f32::from_ne_bytes(params[offset..offset + 4].try_into().unwrap_or_default())
}

/// examples/cuda_kernel's `scale_f32(const float* x, float* out, u64 n, float factor)`:
/// `out[i] = x[i] * factor` for `i < n`, by a grid-stride loop over `threads`.
fn scale_f32_touches(p: &[u8]) -> Vec<(usize, usize)> {
    let n = u64_at(p, 2) as usize;
    vec![(u64_at(p, 0) as usize, n.saturating_mul(4)), (u64_at(p, 1) as usize, n.saturating_mul(4))]
}

fn scale_f32_run(p: &[u8], threads: u64) {
    let (x, out, n, factor) = (u64_at(p, 0) as *const f32, u64_at(p, 1) as *mut f32, u64_at(p, 2), f32_at(p, 24));
    for thread in 0..threads {
        let mut i = thread;
        while i < n {
            // SAFETY: checked at the launch to be memory of the device (see `touches`),
            // which stays allocated until the work has run.
            unsafe { out.add(i as usize).write_unaligned(x.add(i as usize).read_unaligned() * factor) };
            i += threads;
        }
    }
}

pub(crate) const KNOWN: &[Known] = &[Known {
    name: "scale_f32",
    params: &[Param::U64, Param::U64, Param::U64, Param::F32],
    touches: scale_f32_touches,
    run: scale_f32_run,
}];

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
}

/// `.version X.Y` of PTX text.
fn isa_version(ptx: &str) -> Option<(u32, u32)> {
    let line = ptx.lines().map(str::trim).find(|l| l.starts_with(".version"))?;
    let (major, minor) = line.strip_prefix(".version")?.trim().split_once('.')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// The `.entry` kernels of PTX text with their parameter types, or INVALID_PTX.
fn entries(ptx: &str) -> Result<Vec<(String, Vec<Param>)>, CuResult> {
    if !ptx.lines().any(|l| l.trim_start().starts_with(".target")) {
        return Err(INVALID_PTX);
    }
    let mut out = Vec::new();
    let mut rest = ptx;
    while let Some(at) = rest.find(".entry ") {
        rest = &rest[at + ".entry ".len()..];
        let open = rest.find('(').ok_or(INVALID_PTX)?;
        let close = rest.find(')').ok_or(INVALID_PTX)?;
        let name = rest[..open].trim();
        if name.is_empty() || close < open {
            return Err(INVALID_PTX);
        }
        let params = rest[open + 1..close]
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(|p| p.split_whitespace().nth(1).map(Param::parse).ok_or(INVALID_PTX))
            .collect::<Result<Vec<_>, _>>()?;
        out.push((name.to_owned(), params));
        rest = &rest[close..];
    }
    Ok(out)
}

fn new_handle(s: &mut State) -> usize {
    let handle = FIRST_MODULE + 0x10 * s.next_module;
    s.next_module += 1;
    handle
}

/// Loads PTX text (a NUL-terminated string): INVALID_PTX for what is no PTX,
/// UNSUPPORTED_PTX_VERSION for an ISA newer than 9.0, INVALID_PTX for a kernel
/// the fake knows whose parameters differ from its model.
///
/// # Safety
/// `module` is writable; `image` is a NUL-terminated string (a cubin would
/// be read by its headers' lengths, which the fake does not model).
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadData(module: *mut usize, image: *const c_void) -> CuResult {
    result((|| {
        initialized()?;
        let device = context()?;
        with_state(State::check_unsafe_call)?;
        // SAFETY: the caller's NUL-terminated text.
        let text = unsafe { CStr::from_ptr(image.cast::<c_char>()) }.to_str().map_err(|_| INVALID_PTX)?;
        let version = isa_version(text).ok_or(INVALID_PTX)?;
        if version > NEWEST_ISA {
            return Err(UNSUPPORTED_PTX_VERSION);
        }
        let entries = entries(text)?;
        for (name, params) in &entries {
            if KNOWN.iter().any(|k| k.name == name && k.params != params.as_slice()) {
                return Err(INVALID_PTX);
            }
        }
        blocking_delay();
        let count = entries.len() as i64;
        let handle = with_state(|s| {
            let handle = new_handle(s);
            s.modules.insert(handle, Module { device, entries });
            handle
        });
        log(Kind::ModuleLoad, handle as i64, count);
        // SAFETY: the caller's out value.
        unsafe { *module = handle };
        Ok(())
    })())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_and_versions_of_ptx() {
        let ptx = ".version 7.0\n.target sm_75\n.visible .entry k(\n\t.param .u64 k_param_0,\n\t.param .f32 k_param_1\n)\n{ ret; }\n\
                   .visible .entry none()\n{ ret; }\n";
        assert_eq!(isa_version(ptx), Some((7, 0)));
        assert_eq!(entries(ptx), Ok(vec![("k".to_owned(), vec![Param::U64, Param::F32]), ("none".to_owned(), vec![])]));
        assert_eq!(entries(".version 7.0\n"), Err(INVALID_PTX), "no .target");
        let shipped = include_str!("../../../examples/cuda_kernel/kernels/scale.ptx");
        assert!(isa_version(shipped).is_some_and(|v| v <= NEWEST_ISA));
        assert_eq!(entries(shipped), Ok(vec![("scale_f32".to_owned(), KNOWN[0].params.to_vec())]));
    }
}
