//! A stand-in for `libcuda.so`, loaded by dlbridge's CUDA layer on a machine
//! with no GPU, so that CI can check what dlbridge asks of the driver: which
//! stream waits for which event, which context is current for each call, what
//! is allocated, copied and freed. It proves nothing about a GPU
//! (`bindings/python/tests/gpu` does that on one).
//!
//! "Device" memory is host memory. Two devices exist; device `d`'s primary
//! context is the handle `(d + 1) << 12`. Every call but `cuInit`,
//! `cuDeviceGet`, `cuDevicePrimaryCtxRetain` and the context stack needs a
//! current context, as the real driver may (it lists CUDA_ERROR_INVALID_CONTEXT
//! for each). Copies must stay inside
//! memory the driver knows: its own allocations, or ranges a test registers
//! with `fake_cuda_register` (a producer's "device" memory).
//!
//! Tests read the log through the `fake_cuda_*` functions (ctypes).

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

type CuResult = u32;
const SUCCESS: CuResult = 0;
const INVALID_VALUE: CuResult = 1;
const OUT_OF_MEMORY: CuResult = 2;
const INVALID_DEVICE: CuResult = 101;
const INVALID_CONTEXT: CuResult = 201;
const INVALID_HANDLE: CuResult = 400;

const DEVICES: i32 = 2;
const CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: u32 = 9;
/// Where pinned host memory is said to live in the log and the registry.
const PINNED: i64 = -2;

/// What the log records, one `[kind, a, b, c]` row per call.
#[repr(i64)]
#[derive(Clone, Copy)]
enum Kind {
    /// event, flags, context device
    EventCreate = 1,
    /// event, stream, context device
    EventRecord = 2,
    /// stream, event, context device
    StreamWait = 3,
    /// event
    EventDestroy = 4,
    /// stream, 0, context device
    StreamSync = 5,
    /// stream, bytes, context device
    CopyDeviceToHost = 6,
    /// 0, bytes, context device
    CopyHostToDevice = 7,
    /// stream, bytes, context device
    CopyDeviceToDevice = 8,
    /// address, bytes, context device
    Alloc = 9,
    /// address, 0, context device
    Free = 10,
    /// address, bytes, context device
    AllocHost = 11,
    /// address, 0, context device
    FreeHost = 12,
}

struct State {
    next_event: i64,
    live_events: HashMap<i64, u32>,
    /// Known memory: start -> (length, device or PINNED), ours or registered.
    memory: HashMap<usize, (usize, i64)>,
    /// Ours only, to free: address -> layout size.
    owned: HashMap<usize, usize>,
    log: Vec<[i64; 4]>,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

thread_local! {
    /// This thread's context stack, innermost last.
    static CONTEXTS: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

fn with_state<T>(body: impl FnOnce(&mut State) -> T) -> T {
    let mut guard = STATE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let state = guard.get_or_insert_with(|| State {
        next_event: 1,
        live_events: HashMap::new(),
        memory: HashMap::new(),
        owned: HashMap::new(),
        log: Vec::new(),
    });
    body(state)
}

fn context_handle(device: i32) -> usize {
    (device as usize + 1) << 12
}

/// The device whose context is current on this thread.
fn current_device() -> Option<i64> {
    CONTEXTS.with(|c| c.borrow().last().map(|&h| (h >> 12) as i64 - 1))
}

fn log(kind: Kind, a: i64, b: i64) -> Result<i64, CuResult> {
    let device = current_device().ok_or(INVALID_CONTEXT)?;
    with_state(|s| s.log.push([kind as i64, a, b, device]));
    Ok(device)
}

fn result(r: Result<(), CuResult>) -> CuResult {
    r.err().unwrap_or(SUCCESS)
}

/// A stream handle dlbridge may pass: the two default streams or any other
/// non-zero value; NULL and values that cannot be pointers (negative) are not.
fn check_stream(stream: usize) -> Result<i64, CuResult> {
    let value = stream as i64;
    if value <= 0 {
        return Err(INVALID_HANDLE);
    }
    Ok(value)
}

/// Whether `[start, start + len)` lies inside one known range.
fn known(start: usize, len: usize) -> bool {
    with_state(|s| {
        s.memory.iter().any(|(&base, &(size, _))| start >= base && start.checked_add(len).is_some_and(|end| end <= base + size))
    })
}

fn allocate(len: usize, place: i64, kind: Kind) -> Result<usize, CuResult> {
    let layout = std::alloc::Layout::from_size_align(len.max(1), 256).map_err(|_| OUT_OF_MEMORY)?;
    // SAFETY: a non-zero size.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) } as usize;
    if ptr == 0 {
        return Err(OUT_OF_MEMORY);
    }
    log(kind, ptr as i64, len as i64).inspect_err(|_| {
        // SAFETY: just allocated with this layout.
        unsafe { std::alloc::dealloc(ptr as *mut u8, layout) }
    })?;
    with_state(|s| {
        s.memory.insert(ptr, (len.max(1), place));
        s.owned.insert(ptr, len.max(1));
    });
    Ok(ptr)
}

fn free(ptr: usize, kind: Kind) -> Result<(), CuResult> {
    log(kind, ptr as i64, 0)?;
    let size = with_state(|s| {
        let size = s.owned.remove(&ptr)?;
        s.memory.remove(&ptr);
        Some(size)
    })
    .ok_or(INVALID_VALUE)?;
    // SAFETY: allocated by `allocate` with this size and alignment.
    unsafe { std::alloc::dealloc(ptr as *mut u8, std::alloc::Layout::from_size_align_unchecked(size, 256)) };
    Ok(())
}

fn copy(dst: usize, src: usize, len: usize, check_src: bool, check_dst: bool) -> Result<(), CuResult> {
    if (check_src && !known(src, len)) || (check_dst && !known(dst, len)) {
        return Err(INVALID_VALUE);
    }
    // SAFETY: both ranges are host memory; the source is known to the driver or
    // the caller's own, and the destination has room (the caller's promise).
    unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len) };
    Ok(())
}

// --- the driver API -------------------------------------------------------

#[no_mangle]
pub extern "C" fn cuInit(_flags: u32) -> CuResult {
    SUCCESS
}

/// # Safety
/// `device` is writable.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(device: *mut i32, ordinal: i32) -> CuResult {
    if !(0..DEVICES).contains(&ordinal) {
        return INVALID_DEVICE;
    }
    // SAFETY: the caller's out pointer.
    unsafe { *device = ordinal };
    SUCCESS
}

/// # Safety
/// `context` is writable.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(context: *mut usize, device: i32) -> CuResult {
    if !(0..DEVICES).contains(&device) {
        return INVALID_DEVICE;
    }
    // SAFETY: the caller's out pointer.
    unsafe { *context = context_handle(device) };
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuCtxPushCurrent_v2(context: usize) -> CuResult {
    if !(0..DEVICES).any(|d| context_handle(d) == context) {
        return INVALID_CONTEXT;
    }
    CONTEXTS.with(|c| c.borrow_mut().push(context));
    SUCCESS
}

/// # Safety
/// `context` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn cuCtxPopCurrent_v2(context: *mut usize) -> CuResult {
    match CONTEXTS.with(|c| c.borrow_mut().pop()) {
        Some(popped) => {
            if !context.is_null() {
                // SAFETY: the caller's out pointer.
                unsafe { *context = popped };
            }
            SUCCESS
        }
        None => INVALID_CONTEXT,
    }
}

/// # Safety
/// `event` is writable.
#[no_mangle]
pub unsafe extern "C" fn cuEventCreate(event: *mut i64, flags: u32) -> CuResult {
    let id = with_state(|s| {
        let id = s.next_event;
        s.next_event += 1;
        id
    });
    if let Err(code) = log(Kind::EventCreate, id, i64::from(flags)) {
        return code;
    }
    with_state(|s| s.live_events.insert(id, flags));
    // SAFETY: the caller's out pointer.
    unsafe { *event = id };
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuEventRecord(event: i64, stream: usize) -> CuResult {
    result((|| {
        let stream = check_stream(stream)?;
        if !with_state(|s| s.live_events.contains_key(&event)) {
            return Err(INVALID_HANDLE);
        }
        log(Kind::EventRecord, event, stream).map(drop)
    })())
}

#[no_mangle]
pub extern "C" fn cuStreamWaitEvent(stream: usize, event: i64, _flags: u32) -> CuResult {
    result((|| {
        let stream = check_stream(stream)?;
        if !with_state(|s| s.live_events.contains_key(&event)) {
            return Err(INVALID_HANDLE);
        }
        log(Kind::StreamWait, stream, event).map(drop)
    })())
}

#[no_mangle]
pub extern "C" fn cuEventDestroy_v2(event: i64) -> CuResult {
    if with_state(|s| s.live_events.remove(&event)).is_none() {
        return INVALID_HANDLE;
    }
    with_state(|s| s.log.push([Kind::EventDestroy as i64, event, 0, current_device().unwrap_or(-1)]));
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuStreamSynchronize(stream: usize) -> CuResult {
    result(check_stream(stream).and_then(|stream| log(Kind::StreamSync, stream, 0).map(drop)))
}

/// # Safety
/// `data` has room for an int.
#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttribute(data: *mut c_void, attribute: u32, pointer: u64) -> CuResult {
    if attribute != CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL {
        return INVALID_VALUE;
    }
    if current_device().is_none() {
        return INVALID_CONTEXT;
    }
    let found = with_state(|s| {
        s.memory
            .iter()
            .find(|(&base, &(size, _))| (pointer as usize) >= base && (pointer as usize) < base + size)
            .map(|(_, &(_, place))| place)
    });
    match found {
        Some(device) if device >= 0 => {
            // SAFETY: the caller's out value.
            unsafe { *data.cast::<i32>() = device as i32 };
            SUCCESS
        }
        _ => INVALID_VALUE,
    }
}

/// # Safety
/// `ptr` is writable.
#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(ptr: *mut u64, len: usize) -> CuResult {
    let Some(device) = current_device() else { return INVALID_CONTEXT };
    match allocate(len, device, Kind::Alloc) {
        Ok(address) => {
            // SAFETY: the caller's out pointer.
            unsafe { *ptr = address as u64 };
            SUCCESS
        }
        Err(code) => code,
    }
}

#[no_mangle]
pub extern "C" fn cuMemFree_v2(ptr: u64) -> CuResult {
    result(free(ptr as usize, Kind::Free))
}

/// # Safety
/// `ptr` is writable.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocHost_v2(ptr: *mut *mut c_void, len: usize) -> CuResult {
    match allocate(len, PINNED, Kind::AllocHost) {
        Ok(address) => {
            // SAFETY: the caller's out pointer.
            unsafe { *ptr = address as *mut c_void };
            SUCCESS
        }
        Err(code) => code,
    }
}

#[no_mangle]
pub extern "C" fn cuMemFreeHost(ptr: *mut c_void) -> CuResult {
    result(free(ptr as usize, Kind::FreeHost))
}

#[no_mangle]
pub extern "C" fn cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: u64, len: usize, stream: usize) -> CuResult {
    result((|| {
        let stream = check_stream(stream)?;
        log(Kind::CopyDeviceToHost, stream, len as i64)?;
        copy(dst as usize, src as usize, len, true, false)
    })())
}

#[no_mangle]
pub extern "C" fn cuMemcpyHtoD_v2(dst: u64, src: *const c_void, len: usize) -> CuResult {
    result(log(Kind::CopyHostToDevice, 0, len as i64).and_then(|_| copy(dst as usize, src as usize, len, false, true)))
}

#[no_mangle]
pub extern "C" fn cuMemcpyDtoDAsync_v2(dst: u64, src: u64, len: usize, stream: usize) -> CuResult {
    result((|| {
        let stream = check_stream(stream)?;
        log(Kind::CopyDeviceToDevice, stream, len as i64)?;
        copy(dst as usize, src as usize, len, true, true)
    })())
}

// --- for tests ------------------------------------------------------------

/// Declares `[start, start + len)` to be memory of `device`, as a producer's
/// device memory would be.
#[no_mangle]
pub extern "C" fn fake_cuda_register(start: usize, len: usize, device: i64) {
    with_state(|s| s.memory.insert(start, (len, device)));
}

/// Forgets a range registered with [`fake_cuda_register`].
#[no_mangle]
pub extern "C" fn fake_cuda_unregister(start: usize) {
    with_state(|s| {
        if !s.owned.contains_key(&start) {
            s.memory.remove(&start);
        }
    });
}

/// How many rows the log holds.
#[no_mangle]
pub extern "C" fn fake_cuda_log_len() -> usize {
    with_state(|s| s.log.len())
}

/// Copies log row `index` into `out` (four values); false past the end.
///
/// # Safety
/// `out` has room for four values.
#[no_mangle]
pub unsafe extern "C" fn fake_cuda_log_row(index: usize, out: *mut i64) -> bool {
    with_state(|s| match s.log.get(index) {
        Some(row) => {
            // SAFETY: the caller's buffer of four.
            unsafe { std::ptr::copy_nonoverlapping(row.as_ptr(), out, 4) };
            true
        }
        None => false,
    })
}

/// Empties the log.
#[no_mangle]
pub extern "C" fn fake_cuda_clear_log() {
    with_state(|s| s.log.clear());
}

/// Events created and not destroyed.
#[no_mangle]
pub extern "C" fn fake_cuda_live_events() -> usize {
    with_state(|s| s.live_events.len())
}

/// Allocations (device and pinned) not freed.
#[no_mangle]
pub extern "C" fn fake_cuda_live_allocations() -> usize {
    with_state(|s| s.owned.len())
}

/// How many contexts this thread has pushed and not popped.
#[no_mangle]
pub extern "C" fn fake_cuda_context_depth() -> usize {
    CONTEXTS.with(|c| c.borrow().len())
}
