//! The driver API functions dlbridge calls, with the real signatures
//! (`CUresult` as `u32`, handles as pointer-sized values).

use std::ffi::{c_char, c_void, CStr};

use crate::capture::{CAPTURED_EVENT, CAPTURE_UNSUPPORTED, THREAD_MODE};
use crate::timeline::{run_all_of, run_device, run_to, StreamKey, Work};
use crate::*;

const CU_POINTER_ATTRIBUTE_MEMORY_TYPE: u32 = 2;
const CU_POINTER_ATTRIBUTE_IS_MANAGED: u32 = 8;
const CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: u32 = 9;
const CU_MEMORYTYPE_HOST: u32 = 1;
const CU_MEMORYTYPE_DEVICE: u32 = 2;
const CU_MEMORYTYPE_UNIFIED: u32 = 4;
/// `CU_DEVICE_ATTRIBUTE_MAX_PITCH` of current GPUs.
const MAX_PITCH: usize = i32::MAX as usize;

#[repr(C)]
struct DlInfo {
    fname: *const c_char,
    fbase: *mut c_void,
    sname: *const c_char,
    saddr: *mut c_void,
}

#[link(name = "dl")]
extern "C" {
    fn dladdr(address: *const c_void, info: *mut DlInfo) -> i32;
}

/// Whether this copy of the library is the file `FAKE_CUDA_STUB` names: a
/// toolkit stub, whose `cuInit` says CUDA_ERROR_STUB_LIBRARY.
fn is_stub() -> bool {
    let Some(stub) = std::env::var_os("FAKE_CUDA_STUB") else { return false };
    let mut info = DlInfo { fname: std::ptr::null(), fbase: std::ptr::null_mut(), sname: std::ptr::null(), saddr: std::ptr::null_mut() };
    // SAFETY: asks the loader which file holds this function; `info` is writable.
    if unsafe { dladdr(cuInit as *const c_void, &mut info) } == 0 || info.fname.is_null() {
        return false;
    }
    // SAFETY: the loader's NUL-terminated file name.
    let own = unsafe { CStr::from_ptr(info.fname) }.to_string_lossy().into_owned();
    let canonical = |p: &std::path::Path| std::fs::canonicalize(p).ok();
    canonical(std::path::Path::new(&own)) == canonical(std::path::Path::new(&stub))
}

/// `FAKE_CUDA_INIT_RESULT`: a `cuInit` failure to report (100: no device, ...).
#[no_mangle]
pub extern "C" fn cuInit(_flags: u32) -> CuResult {
    if is_stub() {
        return STUB_LIBRARY;
    }
    if let Some(code) = std::env::var("FAKE_CUDA_INIT_RESULT").ok().and_then(|v| v.parse::<u32>().ok()).filter(|&c| c != 0) {
        return code;
    }
    with_state(|s| s.initialized = true);
    SUCCESS
}

/// # Safety
/// `device` is writable.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(device: *mut i32, ordinal: i32) -> CuResult {
    result((|| {
        initialized()?;
        if !(0..DEVICES).contains(&i64::from(ordinal)) {
            return Err(INVALID_DEVICE);
        }
        // SAFETY: the caller's out pointer.
        unsafe { *device = ordinal };
        Ok(())
    })())
}

/// Retains (and activates) the device's primary context.
///
/// # Safety
/// `context` is writable.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(context: *mut usize, device: i32) -> CuResult {
    result((|| {
        initialized()?;
        let device = i64::from(device);
        if !(0..DEVICES).contains(&device) {
            return Err(INVALID_DEVICE);
        }
        let handle = with_state(|s| {
            let c = &mut s.contexts[device as usize];
            c.retains += 1;
            context_handle(device, c.generation)
        });
        // SAFETY: the caller's out pointer.
        unsafe { *context = handle };
        Ok(())
    })())
}

/// Releases a retain; the last one destroys the context.
#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(device: i32) -> CuResult {
    result((|| {
        initialized()?;
        with_state(|s| {
            let c = s.contexts.get_mut(device as usize).ok_or(INVALID_DEVICE)?;
            c.retains = c.retains.checked_sub(1).ok_or(INVALID_CONTEXT)?;
            if c.retains == 0 {
                c.generation += 1;
            }
            Ok(())
        })
    })())
}

#[no_mangle]
pub extern "C" fn cuCtxPushCurrent_v2(context: usize) -> CuResult {
    result((|| {
        initialized()?;
        parse_context(context).ok_or(INVALID_CONTEXT)?;
        CONTEXTS.with(|c| c.borrow_mut().push(context));
        Ok(())
    })())
}

/// # Safety
/// `context` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn cuCtxPopCurrent_v2(context: *mut usize) -> CuResult {
    result((|| {
        initialized()?;
        let popped = CONTEXTS.with(|c| c.borrow_mut().pop()).ok_or(INVALID_CONTEXT)?;
        if !context.is_null() {
            // SAFETY: the caller's out pointer.
            unsafe { *context = popped };
        }
        Ok(())
    })())
}

/// # Safety
/// `context` is writable.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(context: *mut usize) -> CuResult {
    result((|| {
        initialized()?;
        // SAFETY: the caller's out pointer.
        unsafe { *context = CONTEXTS.with(|c| c.borrow().last().copied()).unwrap_or(0) };
        Ok(())
    })())
}

/// # Safety
/// `device` is writable.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetDevice(device: *mut i32) -> CuResult {
    result((|| {
        initialized()?;
        let current = context()?;
        // SAFETY: the caller's out pointer.
        unsafe { *device = current as i32 };
        Ok(())
    })())
}

/// The current context's device and the queue `stream` names in it.
fn stream_in_context(stream: usize) -> Result<(i64, StreamKey), CuResult> {
    initialized()?;
    let device = context()?;
    Ok((device, with_state(|s| s.resolve(stream, device))?))
}

/// # Safety
/// `event` is writable.
#[no_mangle]
pub unsafe extern "C" fn cuEventCreate(event: *mut i64, flags: u32) -> CuResult {
    result((|| {
        initialized()?;
        let device = context()?;
        let id = with_state(|s| {
            let id = s.next_event;
            s.next_event += 1;
            s.events.insert(id, Event { device, record: None, captured: None });
            id
        });
        log(Kind::EventCreate, id, i64::from(flags));
        // SAFETY: the caller's out pointer.
        unsafe { *event = id };
        Ok(())
    })())
}

/// As the driver: the event and the stream belong to the current context.
#[no_mangle]
pub extern "C" fn cuEventRecord(event: i64, stream: usize) -> CuResult {
    result((|| {
        let (device, key) = stream_in_context(stream)?;
        with_state(|s| {
            if s.events.get(&event).is_none_or(|e| e.device != device) {
                return Err(INVALID_HANDLE);
            }
            s.check_legacy_use(key, false)?;
            let (at, capture) = {
                let q = s.queue(key);
                (q.len(), q.capture)
            };
            if let Some(id) = capture {
                if !s.captures.contains_key(&id) {
                    return Err(capture::CAPTURE_INVALIDATED);
                }
            }
            if let Some(e) = s.events.get_mut(&event) {
                (e.record, e.captured) = match capture {
                    Some(id) => (None, Some(id)),
                    None => (Some((key, at)), None),
                };
            }
            Ok(())
        })?;
        log(Kind::EventRecord, event, stream as i64);
        Ok(())
    })())
}

/// As the driver: a stream may wait for an event of any context; capture
/// rules apply (see `capture.rs`).
#[no_mangle]
pub extern "C" fn cuStreamWaitEvent(stream: usize, event: i64, flags: u32) -> CuResult {
    result((|| {
        let (_, key) = stream_in_context(stream)?;
        with_state(|s| {
            s.check_legacy_use(key, false)?;
            s.wait_event(key, event, flags)
        })?;
        log(Kind::StreamWait, stream as i64, event);
        Ok(())
    })())
}

#[no_mangle]
pub extern "C" fn cuEventDestroy_v2(event: i64) -> CuResult {
    result((|| {
        initialized()?;
        with_state(|s| s.events.remove(&event)).ok_or(INVALID_HANDLE)?;
        log(Kind::EventDestroy, event, 0);
        Ok(())
    })())
}

/// A host wait for an event's latest record (a potentially unsafe call).
#[no_mangle]
pub extern "C" fn cuEventSynchronize(event: i64) -> CuResult {
    result((|| {
        initialized()?;
        let record = with_state(|s| {
            s.check_unsafe_call()?;
            match s.events.get(&event) {
                None => Err(INVALID_HANDLE),
                Some(e) if e.captured.is_some_and(|id| s.captures.contains_key(&id)) => Err(CAPTURED_EVENT),
                Some(e) => Ok(e.record),
            }
        })?;
        if let Some((key, at)) = record {
            run_to(key, at);
        }
        blocking_delay();
        log(Kind::EventSync, event, 0);
        Ok(())
    })())
}

/// SUCCESS when an event's latest record is complete, NOT_READY otherwise.
#[no_mangle]
pub extern "C" fn cuEventQuery(event: i64) -> CuResult {
    result((|| {
        initialized()?;
        with_state(|s| {
            s.check_unsafe_call()?;
            let e = s.events.get(&event).ok_or(INVALID_HANDLE)?;
            if e.captured.is_some_and(|id| s.captures.contains_key(&id)) {
                return Err(CAPTURED_EVENT);
            }
            match e.record {
                Some((key, at)) if s.queues.get(&key).is_some_and(|q| q.done < at) => Err(NOT_READY),
                _ => Ok(()),
            }
        })
    })())
}

#[no_mangle]
pub extern "C" fn cuStreamSynchronize(stream: usize) -> CuResult {
    result((|| {
        let (_, key) = stream_in_context(stream)?;
        with_state(|s| {
            s.check_legacy_use(key, false)?;
            s.check_unsafe_call()?;
            if let Some(id) = s.queue(key).capture {
                s.invalidate(id);
                return Err(CAPTURE_UNSUPPORTED);
            }
            Ok(())
        })?;
        run_all_of(key);
        blocking_delay();
        log(Kind::StreamSync, stream as i64, 0);
        Ok(())
    })())
}

/// # Safety
/// `status` is writable.
#[no_mangle]
pub unsafe extern "C" fn cuStreamIsCapturing(stream: usize, status: *mut u32) -> CuResult {
    result((|| {
        let (_, key) = stream_in_context(stream)?;
        let value = with_state(|s| {
            s.check_legacy_use(key, true)?;
            Ok::<u32, CuResult>(s.capture_status(key))
        })?;
        // SAFETY: the caller's out value.
        unsafe { *status = value };
        Ok(())
    })())
}

/// # Safety
/// `mode` is readable and writable.
#[no_mangle]
pub unsafe extern "C" fn cuThreadExchangeStreamCaptureMode(mode: *mut u32) -> CuResult {
    result((|| {
        initialized()?;
        // SAFETY: the caller's in/out value.
        unsafe { *mode = THREAD_MODE.with(|m| m.replace(*mode)) };
        Ok(())
    })())
}

/// # Safety
/// `data` has room for an int.
#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttribute(data: *mut c_void, attribute: u32, pointer: u64) -> CuResult {
    result((|| {
        initialized()?;
        if with_state(|s| s.strict_pointer_queries) {
            context()?;
        }
        let place = range_of(pointer as usize, 1).map(|(_, place)| place);
        let value = match (attribute, place) {
            (CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p) => {
                log(Kind::PointerQuery, pointer as i64, p.map_or(-1, Place::device));
                p.map(|p| p.device() as u32)
            }
            (CU_POINTER_ATTRIBUTE_MEMORY_TYPE, Some(Place::Pinned(_))) => Some(CU_MEMORYTYPE_HOST),
            (CU_POINTER_ATTRIBUTE_MEMORY_TYPE, Some(_)) => Some(CU_MEMORYTYPE_DEVICE),
            (CU_POINTER_ATTRIBUTE_IS_MANAGED, Some(p)) => Some(u32::from(matches!(p, Place::Managed(_)))),
            _ => None,
        };
        let value = value.ok_or(INVALID_VALUE)?;
        // SAFETY: the caller's out value (an int for these attributes).
        unsafe { *data.cast::<u32>() = value };
        Ok(())
    })())
}

fn alloc_into(out: *mut u64, len: usize, place: impl FnOnce(i64) -> Place, kind: Kind) -> Result<(), CuResult> {
    initialized()?;
    let device = context()?;
    with_state(State::check_unsafe_call)?;
    let address = allocate(len, place(device), kind)?;
    // SAFETY: the caller's out pointer.
    unsafe { *out = address as u64 };
    Ok(())
}

/// # Safety
/// `ptr` is writable.
#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(ptr: *mut u64, len: usize) -> CuResult {
    result(alloc_into(ptr, len, Place::Device, Kind::Alloc))
}

/// # Safety
/// `ptr` is writable.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocManaged(ptr: *mut u64, len: usize, flags: u32) -> CuResult {
    if flags != 1 && flags != 2 {
        return INVALID_VALUE; // CU_MEM_ATTACH_GLOBAL or CU_MEM_ATTACH_HOST
    }
    result(alloc_into(ptr, len, Place::Managed, Kind::AllocManaged))
}

/// # Safety
/// `ptr` is writable.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocHost_v2(ptr: *mut *mut c_void, len: usize) -> CuResult {
    let code = result(alloc_into(ptr.cast(), len, Place::Pinned, Kind::AllocHost));
    if code == SUCCESS {
        blocking_delay();
    }
    code
}

/// Frees after the whole device's work is done, as the driver synchronises.
fn free_after_work(ptr: usize, allocated: Kind, kind: Kind) -> Result<(), CuResult> {
    initialized()?;
    let device = context()?;
    with_state(State::check_unsafe_call)?;
    run_device(device);
    blocking_delay();
    free(ptr, allocated, kind)
}

#[no_mangle]
pub extern "C" fn cuMemFree_v2(ptr: u64) -> CuResult {
    result(free_after_work(ptr as usize, Kind::Alloc, Kind::Free))
}

#[no_mangle]
pub extern "C" fn cuMemFreeHost(ptr: *mut c_void) -> CuResult {
    result(free_after_work(ptr as usize, Kind::AllocHost, Kind::FreeHost))
}

/// Queues copies on a stream; into pageable host memory they complete before
/// the call returns, as the driver's "async" copies to pageable memory do.
fn queue_copies(key: StreamKey, copies: Vec<(usize, usize, usize)>, pageable_dst: bool) -> Result<(), CuResult> {
    with_state(|s| {
        s.check_legacy_use(key, false)?;
        if pageable_dst && s.queue(key).capture.is_some() {
            return Err(CAPTURE_UNSUPPORTED);
        }
        s.enqueue(key, Work::Copies(copies), Vec::new())
    })?;
    if pageable_dst {
        run_all_of(key);
    }
    Ok(())
}

fn is_pinned(address: usize) -> bool {
    matches!(place_of(address), Some(Place::Pinned(_)))
}

#[no_mangle]
pub extern "C" fn cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: u64, len: usize, stream: usize) -> CuResult {
    result((|| {
        let (_, key) = stream_in_context(stream)?;
        check_copy(dst as usize, src as usize, len, true, false)?;
        queue_copies(key, vec![(dst as usize, src as usize, len)], !is_pinned(dst as usize))?;
        log(Kind::CopyDeviceToHost, stream as i64, len as i64);
        Ok(())
    })())
}

/// Synchronous, on the legacy stream: from pageable memory, the legacy stream
/// is synchronised, the bytes are staged, and the DMA stays queued on the
/// legacy stream (the call returns before it lands); from pinned memory the
/// copy is complete when the call returns.
#[no_mangle]
pub extern "C" fn cuMemcpyHtoD_v2(dst: u64, src: *const c_void, len: usize) -> CuResult {
    result((|| {
        let (_, legacy) = stream_in_context(1)?;
        check_copy(dst as usize, src as usize, len, false, true)?;
        with_state(|s| {
            s.check_legacy_use(legacy, false)?;
            s.check_unsafe_call()
        })?;
        run_all_of(legacy);
        blocking_delay();
        if is_pinned(src as usize) {
            crate::timeline::execute(&Work::Copies(vec![(dst as usize, src as usize, len)]));
        } else {
            // SAFETY: `len` readable bytes of the caller's host buffer.
            let bytes = unsafe { std::slice::from_raw_parts(src.cast::<u8>(), len) }.to_vec();
            with_state(|s| s.enqueue(legacy, Work::Staged { dst: dst as usize, bytes }, Vec::new()))?;
        }
        log(Kind::CopyHostToDevice, 0, len as i64);
        Ok(())
    })())
}

#[no_mangle]
pub extern "C" fn cuMemcpyDtoDAsync_v2(dst: u64, src: u64, len: usize, stream: usize) -> CuResult {
    result((|| {
        let (_, key) = stream_in_context(stream)?;
        check_copy(dst as usize, src as usize, len, true, true)?;
        queue_copies(key, vec![(dst as usize, src as usize, len)], false)?;
        log(Kind::CopyDeviceToDevice, stream as i64, len as i64);
        Ok(())
    })())
}

/// `CUDA_MEMCPY2D`.
#[repr(C)]
pub struct Memcpy2D {
    src_x_in_bytes: usize,
    src_y: usize,
    src_memory_type: u32,
    src_host: *const c_void,
    src_device: u64,
    src_array: *mut c_void,
    src_pitch: usize,
    dst_x_in_bytes: usize,
    dst_y: usize,
    dst_memory_type: u32,
    dst_host: *mut c_void,
    dst_device: u64,
    dst_array: *mut c_void,
    dst_pitch: usize,
    width_in_bytes: usize,
    height: usize,
}

/// `WidthInBytes` x `Height` rows at the two pitches (each at least the
/// width and at most the device's maximum pitch), between host and device
/// memory in any direction; rows must stay in known memory as 1-D copies do.
///
/// # Safety
/// `copy` points to a readable `CUDA_MEMCPY2D`.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy2DAsync_v2(copy: *const Memcpy2D, stream: usize) -> CuResult {
    result((|| {
        let (_, key) = stream_in_context(stream)?;
        // SAFETY: the caller's struct.
        let c = unsafe { &*copy };
        let (w, h) = (c.width_in_bytes, c.height);
        if c.src_pitch < w || c.dst_pitch < w || c.src_pitch > MAX_PITCH || c.dst_pitch > MAX_PITCH {
            return Err(INVALID_VALUE);
        }
        let base = |kind: u32, host: usize, device: u64| match kind {
            CU_MEMORYTYPE_HOST => Ok((host, false)),
            CU_MEMORYTYPE_DEVICE | CU_MEMORYTYPE_UNIFIED => Ok((device as usize, true)),
            _ => Err(INVALID_VALUE),
        };
        let (src, src_device) = base(c.src_memory_type, c.src_host as usize, c.src_device)?;
        let (dst, dst_device) = base(c.dst_memory_type, c.dst_host as usize, c.dst_device)?;
        let mut rows = Vec::with_capacity(h);
        for row in 0..h {
            let s = src + c.src_x_in_bytes + (c.src_y + row) * c.src_pitch;
            let d = dst + c.dst_x_in_bytes + (c.dst_y + row) * c.dst_pitch;
            check_copy(d, s, w, src_device, dst_device)?;
            rows.push((d, s, w));
        }
        queue_copies(key, rows, !dst_device && !is_pinned(dst))?;
        log(Kind::Copy2D, stream as i64, (w * h) as i64);
        Ok(())
    })())
}
