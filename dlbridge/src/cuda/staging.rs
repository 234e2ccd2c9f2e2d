//! Host-to-device copies staged through page-locked buffers that dlbridge
//! keeps: the host copies each piece into a staging buffer and queues its DMA
//! with `cuMemcpyHtoDAsync`, which from pinned memory neither waits for other
//! streams nor for the DMA (the synchronous `cuMemcpyHtoD` from pageable memory
//! first waits for the legacy stream, and even the asynchronous copy from
//! pageable memory "might be synchronous" on newer drivers).
//!
//! Each device has [`BUFFERS`] buffers of [`CHUNK`] bytes, allocated when first
//! needed and kept for the process, used in turn: a buffer is filled again
//! only once the DMA that reads it has run (its event), so a copy larger than
//! them all waits on the host for its own earlier pieces, and a small one waits
//! for nothing.

use core::ffi::c_void;
use std::sync::{Mutex, PoisonError};

use super::buffers::PinnedBuffer;
use super::{capturing, check, release, stream_handle, Api, DevicePtr};
use crate::error::Error;

/// Bytes per staging buffer.
pub(super) const CHUNK: usize = 8 << 20;
/// Staging buffers per device.
pub(super) const BUFFERS: usize = 4;
const CUDA_ERROR_NOT_READY: u32 = 600;

/// A staging buffer and the event recorded after the last DMA that read it.
struct Staging {
    buffer: PinnedBuffer,
    last_read: Option<usize>,
}

struct Ring {
    device_id: i32,
    buffers: Vec<Staging>,
    next: usize,
}

static RINGS: Mutex<Vec<Ring>> = Mutex::new(Vec::new());

/// Waits until the DMA that last read `staging` has run (no call when it has).
fn wait_until_read(api: &Api, staging: &mut Staging) -> Result<(), Error> {
    let Some(event) = staging.last_read.take() else { return Ok(()) };
    let event = core::ptr::without_provenance_mut(event);
    // SAFETY: the event recorded after that DMA, of this context; destroyed once here.
    unsafe {
        let done = match (api.event_query)(event) {
            CUDA_ERROR_NOT_READY => check("cuEventSynchronize", (api.event_synchronize)(event)),
            code => check("cuEventQuery", code),
        };
        (api.event_destroy)(event);
        done
    }
}

/// Copies `len` bytes of host memory at `src` to device memory at `dst` on
/// `stream`, through the staging buffers of `device_id`: queued, not complete,
/// when this returns; the source may be reused at once.
///
/// Runs with the device's context current, through the blocking hook (the
/// host copies and waits here).
///
/// # Safety
/// `src` holds `len` readable bytes, `dst` is device memory of the current
/// context with room for them, usable on `stream` (1, 2 or a live stream of
/// the current context).
pub(super) unsafe fn upload(api: &Api, device_id: i32, dst: DevicePtr, src: usize, len: usize, stream: i64) -> Result<(), Error> {
    if capturing(api, stream)? {
        return Err(Error::StreamCapture {
            reason: format!("cannot copy host memory to a device on stream {stream} while it captures a CUDA graph: the graph would read it at each replay"),
        });
    }
    let mut rings = RINGS.lock().unwrap_or_else(PoisonError::into_inner);
    let at = match rings.iter().position(|r| r.device_id == device_id) {
        Some(at) => at,
        None => {
            rings.push(Ring { device_id, buffers: Vec::new(), next: 0 });
            rings.len() - 1
        }
    };
    let ring = &mut rings[at];
    let mut done = 0;
    while done < len {
        let piece = (len - done).min(CHUNK);
        if ring.buffers.len() <= ring.next {
            ring.buffers.push(Staging { buffer: PinnedBuffer::new(device_id, CHUNK)?, last_read: None });
        }
        let staging = &mut ring.buffers[ring.next];
        wait_until_read(api, staging)?;
        let chunk = staging.buffer.ptr.as_ptr();
        // SAFETY: `piece` readable bytes of the caller's source, into a staging
        // buffer of CHUNK bytes that no DMA reads any more (waited for above).
        unsafe { core::ptr::copy_nonoverlapping(core::ptr::with_exposed_provenance::<u8>(src + done), chunk, piece) };
        // SAFETY: from pinned memory of this context into the caller's device
        // memory, on the caller's stream; the buffer is not touched again until
        // the event recorded after this copy has completed.
        check("cuMemcpyHtoDAsync", unsafe { (api.memcpy_htod_async)(dst + done as DevicePtr, chunk.cast::<c_void>(), piece, stream_handle(stream)) })?;
        // SAFETY: the caller's stream.
        staging.last_read = Some(unsafe { release::record(api, stream) }?);
        ring.next = (ring.next + 1) % BUFFERS;
        done += piece;
    }
    Ok(())
}
