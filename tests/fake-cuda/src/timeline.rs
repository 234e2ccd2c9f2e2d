//! Streams as queues of work that completes only when something makes it
//! complete: a host synchronisation, a wait that is itself reached, or (for
//! tests) an explicit run. Each queued op carries the positions of other
//! queues it must follow (event waits, and the legacy stream's implicit
//! synchronisation with blocking streams); running a queue runs those first.

use std::collections::VecDeque;
use std::ffi::c_void;

use crate::*;

/// Which stream of a device.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) enum Lane {
    /// `CU_STREAM_LEGACY` (1), and NULL.
    Legacy,
    /// `CU_STREAM_PER_THREAD` (2) of this thread.
    PerThread(u64),
    /// A stream a test created (its serial number; handles may be reused).
    Created(u64),
}

/// One stream of one device.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) struct StreamKey {
    pub(crate) device: i64,
    pub(crate) lane: Lane,
}

/// `CUhostFn`.
pub(crate) type HostFn = extern "C" fn(*mut c_void);

#[derive(Clone)]
pub(crate) enum Work {
    /// Only its dependencies (a wait on an event).
    Nothing,
    /// `(dst, src, len)` copies, read from the source when they run.
    Copies(Vec<(usize, usize, usize)>),
    /// Bytes staged by the host at the call (a pageable host-to-device copy).
    Staged { dst: usize, bytes: Vec<u8> },
    /// A test kernel writing `count` f32 values.
    Fill { dst: usize, count: usize, value: f32 },
    /// A host function, run on a thread of its own as the driver does.
    Host { func: HostFn, arg: usize },
    /// A kernel launched with `cuLaunchKernel` (see `modules.rs`).
    Kernel(crate::modules::Launch),
    /// A stream-ordered free (`cuMemFreeAsync`): the block is free from here on.
    Release { ptr: usize, size: usize, place: Place },
}

impl Work {
    /// The bytes it reads or writes: `(address, len)`.
    fn touches(&self) -> Vec<(usize, usize)> {
        match self {
            Work::Nothing | Work::Host { .. } | Work::Release { .. } => Vec::new(),
            Work::Copies(copies) => copies.iter().flat_map(|&(dst, src, len)| [(dst, len), (src, len)]).collect(),
            Work::Staged { dst, bytes } => vec![(*dst, bytes.len())],
            Work::Fill { dst, count, .. } => vec![(*dst, count.saturating_mul(4))],
            Work::Kernel(launch) => launch.touches(),
        }
    }
}

struct Op {
    /// (queue, length it must have completed) before this op runs.
    deps: Vec<(StreamKey, u64)>,
    work: Work,
}

pub(crate) struct Queue {
    /// Waits for the legacy stream and is waited for by it.
    blocking: bool,
    pending: VecDeque<Op>,
    /// Ops completed.
    pub(crate) done: u64,
    /// A host function of this queue runs now, outside the lock.
    running: bool,
    /// The capture sequence its work goes to instead.
    pub(crate) capture: Option<u64>,
}

impl Queue {
    fn new(blocking: bool) -> Self {
        Queue { blocking, pending: VecDeque::new(), done: 0, running: false, capture: None }
    }

    /// Ops ever queued.
    pub(crate) fn len(&self) -> u64 {
        self.done + self.pending.len() as u64
    }

    pub(crate) fn is_blocking(&self) -> bool {
        self.blocking
    }
}

impl State {
    /// The queue of `key`, made on first use for the two default streams.
    pub(crate) fn queue(&mut self, key: StreamKey) -> &mut Queue {
        self.queues.entry(key).or_insert_with(|| Queue::new(!matches!(key.lane, Lane::Legacy)))
    }

    /// Queues `work` on `key` after `deps`, and after what the legacy
    /// stream's implicit synchronisation adds; captured instead while `key`
    /// is being captured.
    pub(crate) fn enqueue(&mut self, key: StreamKey, work: Work, mut deps: Vec<(StreamKey, u64)>) -> Result<(), CuResult> {
        if let Some(id) = self.queue(key).capture {
            return self.capture_work(id, work);
        }
        let legacy = StreamKey { device: key.device, lane: Lane::Legacy };
        if key.lane == Lane::Legacy {
            for (&other, q) in &self.queues {
                if other != key && other.device == key.device && q.blocking && q.capture.is_none() && q.len() > q.done {
                    deps.push((other, q.len()));
                }
            }
        } else if self.queue(key).blocking {
            let l = self.queue(legacy);
            if l.len() > l.done {
                let at = l.len();
                deps.push((legacy, at));
            }
        }
        self.queue(key).pending.push_back(Op { deps, work });
        Ok(())
    }

    /// The queue a stream handle names, with this thread's context current:
    /// 1 (and NULL) the legacy stream, 2 this thread's per-thread stream, else
    /// a live stream a test created for this device (INVALID_HANDLE otherwise:
    /// a driver would dereference it).
    pub(crate) fn resolve(&mut self, handle: usize, device: i64) -> Result<StreamKey, CuResult> {
        match self.resolve_any(handle, device)? {
            key if key.device == device => Ok(key),
            _ => Err(INVALID_HANDLE),
        }
    }

    /// [`resolve`](Self::resolve), where a created stream of another device
    /// will do: a created stream carries its own context, so that a stream may
    /// wait for an event whatever context is current.
    pub(crate) fn resolve_any(&mut self, handle: usize, device: i64) -> Result<StreamKey, CuResult> {
        let lane = match handle {
            0 | 1 => Lane::Legacy,
            2 => Lane::PerThread(thread_id()),
            _ => return self.handles.get(&handle).copied().flatten().ok_or(INVALID_HANDLE),
        };
        Ok(StreamKey { device, lane })
    }

    /// Runs `key` under the lock up to `target` ops, and what they depend on,
    /// stopping at a host function (which the caller runs outside the lock).
    fn advance(&mut self, key: StreamKey, target: u64) -> Step {
        let mut stack = vec![(key, target)];
        while let Some(&(k, t)) = stack.last() {
            let q = self.queue(k);
            if q.done >= t {
                stack.pop();
                continue;
            }
            if q.running {
                return Step::Busy;
            }
            let Some(op) = q.pending.front() else {
                stack.pop();
                continue;
            };
            let deps = op.deps.clone();
            if let Some(&dep) = deps.iter().find(|&&(d, n)| self.queues.get(&d).is_some_and(|q| q.done < n)) {
                stack.push(dep);
                continue;
            }
            let q = self.queue(k);
            if let Some(Op { work: Work::Host { func, arg }, .. }) = q.pending.front() {
                let (func, arg) = (*func, *arg);
                q.running = true;
                return Step::Host(k, func, arg);
            }
            if let Some(op) = q.pending.pop_front() {
                q.done += 1;
                self.execute(&op.work);
            }
        }
        Step::Done
    }
}

enum Step {
    Done,
    /// Another thread runs a host function this queue waits for.
    Busy,
    Host(StreamKey, HostFn, usize),
}

impl State {
    /// Carries out one op's work on the memory, counting each op that touches
    /// a freed block (which it still writes: on a GPU that block may belong to
    /// another allocation by then).
    pub(crate) fn execute(&mut self, work: &Work) {
        if work.touches().iter().any(|&(start, len)| self.touches_freed(start, len)) {
            self.uses_after_free += 1;
        }
        match work {
            Work::Nothing | Work::Host { .. } => {}
            Work::Release { ptr, size, place } => self.release(*ptr, *size, *place),
            Work::Copies(copies) => {
                for &(dst, src, len) in copies {
                    // SAFETY: checked against known memory when queued; a freed
                    // block is never returned to the host allocator, and tests
                    // keep registered memory alive until `fake_cuda_forget_registered`
                    // has run everything.
                    unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len) };
                }
            }
            Work::Staged { dst, bytes } => {
                // SAFETY: as above, for the destination.
                unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), *dst as *mut u8, bytes.len()) };
            }
            Work::Fill { dst, count, value } => {
                for i in 0..*count {
                    // SAFETY: as above.
                    unsafe { (*dst as *mut f32).add(i).write_unaligned(*value) };
                }
            }
            Work::Kernel(launch) => launch.run(),
        }
    }
}

/// Completes the work queued on `key` up to `target` ops, with what it
/// depends on. Host functions run on a thread of their own, with the fake's
/// lock released (they may need the GIL, which another caller may hold).
pub(crate) fn run_to(key: StreamKey, target: u64) {
    loop {
        match with_state(|s| s.advance(key, target)) {
            Step::Done => return,
            Step::Busy => std::thread::sleep(std::time::Duration::from_millis(1)),
            Step::Host(k, func, arg) => {
                let _ = std::thread::spawn(move || func(arg as *mut c_void)).join();
                with_state(|s| {
                    let q = s.queue(k);
                    q.pending.pop_front();
                    q.done += 1;
                    q.running = false;
                });
            }
        }
    }
}

/// Completes everything queued on `key` so far.
pub(crate) fn run_all_of(key: StreamKey) {
    let target = with_state(|s| s.queue(key).len());
    run_to(key, target);
}

/// Completes everything queued on `device` (what `cuCtxSynchronize` waits for).
pub(crate) fn run_device(device: i64) {
    let keys: Vec<StreamKey> = with_state(|s| s.queues.keys().copied().filter(|k| k.device == device).collect());
    for key in keys {
        run_all_of(key);
    }
}

/// Completes everything queued anywhere.
pub(crate) fn run_everything() {
    for device in 0..DEVICES {
        run_device(device);
    }
}

/// A stream handle as tests name it: (device, handle), resolved as the driver
/// would with that device's context current.
fn test_stream(device: i64, handle: usize) -> Result<StreamKey, CuResult> {
    if !(0..DEVICES).contains(&device) {
        return Err(INVALID_DEVICE);
    }
    with_state(|s| s.resolve(handle, device))
}

// --- test hooks ------------------------------------------------------------------------------

/// A new stream of `device`, non-blocking (`CU_STREAM_NON_BLOCKING`) or
/// blocking; its handle (a destroyed one may come back).
#[no_mangle]
pub extern "C" fn fake_cuda_stream_create(device: i64, non_blocking: bool) -> usize {
    with_state(|s| {
        let serial = s.next_serial;
        s.next_serial += 1;
        let handle = s.free_handles.pop().unwrap_or(0x5000 + 0x10 * serial as usize);
        let key = StreamKey { device, lane: Lane::Created(serial) };
        s.queues.insert(key, Queue::new(!non_blocking));
        s.handles.insert(handle, Some(key));
        handle
    })
}

/// Destroys a stream: its queued work still completes, its handle is dead
/// (INVALID_HANDLE) until handed out again.
#[no_mangle]
pub extern "C" fn fake_cuda_stream_destroy(handle: usize) -> CuResult {
    with_state(|s| match s.handles.get_mut(&handle) {
        Some(live @ Some(_)) => {
            *live = None;
            s.free_handles.push(handle);
            SUCCESS
        }
        _ => INVALID_HANDLE,
    })
}

/// Queues a test kernel on a stream that writes `count` f32 `value`s at `dst`.
#[no_mangle]
pub extern "C" fn fake_cuda_launch_fill(device: i64, stream: usize, dst: usize, count: usize, value: f32) -> CuResult {
    result((|| {
        let key = test_stream(device, stream)?;
        with_state(|s| s.enqueue(key, Work::Fill { dst, count, value }, Vec::new()))
    })())
}

/// Queues a test kernel on a stream that copies `len` bytes from `src` to `dst`.
#[no_mangle]
pub extern "C" fn fake_cuda_launch_copy(device: i64, stream: usize, dst: usize, src: usize, len: usize) -> CuResult {
    result((|| {
        let key = test_stream(device, stream)?;
        with_state(|s| s.enqueue(key, Work::Copies(vec![(dst, src, len)]), Vec::new()))
    })())
}

/// Queues a host function on a stream (`cuLaunchHostFunc`): it runs, on a
/// thread of its own, when the stream's work before it is done and something
/// makes the stream run.
#[no_mangle]
pub extern "C" fn fake_cuda_launch_host_func(device: i64, stream: usize, func: HostFn, arg: usize) -> CuResult {
    result((|| {
        let key = test_stream(device, stream)?;
        with_state(|s| s.enqueue(key, Work::Host { func, arg }, Vec::new()))
    })())
}

/// Makes `consumer` wait for what is queued on `producer` now (an event
/// recorded and waited for, as a producer's `__dlpack__` does).
#[no_mangle]
pub extern "C" fn fake_cuda_stream_wait_stream(device: i64, consumer: usize, producer: usize) -> CuResult {
    result((|| {
        let (c, p) = (test_stream(device, consumer)?, test_stream(device, producer)?);
        with_state(|s| {
            let at = s.queue(p).len();
            s.enqueue(c, Work::Nothing, vec![(p, at)])
        })
    })())
}

/// Completes the work queued on a stream so far (and what it waits for).
#[no_mangle]
pub extern "C" fn fake_cuda_run(device: i64, stream: usize) -> CuResult {
    match test_stream(device, stream) {
        Ok(key) => {
            run_all_of(key);
            SUCCESS
        }
        Err(code) => code,
    }
}

/// Completes everything queued on every stream.
#[no_mangle]
pub extern "C" fn fake_cuda_run_all() {
    run_everything();
}

/// Ops queued on a stream and not yet completed.
#[no_mangle]
pub extern "C" fn fake_cuda_pending(device: i64, stream: usize) -> u64 {
    test_stream(device, stream).map_or(0, |key| with_state(|s| {
        let q = s.queue(key);
        q.len() - q.done
    }))
}
