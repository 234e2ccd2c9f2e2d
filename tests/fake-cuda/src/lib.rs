//! A stand-in for `libcuda.so.1`, loaded by dlbridge's CUDA layer on a machine
//! with no GPU. It checks what dlbridge asks of the driver, and it behaves like
//! one where that matters for correctness: work queued on a stream completes
//! only when something makes it complete, so a missing wait leaves stale bytes
//! for the reader, as on a GPU. It proves nothing about a GPU
//! (`bindings/python/tests/gpu` does that on one).
//!
//! What it models:
//! - "Device" memory is host memory. Two devices exist, each with 1 GiB. A copy
//!   must stay inside memory the driver knows: its own allocations, or ranges a
//!   test registers (a producer's device, pinned or managed memory).
//! - Streams are queues ([`timeline`]). Copies, test "kernels" and host
//!   functions run when a synchronisation, or a wait that is itself reached,
//!   needs them. The legacy stream (1) waits for, and is waited for by, every
//!   blocking stream of its context; non-blocking streams wait for nothing;
//!   the per-thread stream (2) is one blocking stream per thread. A synchronous
//!   copy from pageable memory returns with its DMA still queued on the legacy
//!   stream; `cuMemFree` waits for the whole device first.
//! - Streams are created and destroyed by tests; an unknown or destroyed handle
//!   is CUDA_ERROR_INVALID_HANDLE, and a destroyed handle may be handed out again.
//! - Stream capture ([`capture`]): captured work is kept for graph launches;
//!   the legacy stream is unusable while a blocking stream captures; waiting on
//!   an event recorded outside needs CU_EVENT_WAIT_EXTERNAL; unsafe calls
//!   (allocation, frees, synchronisation, queries) invalidate a global capture
//!   unless the calling thread's capture mode is relaxed.
//! - Primary contexts have retain counts and can be reset, after which their
//!   old handles fail with CUDA_ERROR_CONTEXT_IS_DESTROYED. Every call but
//!   `cuInit` fails with CUDA_ERROR_NOT_INITIALIZED before `cuInit`; `cuInit`
//!   can be made to fail, and a copy named by `FAKE_CUDA_STUB` is a toolkit stub.
//! - Modules ([`modules`]) are PTX text, for a CUDA 13.0 driver; a kernel
//!   the fake knows by its entry name runs as Rust on the "device" memory
//!   when its launch, queued on a stream like any work, is reached.
//! - Blocking calls can be slowed (`fake_cuda_set_sync_delay_ms`), so that a test
//!   can see whether the caller let other threads run meanwhile.
//!
//! | file | what |
//! |---|---|
//! | `lib.rs` | the fake's state: memory, contexts, events, the log |
//! | `hooks.rs` | the test hooks for memory, the log, contexts and slow calls |
//! | `timeline.rs` | streams as queues of work, and the test hooks that launch and complete work |
//! | `capture.rs` | stream capture: its rules, graphs, and its test hooks |
//! | `driver.rs` | the driver API functions dlbridge calls: initialisation, contexts, events, streams |
//! | `memory.rs` | the driver API functions dlbridge calls: pointer attributes, allocations, copies |
//! | `modules.rs` | modules from PTX, and launches of the kernels the fake knows |

mod capture;
mod driver;
mod hooks;
mod memory;
mod modules;
mod timeline;

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::Mutex;

use timeline::{Queue, StreamKey};

type CuResult = u32;
const SUCCESS: CuResult = 0;
const INVALID_VALUE: CuResult = 1;
const OUT_OF_MEMORY: CuResult = 2;
const NOT_INITIALIZED: CuResult = 3;
const STUB_LIBRARY: CuResult = 34;
const INVALID_DEVICE: CuResult = 101;
const INVALID_CONTEXT: CuResult = 201;
const INVALID_HANDLE: CuResult = 400;
const NOT_READY: CuResult = 600;
const CONTEXT_IS_DESTROYED: CuResult = 709;

const DEVICES: i64 = 2;
/// What each device, and pinned host memory, can hold.
const CAPACITY: usize = 1 << 30;
/// Where pinned host memory is said to live, in the log.
const PINNED: i64 = -2;
/// Event handles start here, far from stream handles.
const FIRST_EVENT: i64 = 0x7e00_0000;

/// What the log records, one `[kind, a, b, c]` row per successful call; `c`
/// is the device whose context was current.
#[repr(i64)]
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// event, flags
    EventCreate = 1,
    /// event, stream
    EventRecord = 2,
    /// stream, event
    StreamWait = 3,
    /// event
    EventDestroy = 4,
    /// stream
    StreamSync = 5,
    /// stream, bytes
    CopyDeviceToHost = 6,
    /// 0, bytes
    CopyHostToDevice = 7,
    /// stream, bytes
    CopyDeviceToDevice = 8,
    /// address, bytes
    Alloc = 9,
    /// address
    Free = 10,
    /// address, bytes
    AllocHost = 11,
    /// address
    FreeHost = 12,
    /// pointer, device it is on (or -1)
    PointerQuery = 13,
    /// address, bytes (managed memory; freed as `Free`)
    AllocManaged = 14,
    /// event (a host wait)
    EventSync = 15,
    /// stream, bytes (a 2-D copy; its rows only)
    Copy2D = 16,
    /// module, entries
    ModuleLoad = 17,
    /// function, module
    GetFunction = 18,
    /// stream, function
    Launch = 19,
    /// module
    ModuleUnload = 20,
}

/// What a known range of memory is.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Place {
    Device(i64),
    Managed(i64),
    /// Page-locked host memory, allocated with this device's context current.
    Pinned(i64),
}

impl Place {
    fn device(self) -> i64 {
        match self {
            Place::Device(d) | Place::Managed(d) | Place::Pinned(d) => d,
        }
    }
}

/// A device's primary context.
#[derive(Default)]
struct Context {
    retains: u32,
    /// Bumped by a reset: handles of an older generation are destroyed.
    generation: u64,
}

/// An event: where it was last recorded, and in which capture if any.
struct Event {
    device: i64,
    /// The stream and the length of its queue when recorded.
    record: Option<(StreamKey, u64)>,
    /// The capture sequence it was last recorded in.
    captured: Option<u64>,
}

struct State {
    initialized: bool,
    contexts: Vec<Context>,
    next_event: i64,
    events: HashMap<i64, Event>,
    /// Known memory: start -> (length, place), ours or registered.
    memory: HashMap<usize, (usize, Place)>,
    /// Ours only: address -> (layout size, the kind of allocation).
    owned: HashMap<usize, (usize, Kind)>,
    log: Vec<[i64; 4]>,
    /// Whether `cuPointerGetAttribute` needs a current context.
    strict_pointer_queries: bool,
    /// How long each blocking call sleeps.
    sync_delay_ms: u64,
    /// How much longer `cuModuleUnload` sleeps.
    unload_delay_ms: u64,
    queues: HashMap<StreamKey, Queue>,
    /// Stream handles tests created: handle -> its queue, `None` once destroyed.
    handles: HashMap<usize, Option<StreamKey>>,
    /// Destroyed handles, handed out again first (as a driver may).
    free_handles: Vec<usize>,
    next_serial: u64,
    captures: HashMap<u64, capture::Capture>,
    graphs: HashMap<u64, Vec<capture::Node>>,
    next_capture: u64,
    /// Loaded modules and their functions, by handle.
    modules: HashMap<usize, modules::Module>,
    functions: HashMap<usize, modules::Function>,
    next_module: usize,
    /// Module and function handles a context reset destroyed: using one is
    /// undefined on a real driver (the value may name a newer module).
    destroyed_handles: std::collections::HashSet<usize>,
    /// How many calls used such a handle.
    stale_handle_uses: usize,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

thread_local! {
    /// This thread's context stack, innermost last.
    static CONTEXTS: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
    /// This thread's number, for per-thread streams and captures.
    static THREAD: Cell<u64> = const { Cell::new(0) };
}

fn with_state<T>(body: impl FnOnce(&mut State) -> T) -> T {
    let mut guard = STATE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let state = guard.get_or_insert_with(|| State {
        initialized: false,
        contexts: (0..DEVICES).map(|_| Context::default()).collect(),
        next_event: FIRST_EVENT,
        events: HashMap::new(),
        memory: HashMap::new(),
        owned: HashMap::new(),
        log: Vec::new(),
        strict_pointer_queries: false,
        sync_delay_ms: 0,
        unload_delay_ms: 0,
        queues: HashMap::new(),
        handles: HashMap::new(),
        free_handles: Vec::new(),
        next_serial: 1,
        captures: HashMap::new(),
        graphs: HashMap::new(),
        next_capture: 1,
        modules: HashMap::new(),
        functions: HashMap::new(),
        next_module: 1,
        destroyed_handles: std::collections::HashSet::new(),
        stale_handle_uses: 0,
    });
    body(state)
}

/// This thread's number (1, 2, ...), fixed for its life.
fn thread_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    THREAD.with(|t| {
        if t.get() == 0 {
            t.set(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        }
        t.get()
    })
}

fn context_handle(device: i64, generation: u64) -> usize {
    ((device as usize + 1) << 12) | ((generation as usize & 0xff) << 4)
}

/// The device and generation of a context handle, if it is one.
fn parse_context(handle: usize) -> Option<(i64, u64)> {
    let (device, generation) = ((handle >> 12) as i64 - 1, (handle as u64 >> 4) & 0xff);
    ((0..DEVICES).contains(&device) && handle == context_handle(device, generation)).then_some((device, generation))
}

/// The device whose context is current on this thread.
fn current_device() -> Option<i64> {
    CONTEXTS.with(|c| c.borrow().last().and_then(|&h| parse_context(h)).map(|(d, _)| d))
}

/// The current context's device: INVALID_CONTEXT without one, CONTEXT_IS_DESTROYED
/// for a context reset (or released) since its handle was given out.
fn context() -> Result<i64, CuResult> {
    let handle = CONTEXTS.with(|c| c.borrow().last().copied()).ok_or(INVALID_CONTEXT)?;
    let (device, generation) = parse_context(handle).ok_or(INVALID_CONTEXT)?;
    with_state(|s| {
        let context = &s.contexts[device as usize];
        (context.retains > 0 && context.generation & 0xff == generation).then_some(device).ok_or(CONTEXT_IS_DESTROYED)
    })
}

/// NOT_INITIALIZED before a successful `cuInit`.
fn initialized() -> Result<(), CuResult> {
    if with_state(|s| s.initialized) {
        Ok(())
    } else {
        Err(NOT_INITIALIZED)
    }
}

fn log(kind: Kind, a: i64, b: i64) {
    let device = current_device().unwrap_or(-1);
    with_state(|s| s.log.push([kind as i64, a, b, device]));
}

fn result(r: Result<(), CuResult>) -> CuResult {
    r.err().unwrap_or(SUCCESS)
}

/// Sleeps for the configured delay: a blocking call's time on a GPU.
fn blocking_delay() {
    let ms = with_state(|s| s.sync_delay_ms);
    if ms > 0 {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}

/// The known range holding all of `[start, start + len)`, if any.
fn range_of(start: usize, len: usize) -> Option<(usize, Place)> {
    let end = start.checked_add(len)?;
    with_state(|s| {
        s.memory
            .iter()
            .find(|(&base, &(size, _))| start >= base && base.checked_add(size).is_some_and(|limit| end <= limit))
            .map(|(&base, &(_, place))| (base, place))
    })
}

/// The place of the known range `start` falls in (even if a length would run past it).
fn place_of(start: usize) -> Option<Place> {
    with_state(|s| s.memory.iter().find(|(&base, &(size, _))| start >= base && start - base < size).map(|(_, &(_, p))| p))
}

fn allocate(len: usize, place: Place, kind: Kind) -> Result<usize, CuResult> {
    let size = len.max(1);
    let in_use: usize = with_state(|s| {
        s.owned.iter().filter(|(start, _)| s.memory.get(start).is_some_and(|m| m.1 == place)).map(|(_, (n, _))| n).sum()
    });
    if size > CAPACITY.saturating_sub(in_use) {
        return Err(OUT_OF_MEMORY);
    }
    let layout = std::alloc::Layout::from_size_align(size, 256).map_err(|_| OUT_OF_MEMORY)?;
    // SAFETY: a non-zero size.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) } as usize;
    if ptr == 0 {
        return Err(OUT_OF_MEMORY);
    }
    // Managed memory is freed like device memory.
    let freed_as = if kind == Kind::AllocManaged { Kind::Alloc } else { kind };
    with_state(|s| {
        s.memory.insert(ptr, (size, place));
        s.owned.insert(ptr, (size, freed_as));
    });
    log(kind, ptr as i64, len as i64);
    Ok(ptr)
}

/// Frees an allocation of `allocated` kind; anything else is INVALID_VALUE.
fn free(ptr: usize, allocated: Kind, kind: Kind) -> Result<(), CuResult> {
    let size = with_state(|s| match s.owned.get(&ptr) {
        Some(&(size, k)) if k == allocated => {
            s.owned.remove(&ptr);
            s.memory.remove(&ptr);
            Some(size)
        }
        _ => None,
    })
    .ok_or(INVALID_VALUE)?;
    // SAFETY: allocated by `allocate` with this size and alignment.
    unsafe { std::alloc::dealloc(ptr as *mut u8, std::alloc::Layout::from_size_align_unchecked(size, 256)) };
    log(kind, ptr as i64, 0);
    Ok(())
}

/// Checks a copy of `len` bytes: the source must be known memory when
/// `check_src`, the destination when `check_dst`; a host destination that is
/// known memory (pinned) must hold all of it too.
fn check_copy(dst: usize, src: usize, len: usize, check_src: bool, check_dst: bool) -> Result<(), CuResult> {
    let dst_ok = if check_dst || place_of(dst).is_some() { range_of(dst, len).is_some() } else { true };
    if (check_src && range_of(src, len).is_none()) || !dst_ok {
        return Err(INVALID_VALUE);
    }
    Ok(())
}
