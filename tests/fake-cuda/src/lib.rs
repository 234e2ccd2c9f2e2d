//! A stand-in for `libcuda.so`, loaded by dlbridge's CUDA layer on a machine
//! with no GPU, so that CI can check what dlbridge asks of the driver: which
//! stream waits for which event, which context is current for each call, what
//! is allocated, copied and freed. It proves nothing about a GPU
//! (`bindings/python/tests/gpu` does that on one).
//!
//! "Device" memory is host memory. Two devices exist, each with 1 GiB; device
//! `d`'s primary context is the handle `(d + 1) << 12`. Every call but
//! `cuInit`, `cuDeviceGet`, `cuDevicePrimaryCtxRetain`, the context stack and
//! (unless made strict) `cuPointerGetAttribute` needs a current context, as the
//! real driver may. Copies must stay inside memory the driver knows: its own
//! allocations, or ranges a test registers (a producer's "device" memory).
//!
//! | file | what |
//! |---|---|
//! | `lib.rs` | the fake's state, and the `fake_cuda_*` functions tests call (ctypes) |
//! | `driver.rs` | the driver API functions dlbridge calls |

mod driver;

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Mutex;

type CuResult = u32;
const SUCCESS: CuResult = 0;
const INVALID_VALUE: CuResult = 1;
const OUT_OF_MEMORY: CuResult = 2;
const INVALID_DEVICE: CuResult = 101;
const INVALID_CONTEXT: CuResult = 201;
const INVALID_HANDLE: CuResult = 400;

const DEVICES: i32 = 2;
/// What each device, and pinned host memory, can hold.
const CAPACITY: usize = 1 << 30;
/// Where pinned host memory is said to live, in the log and the registry.
const PINNED: i64 = -2;
/// Event handles start here, far from the stream values 1 and 2.
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
}

struct State {
    next_event: i64,
    /// Live events: handle -> (flags, device of the context they were made in).
    events: HashMap<i64, (u32, i64)>,
    /// Known memory: start -> (length, device or PINNED), ours or registered.
    memory: HashMap<usize, (usize, i64)>,
    /// Ours only: address -> (layout size, the kind of allocation).
    owned: HashMap<usize, (usize, Kind)>,
    log: Vec<[i64; 4]>,
    /// Whether `cuPointerGetAttribute` needs a current context.
    strict_pointer_queries: bool,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

thread_local! {
    /// This thread's context stack, innermost last.
    static CONTEXTS: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

fn with_state<T>(body: impl FnOnce(&mut State) -> T) -> T {
    let mut guard = STATE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let state = guard.get_or_insert_with(|| State {
        next_event: FIRST_EVENT,
        events: HashMap::new(),
        memory: HashMap::new(),
        owned: HashMap::new(),
        log: Vec::new(),
        strict_pointer_queries: false,
    });
    body(state)
}

fn context_handle(device: i32) -> usize {
    (device as usize + 1) << 12
}

/// The device whose context is current on this thread.
fn current_device() -> Option<i64> {
    CONTEXTS.with(|c| c.borrow().last().map(|&h| (h >> 12) as i64 - 1))
}

/// The current context's device, or INVALID_CONTEXT.
fn context() -> Result<i64, CuResult> {
    current_device().ok_or(INVALID_CONTEXT)
}

fn log(kind: Kind, a: i64, b: i64) {
    let device = current_device().unwrap_or(-1);
    with_state(|s| s.log.push([kind as i64, a, b, device]));
}

fn result(r: Result<(), CuResult>) -> CuResult {
    r.err().unwrap_or(SUCCESS)
}

/// A stream handle: the two default streams or any other positive value.
/// NULL is refused although the driver takes it (its default stream):
/// dlbridge always names the legacy stream explicitly, as 1.
fn check_stream(stream: usize) -> Result<i64, CuResult> {
    match stream as i64 {
        value if value > 0 => Ok(value),
        _ => Err(INVALID_HANDLE),
    }
}

/// The known range holding all of `[start, start + len)`, if any.
fn range_of(start: usize, len: usize) -> Option<(usize, i64)> {
    let end = start.checked_add(len)?;
    with_state(|s| {
        s.memory
            .iter()
            .find(|(&base, &(size, _))| start >= base && base.checked_add(size).is_some_and(|limit| end <= limit))
            .map(|(&base, &(_, place))| (base, place))
    })
}

/// Whether `start` falls inside any known range (even if `len` runs past it).
fn touches_known(start: usize) -> bool {
    with_state(|s| s.memory.iter().any(|(&base, &(size, _))| start >= base && start - base < size))
}

fn allocate(len: usize, place: i64, kind: Kind) -> Result<usize, CuResult> {
    let size = len.max(1);
    // What this device (or pinned memory) already holds.
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
    context()?;
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

/// Copies `len` bytes. The source must be known memory when `check_src`, the
/// destination when `check_dst`; a host destination that is known memory
/// (pinned) must hold all of it too.
fn copy(dst: usize, src: usize, len: usize, check_src: bool, check_dst: bool) -> Result<(), CuResult> {
    let dst_ok = if check_dst || touches_known(dst) { range_of(dst, len).is_some() } else { true };
    if (check_src && range_of(src, len).is_none()) || !dst_ok {
        return Err(INVALID_VALUE);
    }
    // SAFETY: both ranges are host memory; the known ones were checked, and an
    // unknown destination is the caller's own buffer of `len` bytes.
    unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len) };
    Ok(())
}

// --- for tests ------------------------------------------------------------

/// Declares `[start, start + len)` to be memory of `device`, as a producer's
/// device memory would be.
#[no_mangle]
pub extern "C" fn fake_cuda_register(start: usize, len: usize, device: i64) {
    with_state(|s| s.memory.insert(start, (len, device)));
}

/// Forgets every range registered with [`fake_cuda_register`].
#[no_mangle]
pub extern "C" fn fake_cuda_forget_registered() {
    with_state(|s| {
        let owned = &s.owned;
        s.memory.retain(|start, _| owned.contains_key(start));
    });
}

/// Makes `cuPointerGetAttribute` need a current context, or not.
#[no_mangle]
pub extern "C" fn fake_cuda_set_strict_pointer_queries(strict: bool) {
    with_state(|s| s.strict_pointer_queries = strict);
}

/// How many rows the log holds.
#[no_mangle]
pub extern "C" fn fake_cuda_log_len() -> usize {
    with_state(|s| s.log.len())
}

/// Copies log row `index` into `out` (four values); false past the end.
///
/// # Safety
/// `out` has room for four values.
#[no_mangle]
pub unsafe extern "C" fn fake_cuda_log_row(index: usize, out: *mut i64) -> bool {
    with_state(|s| match s.log.get(index) {
        Some(row) => {
            // SAFETY: the caller's buffer of four.
            unsafe { std::ptr::copy_nonoverlapping(row.as_ptr(), out, 4) };
            true
        }
        None => false,
    })
}

/// Empties the log.
#[no_mangle]
pub extern "C" fn fake_cuda_clear_log() {
    with_state(|s| s.log.clear());
}

/// Events created and not destroyed.
#[no_mangle]
pub extern "C" fn fake_cuda_live_events() -> usize {
    with_state(|s| s.events.len())
}

/// Allocations (device and pinned) not freed.
#[no_mangle]
pub extern "C" fn fake_cuda_live_allocations() -> usize {
    with_state(|s| s.owned.len())
}

/// How many contexts this thread has pushed and not popped.
#[no_mangle]
pub extern "C" fn fake_cuda_context_depth() -> usize {
    CONTEXTS.with(|c| c.borrow().len())
}
