//! Ordering a consumer's stream after the data's: an event recorded on the
//! stream the data is ready on and waited for by the consumer's, without
//! blocking the host. Capture-aware: inside a CUDA graph capture, work queued
//! outside the graph is waited for by the host instead (a graph cannot wait on
//! an event recorded outside it without CU_EVENT_WAIT_EXTERNAL, and would keep
//! referring to it at every replay), so nothing of it enters the graph.
//!
//! [`ReadyEvent`] is such an event kept by dlbridge: a stream handle a caller
//! names is valid for that call only (CuPy and numba destroy their streams
//! when collected, and the per-thread stream 2 is another stream in each
//! thread), so what is pending on it is marked with an event instead.

use core::ffi::c_uint;

use super::{capturing, check, host_side, in_context, stream_handle, Api, CuResult, Handle};
use crate::error::Error;
use crate::streams::SyncPlan;
use crate::Device;

const CU_EVENT_DISABLE_TIMING: c_uint = 2;
const CUDA_ERROR_CAPTURED_EVENT: CuResult = 907;

/// An event of the current context, destroyed when dropped (the driver
/// releases it once the waits queued on it complete).
struct Event<'a> {
    api: &'a Api,
    handle: Handle,
}

impl<'a> Event<'a> {
    fn create(api: &'a Api) -> Result<Self, Error> {
        let mut handle = core::ptr::null_mut();
        // SAFETY: creates an event in the current context, with a writable out value.
        check("cuEventCreate", unsafe { (api.event_create)(&mut handle, CU_EVENT_DISABLE_TIMING) })?;
        Ok(Event { api, handle })
    }

    /// # Safety
    /// `stream` is 1, 2 or a live stream of the current context.
    unsafe fn record(&self, stream: i64) -> Result<(), Error> {
        // SAFETY: forwarded from the caller.
        check("cuEventRecord", unsafe { (self.api.event_record)(self.handle, stream_handle(stream)) })
    }
}

impl Drop for Event<'_> {
    fn drop(&mut self) {
        // SAFETY: created by `create`, destroyed once.
        let _ = unsafe { (self.api.event_destroy)(self.handle) };
    }
}

/// Work recorded in a capture exists only in its graph: while the capture
/// runs, nothing outside it can wait for that work (a clear error); once it
/// has ended, the graph's launches are ordered by whoever launches them, and
/// dlbridge has nothing to wait for.
fn outside_a_running_capture(api: &Api, event: Handle, waiter: &str) -> Result<(), Error> {
    // SAFETY: a query of an event of the current context.
    match host_side(api, || unsafe { (api.event_query)(event) }) {
        CUDA_ERROR_CAPTURED_EVENT => Err(Error::StreamCapture {
            reason: format!(
                "the data is written inside a CUDA graph being captured, and {waiter} is outside that capture; \
                 pass the capturing stream (stream=), or use the data after the graph has run"
            ),
        }),
        _ => Ok(()),
    }
}

/// Makes `consumer` wait for `event` (recorded in a capture when `captured`):
/// on the GPU, or, for a capturing consumer and an event recorded outside its
/// capture, by the host (see [`outside_a_running_capture`] for the other way).
///
/// # Safety
/// `consumer` is 1, 2 or a live stream of the current context.
unsafe fn hand_over(api: &Api, event: Handle, captured: bool, consumer: i64) -> Result<(), Error> {
    let consumer_capturing = capturing(api, consumer)?;
    match (captured, consumer_capturing) {
        (true, false) => outside_a_running_capture(api, event, &format!("stream {consumer}")),
        (false, true) => {
            // SAFETY: an event of the current context, recorded outside any capture.
            host_side(api, || check("cuEventSynchronize", unsafe { (api.event_synchronize)(event) }))
        }
        // SAFETY: the caller's stream and an event of the current context.
        _ => check("cuStreamWaitEvent", unsafe { (api.stream_wait_event)(stream_handle(consumer), event, 0) }),
    }
}

/// Makes `consumer` wait for the work queued on `ready` so far, without
/// blocking the host: an event recorded on `ready` and waited on by
/// `consumer`. Inside a capture, work outside it is waited for by the host
/// instead (see the module documentation).
///
/// # Safety
/// Each stream value is 1 (legacy default), 2 (per-thread default) or the
/// handle of a live stream of device `device_id`: the driver dereferences it.
pub unsafe fn order_streams(device_id: i32, ready: i64, consumer: i64) -> Result<(), Error> {
    in_context(device_id, |api| {
        let event = Event::create(api)?;
        // SAFETY: the caller's streams; the event is destroyed once the wait is
        // queued: the driver releases it when the wait completes.
        unsafe {
            let captured = capturing(api, ready)?;
            event.record(ready)?;
            hand_over(api, event.handle, captured, consumer)
        }
    })
}

/// Blocks the host until the work queued on `ready` so far is done: for
/// CUDA managed memory that the host is about to read. -1 (unknown) waits for
/// nothing. A stream that captures a graph has nothing the host could wait for.
///
/// # Safety
/// As [`order_streams`], for `ready`.
pub unsafe fn wait_on_host(device_id: i32, ready: i64) -> Result<(), Error> {
    if ready == -1 {
        return Ok(());
    }
    in_context(device_id, |api| {
        if capturing(api, ready)? {
            return Err(Error::StreamCapture {
                reason: format!("the host cannot wait for stream {ready} while it captures a CUDA graph: its work runs only with the graph"),
            });
        }
        // SAFETY: a stream the caller vouches for.
        host_side(api, || check("cuStreamSynchronize", unsafe { (api.stream_synchronize)(stream_handle(ready)) }))
    })
}

/// Carries out a [`SyncPlan`] for memory on `device`.
///
/// # Safety
/// As [`order_streams`], for the plan's streams.
pub unsafe fn carry_out(device: Device, plan: SyncPlan) -> Result<(), Error> {
    match plan {
        SyncPlan::Nothing => Ok(()),
        // SAFETY: forwarded from the caller.
        SyncPlan::Wait { ready, consumer } => unsafe { order_streams(device.device_id, ready, consumer) },
    }
}

/// An event dlbridge recorded and keeps: it marks the work queued on a stream
/// when it was recorded, so that later consumers can be ordered after that
/// work without the stream's handle. Destroyed in its context when dropped.
#[derive(Debug)]
pub struct ReadyEvent {
    handle: usize,
    device_id: i32,
    /// Recorded on a stream that was capturing a graph.
    captured: bool,
}

impl ReadyEvent {
    /// Records an event on `stream` of device `device_id`.
    ///
    /// # Safety
    /// `stream` is 1, 2 or the handle of a live stream of that device, for this call only.
    pub unsafe fn record(device_id: i32, stream: i64) -> Result<Self, Error> {
        in_context(device_id, |api| {
            let event = Event::create(api)?;
            // SAFETY: the caller's stream, of the current context.
            let captured = unsafe {
                let captured = capturing(api, stream)?;
                event.record(stream)?;
                captured
            };
            let handle = core::mem::ManuallyDrop::new(event).handle as usize;
            Ok(ReadyEvent { handle, device_id, captured })
        })
    }

    /// Makes `consumer` wait for the recorded work (see [`order_streams`] for captures).
    ///
    /// # Safety
    /// `consumer` is 1, 2 or the handle of a live stream of the event's device.
    pub unsafe fn order_before(&self, consumer: i64) -> Result<(), Error> {
        in_context(self.device_id, |api| {
            // SAFETY: the caller's stream, and this event of the current context.
            unsafe { hand_over(api, core::ptr::without_provenance_mut(self.handle), self.captured, consumer) }
        })
    }

    /// Blocks the host until the recorded work is done.
    pub fn wait_on_host(&self) -> Result<(), Error> {
        in_context(self.device_id, |api| {
            let event = core::ptr::without_provenance_mut(self.handle);
            if self.captured {
                return outside_a_running_capture(api, event, "the host");
            }
            // SAFETY: this event, of the current context.
            host_side(api, || check("cuEventSynchronize", unsafe { (api.event_synchronize)(event) }))
        })
    }
}

impl Drop for ReadyEvent {
    fn drop(&mut self) {
        let handle = self.handle;
        // SAFETY: recorded by `record`, destroyed once, in its own context.
        let _ = in_context(self.device_id, |api| check("cuEventDestroy", unsafe { (api.event_destroy)(core::ptr::without_provenance_mut(handle)) }));
    }
}
