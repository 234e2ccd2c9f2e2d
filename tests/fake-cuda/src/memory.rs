//! The driver API functions dlbridge calls for memory: pointer and device
//! attributes, allocations and frees, with the real signatures (`copies.rs`
//! has the copies). Frees are as documented: `cuMemFree` and `cuMemFreeHost`
//! free at once, `cuMemFreeAsync` when its stream reaches it.

use std::ffi::c_void;

use crate::blocks::{allocate, free_later, free_now, range_of};
use crate::driver::stream_in_context;
use crate::timeline::Work;
use crate::*;

const CU_POINTER_ATTRIBUTE_MEMORY_TYPE: u32 = 2;
const CU_POINTER_ATTRIBUTE_IS_MANAGED: u32 = 8;
const CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: u32 = 9;
const CU_MEMORYTYPE_HOST: u32 = 1;
const CU_MEMORYTYPE_DEVICE: u32 = 2;
const CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS: i32 = 89;
const CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: i32 = 115;

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

/// Frees at once: the driver only says it *may* wait for the device's work
/// first, so work still queued on the block runs on freed (or reused) memory.
fn free_at_once(ptr: usize, allocated: Kind, kind: Kind) -> Result<(), CuResult> {
    initialized()?;
    context()?;
    with_state(State::check_unsafe_call)?;
    blocking_delay();
    free_now(ptr, allocated, kind)
}

#[no_mangle]
pub extern "C" fn cuMemFree_v2(ptr: u64) -> CuResult {
    result(free_at_once(ptr as usize, Kind::Alloc, Kind::Free))
}

#[no_mangle]
pub extern "C" fn cuMemFreeHost(ptr: *mut c_void) -> CuResult {
    result(free_at_once(ptr as usize, Kind::AllocHost, Kind::FreeHost))
}

/// NOT_SUPPORTED on a device without memory pools.
fn pools() -> Result<(), CuResult> {
    if with_state(|s| s.pools) {
        Ok(())
    } else {
        Err(NOT_SUPPORTED)
    }
}

/// The device and stream of a stream-ordered allocation or free on `stream`,
/// with the pools it needs; refused during a capture (a graph allocation is not
/// modelled: dlbridge must not ask for one).
fn pool_stream(stream: usize) -> Result<(i64, StreamKey), CuResult> {
    let (device, key) = stream_in_context(stream)?;
    pools()?;
    with_state(|s| {
        s.check_legacy_use(key, false)?;
        if s.queue(key).capture.is_some() {
            return Err(capture::CAPTURE_UNSUPPORTED);
        }
        Ok(())
    })?;
    Ok((device, key))
}

/// Device memory from the device's pool, ordered on `stream` (the fake hands
/// it out at once; dlbridge must not use it on another stream unordered,
/// which the fake does not check).
///
/// # Safety
/// `ptr` is writable.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync(ptr: *mut u64, len: usize, stream: usize) -> CuResult {
    result((|| {
        let (device, _) = pool_stream(stream)?;
        let address = allocate(len, Place::Device(device), Kind::AllocAsync)?;
        log(Kind::AllocAsync, stream as i64, len as i64);
        // SAFETY: the caller's out pointer.
        unsafe { *ptr = address as u64 };
        Ok(())
    })())
}

/// Frees device memory when `stream` reaches the free: work queued before it
/// on that stream (or that the stream waits for) still sees the block.
#[no_mangle]
pub extern "C" fn cuMemFreeAsync(ptr: u64, stream: usize) -> CuResult {
    result((|| {
        let (_, key) = pool_stream(stream)?;
        let (size, place) = free_later(ptr as usize, Kind::Alloc)?;
        with_state(|s| s.enqueue(key, Work::Release { ptr: ptr as usize, size, place }, Vec::new()))?;
        log(Kind::FreeAsync, ptr as i64, stream as i64);
        Ok(())
    })())
}

/// The attributes dlbridge asks about: memory pools (as set by
/// [`fake_cuda_set_memory_pools`](crate::blocks::fake_cuda_set_memory_pools))
/// and concurrent managed access; INVALID_VALUE for the others.
///
/// # Safety
/// `value` is writable.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetAttribute(value: *mut i32, attribute: i32, device: i32) -> CuResult {
    result((|| {
        initialized()?;
        if !(0..DEVICES).contains(&i64::from(device)) {
            return Err(INVALID_DEVICE);
        }
        let answer = match attribute {
            CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED => i32::from(with_state(|s| s.pools)),
            CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS => 1,
            _ => return Err(INVALID_VALUE),
        };
        // SAFETY: the caller's out value.
        unsafe { *value = answer };
        Ok(())
    })())
}

