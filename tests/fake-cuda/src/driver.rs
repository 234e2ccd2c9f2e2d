//! The driver API functions dlbridge calls for initialisation, contexts,
//! events and streams, with the real signatures (`CUresult` as `u32`, handles
//! as pointer-sized values); `memory.rs` has the rest.

use std::ffi::{c_char, c_void, CStr};

use crate::capture::{CAPTURED_EVENT, CAPTURE_UNSUPPORTED, THREAD_MODE};
use crate::timeline::{run_all_of, run_to, StreamKey};
use crate::*;


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

/// `FAKE_CUDA_INIT_RESULT`: a `cuInit` failure to report (100: no device, ...);
/// `FAKE_CUDA_INIT_DELAY_MS`: how long the first `cuInit` takes (a driver's
/// start-up takes a while).
#[no_mangle]
pub extern "C" fn cuInit(_flags: u32) -> CuResult {
    if is_stub() {
        return STUB_LIBRARY;
    }
    let delay = std::env::var("FAKE_CUDA_INIT_DELAY_MS").ok().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    if delay > 0 && !with_state(|s| s.initialized) {
        std::thread::sleep(std::time::Duration::from_millis(delay));
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

/// Retains (and activates) the device's primary context; creating it (the
/// first retain) is a blocking call.
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
        let (handle, created) = with_state(|s| {
            let c = &mut s.contexts[device as usize];
            c.retains += 1;
            (context_handle(device, c.generation), c.retains == 1)
        });
        if created {
            blocking_delay();
        }
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

/// A context's id (CUDA 12.0): its handle, which names its device and
/// generation, so a context retained after a reset has another.
///
/// # Safety
/// `id` is writable.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetId(context: usize, id: *mut u64) -> CuResult {
    result((|| {
        initialized()?;
        let context = if context == 0 { CONTEXTS.with(|c| c.borrow().last().copied()).unwrap_or(0) } else { context };
        parse_context(context).ok_or(INVALID_CONTEXT)?;
        // SAFETY: the caller's out pointer.
        unsafe { *id = context as u64 };
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
pub(crate) fn stream_in_context(stream: usize) -> Result<(i64, StreamKey), CuResult> {
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

/// As the driver: a stream may wait for an event of any context, and a
/// created stream of another device than the current context's may wait;
/// capture rules apply (see `capture.rs`).
#[no_mangle]
pub extern "C" fn cuStreamWaitEvent(stream: usize, event: i64, flags: u32) -> CuResult {
    result((|| {
        initialized()?;
        let device = context()?;
        let key = with_state(|s| s.resolve_any(stream, device))?;
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
