//! The driver API functions dlbridge calls for copies, with the real
//! signatures. Copies into pageable host memory complete before the call
//! returns; from pageable host memory the bytes are staged at the call and the
//! DMA stays queued; pinned and device memory is read when the copy runs.

use std::ffi::c_void;

use crate::blocks::{check_copy, place_of};
use crate::capture::CAPTURE_UNSUPPORTED;
use crate::driver::stream_in_context;
use crate::timeline::{run_all_of, StreamKey, Work};
use crate::*;

const CU_MEMORYTYPE_HOST: u32 = 1;
const CU_MEMORYTYPE_DEVICE: u32 = 2;
const CU_MEMORYTYPE_UNIFIED: u32 = 4;
/// `CU_DEVICE_ATTRIBUTE_MAX_PITCH` of current GPUs.
const MAX_PITCH: usize = i32::MAX as usize;

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
            with_state(|s| s.execute(&Work::Copies(vec![(dst as usize, src as usize, len)])));
        } else {
            // SAFETY: `len` readable bytes of the caller's host buffer.
            let bytes = unsafe { std::slice::from_raw_parts(src.cast::<u8>(), len) }.to_vec();
            with_state(|s| s.enqueue(legacy, Work::Staged { dst: dst as usize, bytes }, Vec::new()))?;
        }
        log(Kind::CopyHostToDevice, 0, len as i64);
        Ok(())
    })())
}

/// From pinned memory, read when the copy runs (dlbridge must not reuse the
/// source before); from pageable memory, staged at the call. Not allowed from
/// pageable memory inside a capture.
#[no_mangle]
pub extern "C" fn cuMemcpyHtoDAsync_v2(dst: u64, src: *const c_void, len: usize, stream: usize) -> CuResult {
    result((|| {
        let (_, key) = stream_in_context(stream)?;
        check_copy(dst as usize, src as usize, len, false, true)?;
        let pinned = is_pinned(src as usize);
        let work = if pinned {
            Work::Copies(vec![(dst as usize, src as usize, len)])
        } else {
            // SAFETY: `len` readable bytes of the caller's host buffer.
            Work::Staged { dst: dst as usize, bytes: unsafe { std::slice::from_raw_parts(src.cast::<u8>(), len) }.to_vec() }
        };
        with_state(|s| {
            s.check_legacy_use(key, false)?;
            if !pinned && s.queue(key).capture.is_some() {
                return Err(CAPTURE_UNSUPPORTED);
            }
            s.enqueue(key, work, Vec::new())
        })?;
        log(Kind::CopyHostToDevice, stream as i64, len as i64);
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
