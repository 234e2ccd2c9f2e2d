//! The one borrow registry of a process, shared by every extension that links
//! dlbridge-pyo3 (any version speaking the same registry ABI), as rust-numpy
//! shares its borrow checks through NumPy.
//!
//! The first extension to need it publishes a table of C functions in a
//! capsule, in a module it adds to `sys.modules` under [`MODULE`]; the others
//! find it there and call through it, so two extensions borrowing the same
//! bytes see each other. Extension modules are never unloaded, so the table
//! and the functions behind it live as long as the process. If the name holds
//! anything else (a table of another major, or not a table), borrows are
//! refused: a registry of this extension's own could not see the others'.

use core::cell::UnsafeCell;
use core::ffi::{c_int, CStr};
use core::sync::atomic::{AtomicPtr, Ordering};

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyModule;

/// The `sys.modules` entry that carries the shared table: one per ABI major,
/// so that a table of another major, published first, cannot keep the
/// extensions of this one apart.
const MODULE: &CStr = c"_dlbridge_borrows_2";
/// The capsule's name, which is also its attribute in [`MODULE`].
const CAPSULE: &CStr = c"_dlbridge_borrows_2.api";
/// Changed only when a field's meaning changes; new fields are appended and counted by `size`.
/// (2: the functions are called with the GIL held, which is their lock.)
const ABI_MAJOR: u32 = 2; // also in MODULE and CAPSULE

/// A live borrow that a new one conflicts with.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Conflict {
    /// Its first byte address.
    pub(crate) start: usize,
    /// One past its last byte.
    pub(crate) end: usize,
    /// Whether it is exclusive (writable).
    pub(crate) exclusive: bool,
}

/// The shared table. Fields are only appended; `size` says how many a publisher filled.
/// Every function is called with the GIL held.
#[repr(C)]
pub(crate) struct RegistryApi {
    /// [`ABI_MAJOR`] of the publisher.
    pub(crate) abi_major: u32,
    /// Size of this struct as the publisher knows it.
    pub(crate) size: u32,
    /// Registers a borrow of bytes `start..end` (non-empty) of address space
    /// `space`: a non-zero id, or 0 when it conflicts with a live borrow,
    /// which is then described in `*conflict` (may be NULL), or when there was
    /// no memory to record it (`*conflict` untouched). A shared borrow
    /// conflicts with an exclusive one, an exclusive one with any.
    pub(crate) acquire: unsafe extern "C" fn(space: u64, start: usize, end: usize, exclusive: c_int, conflict: *mut Conflict) -> u64,
    /// Ends the borrow `id` (0 is ignored).
    pub(crate) release: unsafe extern "C" fn(id: u64),
    /// How many borrows are live.
    pub(crate) live: unsafe extern "C" fn() -> usize,
}

struct Entry {
    id: u64,
    space: u64,
    start: usize,
    end: usize,
    exclusive: bool,
}

/// The live borrows and the next id to give out. The GIL is their lock:
/// every function of the table is called with it held (their contract), so
/// one thread at a time reaches them, and an extension call pays for no
/// atomic instruction here. (A `Mutex` would cost two per borrow, a tenth of
/// a one-argument call; borrows that Rust code could end without the GIL
/// hold a `Python` token instead, see `Borrow`.)
struct Live(UnsafeCell<(Vec<Entry>, u64)>);

// SAFETY: the cell is reached only from the table's functions, whose callers
// hold the GIL, which one thread holds at a time.
unsafe impl Sync for Live {}

static LIVE: Live = Live(UnsafeCell::new((Vec::new(), 1)));

/// The live borrows and the next id.
///
/// # Safety
/// The caller holds the GIL and drops the result before anything else
/// (another call of this function included) can run.
#[allow(clippy::mut_from_ref)]
unsafe fn live_entries() -> &'static mut (Vec<Entry>, u64) {
    // SAFETY: forwarded from the caller: the GIL excludes every other thread,
    // and the caller every other reference on this one.
    unsafe { &mut *LIVE.0.get() }
}

unsafe extern "C" fn acquire(space: u64, start: usize, end: usize, exclusive: c_int, conflict: *mut Conflict) -> u64 {
    let exclusive = exclusive != 0;
    // SAFETY: the caller holds the GIL (this function's contract); nothing below calls out.
    let (live, next_id) = unsafe { live_entries() };
    let clash = live.iter().find(|e| e.space == space && e.start < end && start < e.end && (exclusive || e.exclusive));
    if let Some(other) = clash {
        if !conflict.is_null() {
            // SAFETY: the caller's out pointer, checked non-NULL.
            unsafe { conflict.write(Conflict { start: other.start, end: other.end, exclusive: other.exclusive }) };
        }
        return 0;
    }
    // No allocation on the common path: the list keeps its capacity between calls.
    if live.try_reserve(1).is_err() {
        return 0;
    }
    let id = *next_id;
    *next_id += 1;
    live.push(Entry { id, space, start, end, exclusive });
    id
}

unsafe extern "C" fn release(id: u64) {
    if id != 0 {
        // SAFETY: as in `acquire`.
        let (live, _) = unsafe { live_entries() };
        if let Some(i) = live.iter().rposition(|e| e.id == id) {
            live.swap_remove(i);
        }
    }
}

unsafe extern "C" fn live() -> usize {
    // SAFETY: as in `acquire`.
    unsafe { live_entries() }.0.len()
}

static OWN: RegistryApi = RegistryApi {
    abi_major: ABI_MAJOR,
    size: core::mem::size_of::<RegistryApi>() as u32,
    acquire,
    release,
    live,
};

/// The process's registry: the one published in `sys.modules`, published
/// by this extension if no other did first. `None` while that name holds
/// anything else (not a table, or one of another major): extensions that
/// cannot see each other's borrows must not borrow at all.
#[inline]
pub(crate) fn api() -> Option<&'static RegistryApi> {
    let known = API.load(Ordering::Acquire);
    if known.is_null() {
        return find_api();
    }
    // SAFETY: only 'static tables are stored.
    Some(unsafe { &*known })
}

/// The table [`api`] hands out, once found.
static API: AtomicPtr<RegistryApi> = AtomicPtr::new(core::ptr::null_mut());

#[cold]
fn find_api() -> Option<&'static RegistryApi> {
    // Two threads may both look: `setdefault` gives both the same table, and
    // the first one stored is the one every caller uses. Not finding one is
    // not remembered: the next borrow asks again.
    let found = core::ptr::from_ref(Python::attach(shared)?).cast_mut();
    let kept = match API.compare_exchange(core::ptr::null_mut(), found, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => found,
        Err(first) => first,
    };
    // SAFETY: only 'static tables are stored.
    Some(unsafe { &*kept })
}

/// Finds the published table, or publishes ours; `None` if `sys.modules`
/// cannot be used or holds anything but a table this version speaks.
fn shared(py: Python<'_>) -> Option<&'static RegistryApi> {
    let result = (|| -> PyResult<Option<&'static RegistryApi>> {
        let module = PyModule::new(py, MODULE.to_str().unwrap_or("_dlbridge_borrows_2"))?;
        let own = core::ptr::addr_of!(OWN).cast_mut().cast();
        // SAFETY: a static table outlives the capsule; no destructor is needed.
        let capsule = unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyCapsule_New(own, CAPSULE.as_ptr(), None))? };
        module.setattr("api", capsule)?;
        let modules = py.import("sys")?.getattr("modules")?;
        // setdefault is atomic: of two extensions publishing at once, one wins.
        let published = modules.call_method1("setdefault", (MODULE.to_str().unwrap_or("_dlbridge_borrows_2"), module))?;
        let capsule = published.getattr("api")?;
        // SAFETY: a name check on a live object; IsValid never raises.
        if unsafe { ffi::PyCapsule_IsValid(capsule.as_ptr(), CAPSULE.as_ptr()) } != 1 {
            return Ok(None);
        }
        // SAFETY: a valid capsule of this name holds a table that lives as long as the process.
        let table = unsafe { &*ffi::PyCapsule_GetPointer(capsule.as_ptr(), CAPSULE.as_ptr()).cast::<RegistryApi>() };
        let complete = table.size as usize >= core::mem::size_of::<RegistryApi>();
        Ok((table.abi_major == ABI_MAJOR && complete).then_some(table))
    })();
    result.unwrap_or_else(|err| {
        drop(err);
        None
    })
}
