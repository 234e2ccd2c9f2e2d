//! Freeing the memory dlbridge allocated without a host wait on the freeing
//! thread (which may be a torch or JAX deleter holding the GIL), and never
//! before the GPU work that dlbridge knows uses it.
//!
//! Every free is ordered on the legacy default stream, the one stream whose
//! handle stays valid for the whole process: the legacy stream first waits for
//! the events of work dlbridge queued on the memory elsewhere (a copy on a
//! consumer's stream, a kernel's writes that [`Empty::written_on`] noted), and
//! the driver orders it after every blocking stream's work too. Then:
//! - pool memory is freed by `cuMemFreeAsync` on the legacy stream, at once;
//! - memory from `cuMemAlloc`, `cuMemAllocManaged` or `cuMemAllocHost`, which
//!   the driver frees only synchronously, gets an event recorded on the legacy
//!   stream there, and a thread of dlbridge's ("dlbridge-cuda-free") waits for
//!   that event (`cuEventSynchronize`, a documented synchronisation) before
//!   freeing it. Nothing relies on the free's own implicit synchronisation,
//!   which the driver only says it *may* do.
//!
//! While a blocking stream of the context captures a CUDA graph the legacy
//! stream cannot be used at all: the free is then handed to the thread, which
//! tries again until the capture has ended.
//!
//! What dlbridge cannot see is work a consumer queued on a non-blocking stream
//! of its own after taking the memory (torch's side streams, CuPy's
//! non-blocking streams): as for torch's own memory (`record_stream`), such a
//! consumer keeps the tensor alive until that work is done (README, CUDA).
//!
//! [`Empty::written_on`]: super::Empty::written_on

use core::ffi::c_uint;
use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::Duration;

use super::{capturing, check, host_side, in_context, stream_handle, Api, DevicePtr, LEGACY};
use crate::error::Error;

const CU_EVENT_DISABLE_TIMING: c_uint = 2;

/// What is freed.
#[derive(Clone, Copy)]
pub(super) enum Block {
    /// Device or managed memory; `pooled` from `cuMemAllocAsync`.
    Device { ptr: DevicePtr, pooled: bool },
    /// Page-locked host memory from `cuMemAllocHost`.
    Pinned(usize),
}

/// A free on its way.
struct Deferred {
    block: Block,
    device_id: i32,
    /// Events the legacy stream must still wait for.
    writers: Vec<usize>,
    /// Recorded on the legacy stream after those waits: the thread frees once it completes.
    fence: Option<usize>,
}

/// An event recorded on `stream` of the current context, owned by the caller.
///
/// # Safety
/// `stream` is 1, 2 or a live stream of the current context.
pub(super) unsafe fn record(api: &Api, stream: i64) -> Result<usize, Error> {
    let mut event = core::ptr::null_mut();
    // SAFETY: creates an event of the current context, with a writable out value.
    check("cuEventCreate", unsafe { (api.event_create)(&mut event, CU_EVENT_DISABLE_TIMING) })?;
    // SAFETY: the caller's stream, and the event just created.
    if let Err(err) = check("cuEventRecord", unsafe { (api.event_record)(event, stream_handle(stream)) }) {
        // SAFETY: the event just created, destroyed once.
        unsafe { (api.event_destroy)(event) };
        return Err(err);
    }
    Ok(event as usize)
}

fn handle(event: usize) -> super::Handle {
    core::ptr::without_provenance_mut(event)
}

/// Frees `block` of device `device_id` after the work it may still be used
/// by (see the module documentation), without a host wait on this thread.
pub(super) fn free(block: Block, device_id: i32, writers: Vec<usize>) {
    let mut item = Deferred { block, device_id, writers, fence: None };
    match order(&mut item) {
        Ok(true) => {}
        Ok(false) | Err(Error::StreamCapture { .. }) => hand_over(item),
        // The context was reset, its memory with it; or a driver error: nothing
        // more can be done with this block.
        Err(_) => {}
    }
}

/// Orders the free on the legacy stream after `item`'s writers: pool memory is
/// then freed (true); other memory gets its fence (false) for the thread.
fn order(item: &mut Deferred) -> Result<bool, Error> {
    in_context(item.device_id, |api| {
        // A StreamCapture error while a blocking stream captures (the query
        // does not disturb the capture).
        capturing(api, LEGACY)?;
        while let Some(&event) = item.writers.last() {
            // SAFETY: an event of this context, recorded by `record`, waited on
            // by the legacy stream, then destroyed (the driver keeps it until
            // the wait completes).
            unsafe {
                check("cuStreamWaitEvent", (api.stream_wait_event)(stream_handle(LEGACY), handle(event), 0))?;
                (api.event_destroy)(handle(event));
            }
            item.writers.pop();
        }
        match (item.block, api.mem_free_async) {
            (Block::Device { ptr, pooled: true }, Some(free_async)) => {
                // SAFETY: pool memory of this context, freed once, in the legacy
                // stream's order (after the waits just queued).
                check("cuMemFreeAsync", unsafe { free_async(ptr, stream_handle(LEGACY)) })?;
                Ok(true)
            }
            _ => {
                // SAFETY: the legacy stream of the current context.
                item.fence = Some(unsafe { record(api, LEGACY) }?);
                Ok(false)
            }
        }
    })
}

/// Waits for `item`'s fence, then frees it: on the release thread.
fn finish(item: Deferred) -> Result<(), Error> {
    let Some(fence) = item.fence else { return Ok(()) };
    in_context(item.device_id, |api| {
        host_side(api, || {
            // SAFETY: the fence event of this context, recorded by `order`,
            // waited for and destroyed once; then the block, allocated in this
            // context and used by no work that the fence does not follow, freed once.
            unsafe {
                let waited = check("cuEventSynchronize", (api.event_synchronize)(handle(fence)));
                (api.event_destroy)(handle(fence));
                waited?;
                match item.block {
                    Block::Device { ptr, .. } => check("cuMemFree", (api.mem_free)(ptr)),
                    Block::Pinned(ptr) => check("cuMemFreeHost", (api.mem_free_host)(core::ptr::with_exposed_provenance_mut(ptr))),
                }
            }
        })
    })
}

/// The frees waiting for the thread, and how many it is working on.
struct Queue {
    items: VecDeque<Deferred>,
    busy: usize,
    started: bool,
}

static QUEUE: Mutex<Queue> = Mutex::new(Queue { items: VecDeque::new(), busy: 0, started: false });
static CHANGED: Condvar = Condvar::new();

fn hand_over(item: Deferred) {
    let mut queue = QUEUE.lock().unwrap_or_else(PoisonError::into_inner);
    if !queue.started {
        let spawned = std::thread::Builder::new().name("dlbridge-cuda-free".into()).spawn(work);
        if spawned.is_err() {
            // No thread: the free waits here, as a driver's own free would.
            drop(queue);
            let _ = process(item);
            return;
        }
        queue.started = true;
    }
    queue.items.push_back(item);
    CHANGED.notify_all();
}

/// One step of a free: ordered (if it was not yet), then finished. `Err` gives
/// the item back when the legacy stream cannot be used yet.
fn process(mut item: Deferred) -> Result<(), Deferred> {
    if item.fence.is_none() {
        match order(&mut item) {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(Error::StreamCapture { .. }) => return Err(item),
            Err(_) => return Ok(()),
        }
    }
    // A reset context took the memory with it; a failed free cannot be retried.
    let _ = finish(item);
    Ok(())
}

/// The release thread: frees what is handed to it, in order; retries, a little
/// later, frees that a graph capture holds up.
fn work() {
    loop {
        let item = {
            let mut queue = QUEUE.lock().unwrap_or_else(PoisonError::into_inner);
            while queue.items.is_empty() {
                queue = CHANGED.wait(queue).unwrap_or_else(PoisonError::into_inner);
            }
            queue.busy += 1;
            queue.items.pop_front()
        };
        let retry = item.and_then(|item| process(item).err());
        let mut queue = QUEUE.lock().unwrap_or_else(PoisonError::into_inner);
        queue.busy -= 1;
        let held_up = retry.is_some();
        if let Some(item) = retry {
            queue.items.push_back(item);
        }
        CHANGED.notify_all();
        drop(queue);
        if held_up {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Waits (up to two seconds: a free a capture holds up may wait longer) until
/// the release thread has freed what it was given: before an allocation that
/// ran out of memory tries again.
pub(super) fn drain() {
    super::blocking(|| {
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        let mut queue = QUEUE.lock().unwrap_or_else(PoisonError::into_inner);
        while !(queue.items.is_empty() && queue.busy == 0) {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            queue = CHANGED.wait_timeout(queue, left).unwrap_or_else(PoisonError::into_inner).0;
        }
    });
}
