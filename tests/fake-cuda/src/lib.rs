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
//!   test registers (a producer's device, pinned or managed memory). A freed
//!   block is kept and handed to a later allocation of its kind (as a pool
//!   reuses memory), so work that runs after a free writes the new owner's
//!   bytes, and the use is counted ([`blocks`]).
//! - Streams are queues ([`timeline`]). Copies, test "kernels" and host
//!   functions run when a synchronisation, or a wait that is itself reached,
//!   needs them. The legacy stream (1) waits for, and is waited for by, every
//!   blocking stream of its context; non-blocking streams wait for nothing;
//!   the per-thread stream (2) is one blocking stream per thread. A synchronous
//!   copy from pageable memory returns with its DMA still queued on the legacy
//!   stream. Frees are as the driver documents them, not as drivers happen to
//!   behave: `cuMemFree` and `cuMemFreeHost` free at once (the driver "may"
//!   synchronise, which nothing may rely on), `cuMemFreeAsync` frees when its
//!   stream reaches it, and `cuMemAllocAsync` exists where the device reports
//!   memory pools (a test can say it has none).
//! - Streams are created and destroyed by tests; a destroyed handle may be
//!   handed out again. A driver dereferences an unknown stream handle
//!   (undefined behaviour); the fake answers CUDA_ERROR_INVALID_HANDLE so that
//!   such a bug shows, but no test expects that answer. A stream may wait for
//!   an event of another device, as on a driver.
//! - Stream capture ([`capture`]): captured work is kept for graph launches;
//!   the legacy stream is unusable while a blocking stream captures; waiting on
//!   an event recorded outside needs CU_EVENT_WAIT_EXTERNAL; unsafe calls
//!   (allocation, frees, synchronisation, queries) invalidate a global capture
//!   unless the calling thread's capture mode is relaxed.
//! - Primary contexts have retain counts and can be reset, after which their
//!   old handles fail with CUDA_ERROR_CONTEXT_IS_DESTROYED. Every call but
//!   `cuInit` fails with CUDA_ERROR_NOT_INITIALIZED before `cuInit`; `cuInit`
//!   can be made to fail or slow (`FAKE_CUDA_INIT_RESULT`, `FAKE_CUDA_INIT_DELAY_MS`),
//!   and a copy named by `FAKE_CUDA_STUB` is a toolkit stub. Each thread has a
//!   capture mode that tests can read back.
//! - Modules ([`modules`]) are PTX text, for a CUDA 13.0 driver, with a JIT
//!   error log; kernels report their parameter layout (`cuFuncGetParamInfo`,
//!   which a test can turn off as on drivers before 12.4); a kernel the fake
//!   knows by its entry name runs as Rust on the "device" memory when its
//!   launch, queued on a stream like any work, is reached.
//! - Blocking calls can be slowed (`fake_cuda_set_sync_delay_ms`), so that a test
//!   can see whether the caller let other threads run meanwhile.
//!
//! | file | what |
//! |---|---|
//! | `lib.rs` | the fake's state: contexts, events, the log |
//! | `blocks.rs` | known memory: allocations, frees, reuse and uses after a free |
//! | `hooks.rs` | the test hooks for memory, the log, contexts and slow calls |
//! | `timeline.rs` | streams as queues of work, and the test hooks that launch and complete work |
//! | `capture.rs` | stream capture: its rules, graphs, and its test hooks |
//! | `driver.rs` | the driver API functions dlbridge calls: initialisation, contexts, events, streams |
//! | `memory.rs` | the driver API functions dlbridge calls: pointer attributes, device attributes, allocations, frees |
//! | `copies.rs` | the driver API functions dlbridge calls: copies |
//! | `modules.rs` | modules from PTX, their parameter layouts, and launches |
//! | `kernels.rs` | the kernels the fake knows, and what they do |
//! | `ptx.rs` | PTX text as the JIT reads it, and its error log |

mod blocks;
mod capture;
mod copies;
mod driver;
mod hooks;
mod kernels;
mod memory;
mod modules;
mod ptx;
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
const NOT_SUPPORTED: CuResult = 801;

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
    /// stream (0 for the synchronous copy), bytes
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
    /// stream, bytes (stream-ordered, from the device's pool)
    AllocAsync = 21,
    /// address, stream (freed when the stream reaches it)
    FreeAsync = 22,
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
    /// Freed blocks of ours, for reuse: address -> (layout size, place).
    freed: HashMap<usize, (usize, Place)>,
    /// How many ops touched a freed block before it was handed out again.
    uses_after_free: usize,
    /// Whether devices report memory pools (`cuMemAllocAsync`, `cuMemFreeAsync`).
    pools: bool,
    /// Whether `cuFuncGetParamInfo` answers (drivers before 12.4 lack it).
    param_info: bool,
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
        freed: HashMap::new(),
        uses_after_free: 0,
        pools: true,
        param_info: true,
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
