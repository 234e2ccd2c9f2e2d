//! Stream capture, as the CUDA Programming Guide describes it: work queued on
//! a capturing stream is kept for a graph instead of running; a stream that
//! waits on an event recorded in the capture joins it; waiting on an event
//! recorded outside needs CU_EVENT_WAIT_EXTERNAL; the legacy stream cannot be
//! used while a blocking stream of its context captures; and "potentially
//! unsafe" calls (allocations, frees, synchronisations, queries) invalidate a
//! capture whose mode forbids them, unless the calling thread's own capture
//! mode is relaxed (`cuThreadExchangeStreamCaptureMode`). An event recorded in
//! a capture cannot be queried or waited for from outside while the capture
//! runs; once it has ended, it counts as never recorded.

use std::cell::Cell;

use crate::timeline::{run_all_of, Lane, StreamKey, Work};
use crate::*;

pub(crate) const CAPTURE_UNSUPPORTED: CuResult = 900;
pub(crate) const CAPTURE_INVALIDATED: CuResult = 901;
pub(crate) const CAPTURE_MERGE: CuResult = 902;
pub(crate) const CAPTURE_ISOLATION: CuResult = 905;
pub(crate) const CAPTURE_IMPLICIT: CuResult = 906;
pub(crate) const CAPTURED_EVENT: CuResult = 907;

/// `CU_STREAM_CAPTURE_MODE_*`.
pub(crate) const MODE_GLOBAL: u32 = 0;
pub(crate) const MODE_RELAXED: u32 = 2;
/// `CU_EVENT_WAIT_EXTERNAL`.
pub(crate) const WAIT_EXTERNAL: u32 = 1;

thread_local! {
    /// This thread's capture interaction mode.
    pub(crate) static THREAD_MODE: Cell<u32> = const { Cell::new(MODE_GLOBAL) };
}

/// What a graph holds, in capture order.
#[derive(Clone)]
pub(crate) enum Node {
    Work(Work),
    /// A wait on an event recorded outside the capture (CU_EVENT_WAIT_EXTERNAL):
    /// at each launch, the event's latest record is waited for.
    ExternalWait(i64),
}

pub(crate) struct Capture {
    origin: StreamKey,
    mode: u32,
    thread: u64,
    invalidated: bool,
    nodes: Vec<Node>,
}

impl State {
    pub(crate) fn capture_work(&mut self, id: u64, work: Work) -> Result<(), CuResult> {
        match self.captures.get_mut(&id) {
            Some(c) if !c.invalidated => {
                c.nodes.push(Node::Work(work));
                Ok(())
            }
            _ => Err(CAPTURE_INVALIDATED),
        }
    }

    pub(crate) fn capture_external_wait(&mut self, id: u64, event: i64) -> Result<(), CuResult> {
        match self.captures.get_mut(&id) {
            Some(c) if !c.invalidated => {
                c.nodes.push(Node::ExternalWait(event));
                Ok(())
            }
            _ => Err(CAPTURE_INVALIDATED),
        }
    }

    pub(crate) fn invalidate(&mut self, id: u64) {
        if let Some(c) = self.captures.get_mut(&id) {
            c.invalidated = true;
        }
    }

    /// The active captures of `device` on blocking streams.
    fn blocking_captures(&self, device: i64) -> Vec<u64> {
        let mut ids: Vec<u64> = self
            .queues
            .iter()
            .filter(|(k, q)| k.device == device && q.is_blocking() && k.lane != Lane::Legacy)
            .filter_map(|(_, q)| q.capture)
            .filter(|id| self.captures.get(id).is_some_and(|c| !c.invalidated))
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// The legacy stream may not be used while a blocking stream of its
    /// context captures: CAPTURE_IMPLICIT, and the capture is invalidated
    /// unless `query` (`cuStreamIsCapturing` only reports it).
    pub(crate) fn check_legacy_use(&mut self, key: StreamKey, query: bool) -> Result<(), CuResult> {
        if key.lane != Lane::Legacy {
            return Ok(());
        }
        let ids = self.blocking_captures(key.device);
        if ids.is_empty() {
            return Ok(());
        }
        if !query {
            for id in ids {
                self.invalidate(id);
            }
        }
        Err(CAPTURE_IMPLICIT)
    }

    /// A potentially unsafe call from this thread: CAPTURE_UNSUPPORTED, with
    /// the captures that forbid it invalidated, unless this thread's mode is
    /// relaxed or no capture forbids it (its own, unless relaxed; another
    /// thread's global one, when this thread's mode is global).
    pub(crate) fn check_unsafe_call(&mut self) -> Result<(), CuResult> {
        let mode = THREAD_MODE.with(Cell::get);
        if mode == MODE_RELAXED {
            return Ok(());
        }
        let me = thread_id();
        let forbidding: Vec<u64> = self
            .captures
            .iter()
            .filter(|(_, c)| !c.invalidated)
            .filter(|(_, c)| (c.thread == me && c.mode != MODE_RELAXED) || (mode == MODE_GLOBAL && c.thread != me && c.mode == MODE_GLOBAL))
            .map(|(&id, _)| id)
            .collect();
        if forbidding.is_empty() {
            return Ok(());
        }
        for id in forbidding {
            self.invalidate(id);
        }
        Err(CAPTURE_UNSUPPORTED)
    }

    /// `cuStreamWaitEvent` under the capture rules.
    pub(crate) fn wait_event(&mut self, key: StreamKey, event: i64, flags: u32) -> Result<(), CuResult> {
        // An event recorded in a capture that has ended was never recorded on a stream.
        let (record, captured) = match self.events.get(&event) {
            Some(e) => (e.record, e.captured.filter(|id| self.captures.contains_key(id))),
            None => return Err(INVALID_HANDLE),
        };
        let waiting = self.queue(key).capture;
        match (captured, waiting) {
            (Some(c), Some(w)) if c == w => Ok(()),
            (Some(_), Some(_)) => Err(CAPTURE_MERGE),
            // The legacy stream cannot be captured.
            (Some(c), None) if key.lane == Lane::Legacy => {
                self.invalidate(c);
                Err(CAPTURE_UNSUPPORTED)
            }
            // A stream waiting on a captured event joins the capture (a fork).
            (Some(c), None) => {
                if self.captures.get(&c).is_some_and(|cap| !cap.invalidated) {
                    self.queue(key).capture = Some(c);
                    Ok(())
                } else {
                    Err(CAPTURE_INVALIDATED)
                }
            }
            (None, Some(w)) if flags & WAIT_EXTERNAL != 0 => self.capture_external_wait(w, event),
            (None, Some(w)) => {
                self.invalidate(w);
                Err(CAPTURE_ISOLATION)
            }
            (None, None) => match record {
                Some(dep) => self.enqueue(key, Work::Nothing, vec![dep]),
                None => Ok(()), // never recorded: nothing to wait for
            },
        }
    }

    /// The capture status of a stream: 0 none, 1 active, 2 invalidated.
    pub(crate) fn capture_status(&mut self, key: StreamKey) -> u32 {
        match self.queue(key).capture.and_then(|id| self.captures.get(&id)) {
            None => 0,
            Some(c) if c.invalidated => 2,
            Some(_) => 1,
        }
    }
}

// --- test hooks ------------------------------------------------------------------------------

fn test_stream(device: i64, handle: usize) -> Result<StreamKey, CuResult> {
    if !(0..DEVICES).contains(&device) {
        return Err(INVALID_DEVICE);
    }
    with_state(|s| s.resolve(handle, device))
}

/// This thread's capture mode (0 global, 1 thread-local, 2 relaxed): what a
/// library that calls dlbridge finds afterwards.
#[no_mangle]
pub extern "C" fn fake_cuda_thread_capture_mode() -> u32 {
    THREAD_MODE.with(Cell::get)
}

/// Sets this thread's capture mode, as another library would with
/// `cuThreadExchangeStreamCaptureMode`.
#[no_mangle]
pub extern "C" fn fake_cuda_set_thread_capture_mode(mode: u32) {
    THREAD_MODE.with(|m| m.set(mode));
}

/// `cuStreamBeginCapture` on a stream, by this thread, in `mode` (0 global,
/// 1 thread-local, 2 relaxed). The legacy stream cannot be captured.
#[no_mangle]
pub extern "C" fn fake_cuda_begin_capture(device: i64, stream: usize, mode: u32) -> CuResult {
    result((|| {
        let key = test_stream(device, stream)?;
        if key.lane == Lane::Legacy {
            return Err(CAPTURE_UNSUPPORTED);
        }
        run_all_of(key); // what was queued before the capture is not part of it
        with_state(|s| {
            if s.queue(key).capture.is_some() {
                return Err(CAPTURE_UNSUPPORTED);
            }
            let id = s.next_capture;
            s.next_capture += 1;
            s.captures.insert(id, Capture { origin: key, mode, thread: thread_id(), invalidated: false, nodes: Vec::new() });
            s.queue(key).capture = Some(id);
            Ok(())
        })
    })())
}

/// `cuStreamEndCapture`: the graph's id in `*graph`, or CAPTURE_INVALIDATED.
///
/// # Safety
/// `graph` is writable.
#[no_mangle]
pub unsafe extern "C" fn fake_cuda_end_capture(device: i64, stream: usize, graph: *mut u64) -> CuResult {
    result((|| {
        let key = test_stream(device, stream)?;
        let (id, capture) = with_state(|s| {
            let id = s.queue(key).capture.ok_or(INVALID_VALUE)?;
            let capture = s.captures.remove(&id).ok_or(INVALID_VALUE)?;
            if capture.origin != key {
                s.captures.insert(id, capture);
                return Err(INVALID_VALUE);
            }
            for q in s.queues.values_mut() {
                if q.capture == Some(id) {
                    q.capture = None;
                }
            }
            Ok((id, capture))
        })?;
        if capture.invalidated {
            return Err(CAPTURE_INVALIDATED);
        }
        with_state(|s| s.graphs.insert(id, capture.nodes));
        // SAFETY: the caller's out value.
        unsafe { *graph = id };
        Ok(())
    })())
}

/// The capture status of a stream (0 none, 1 active, 2 invalidated), or -1 for a bad handle.
#[no_mangle]
pub extern "C" fn fake_cuda_capture_status(device: i64, stream: usize) -> i32 {
    match test_stream(device, stream) {
        Ok(key) => with_state(|s| s.capture_status(key)) as i32,
        Err(_) => -1,
    }
}

/// `cuGraphLaunch`: queues the graph's work on a stream. A wait on an outside
/// event the graph holds fails with INVALID_HANDLE once that event is destroyed.
#[no_mangle]
pub extern "C" fn fake_cuda_graph_launch(graph: u64, device: i64, stream: usize) -> CuResult {
    result((|| {
        let key = test_stream(device, stream)?;
        with_state(|s| {
            let nodes = s.graphs.get(&graph).ok_or(INVALID_VALUE)?.clone();
            for node in nodes {
                match node {
                    Node::Work(work) => s.enqueue(key, work, Vec::new())?,
                    Node::ExternalWait(event) => {
                        let record = s.events.get(&event).ok_or(INVALID_HANDLE)?.record;
                        s.enqueue(key, Work::Nothing, record.into_iter().collect())?;
                    }
                }
            }
            Ok(())
        })
    })())
}
