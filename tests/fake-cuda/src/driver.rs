//! The driver API functions dlbridge calls, with the real signatures
//! (`CUresult` as `u32`, handles as pointers-sized values).

use std::ffi::c_void;

use crate::*;

const CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: u32 = 9;

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
    let Ok(device) = context() else { return INVALID_CONTEXT };
    let id = with_state(|s| {
        let id = s.next_event;
        s.next_event += 1;
        s.events.insert(id, (flags, device));
        id
    });
    log(Kind::EventCreate, id, i64::from(flags));
    // SAFETY: the caller's out pointer.
    unsafe { *event = id };
    SUCCESS
}

/// As the driver: the event must belong to the current context.
#[no_mangle]
pub extern "C" fn cuEventRecord(event: i64, stream: usize) -> CuResult {
    result((|| {
        let device = context()?;
        let stream = check_stream(stream)?;
        match with_state(|s| s.events.get(&event).copied()) {
            Some((_, made_in)) if made_in == device => {}
            _ => return Err(INVALID_HANDLE),
        }
        log(Kind::EventRecord, event, stream);
        Ok(())
    })())
}

/// As the driver: a stream may wait for an event of any context.
#[no_mangle]
pub extern "C" fn cuStreamWaitEvent(stream: usize, event: i64, _flags: u32) -> CuResult {
    result((|| {
        context()?;
        let stream = check_stream(stream)?;
        if !with_state(|s| s.events.contains_key(&event)) {
            return Err(INVALID_HANDLE);
        }
        log(Kind::StreamWait, stream, event);
        Ok(())
    })())
}

#[no_mangle]
pub extern "C" fn cuEventDestroy_v2(event: i64) -> CuResult {
    if with_state(|s| s.events.remove(&event)).is_none() {
        return INVALID_HANDLE;
    }
    log(Kind::EventDestroy, event, 0);
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuStreamSynchronize(stream: usize) -> CuResult {
    result((|| {
        context()?;
        log(Kind::StreamSync, check_stream(stream)?, 0);
        Ok(())
    })())
}

/// # Safety
/// `data` has room for an int.
#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttribute(data: *mut c_void, attribute: u32, pointer: u64) -> CuResult {
    if attribute != CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL {
        return INVALID_VALUE;
    }
    if with_state(|s| s.strict_pointer_queries) && current_device().is_none() {
        return INVALID_CONTEXT;
    }
    let found = range_of(pointer as usize, 1).map(|(_, place)| place).filter(|&place| place >= 0);
    log(Kind::PointerQuery, pointer as i64, found.unwrap_or(-1));
    match found {
        Some(device) => {
            // SAFETY: the caller's out value.
            unsafe { *data.cast::<i32>() = device as i32 };
            SUCCESS
        }
        None => INVALID_VALUE,
    }
}

/// # Safety
/// `ptr` is writable.
#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(ptr: *mut u64, len: usize) -> CuResult {
    let Ok(device) = context() else { return INVALID_CONTEXT };
    match allocate(len, device, Kind::Alloc) {
        Ok(address) => {
            // SAFETY: the caller's out pointer.
            unsafe { *ptr = address as u64 };
            SUCCESS
        }
        Err(code) => code,
    }
}

/// # Safety
/// `ptr` is writable.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocManaged(ptr: *mut u64, len: usize, flags: u32) -> CuResult {
    let Ok(device) = context() else { return INVALID_CONTEXT };
    if flags != 1 && flags != 2 {
        return INVALID_VALUE; // CU_MEM_ATTACH_GLOBAL or CU_MEM_ATTACH_HOST
    }
    match allocate(len, device, Kind::AllocManaged) {
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
    result(free(ptr as usize, Kind::Alloc, Kind::Free))
}

/// # Safety
/// `ptr` is writable.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocHost_v2(ptr: *mut *mut c_void, len: usize) -> CuResult {
    if context().is_err() {
        return INVALID_CONTEXT;
    }
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
    result(free(ptr as usize, Kind::AllocHost, Kind::FreeHost))
}

#[no_mangle]
pub extern "C" fn cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: u64, len: usize, stream: usize) -> CuResult {
    result((|| {
        context()?;
        let stream = check_stream(stream)?;
        copy(dst as usize, src as usize, len, true, false)?;
        log(Kind::CopyDeviceToHost, stream, len as i64);
        Ok(())
    })())
}

#[no_mangle]
pub extern "C" fn cuMemcpyHtoD_v2(dst: u64, src: *const c_void, len: usize) -> CuResult {
    result((|| {
        context()?;
        copy(dst as usize, src as usize, len, false, true)?;
        log(Kind::CopyHostToDevice, 0, len as i64);
        Ok(())
    })())
}

#[no_mangle]
pub extern "C" fn cuMemcpyDtoDAsync_v2(dst: u64, src: u64, len: usize, stream: usize) -> CuResult {
    result((|| {
        context()?;
        let stream = check_stream(stream)?;
        copy(dst as usize, src as usize, len, true, true)?;
        log(Kind::CopyDeviceToDevice, stream, len as i64);
        Ok(())
    })())
}
