//! The driver API functions dlbridge calls for memory: pointer attributes,
//! allocations, frees and copies, with the real signatures.

use std::ffi::c_void;

use crate::capture::CAPTURE_UNSUPPORTED;
use crate::driver::stream_in_context;
use crate::timeline::{run_all_of, run_device, StreamKey, Work};
use crate::*;

const CU_POINTER_ATTRIBUTE_MEMORY_TYPE: u32 = 2;
const CU_POINTER_ATTRIBUTE_IS_MANAGED: u32 = 8;
const CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: u32 = 9;
const CU_MEMORYTYPE_HOST: u32 = 1;
const CU_MEMORYTYPE_DEVICE: u32 = 2;
const CU_MEMORYTYPE_UNIFIED: u32 = 4;
/// `CU_DEVICE_ATTRIBUTE_MAX_PITCH` of current GPUs.
const MAX_PITCH: usize = i32::MAX as usize;

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
