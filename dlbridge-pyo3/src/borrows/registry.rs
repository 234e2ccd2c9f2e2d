//! The one borrow registry of an interpreter, shared by every extension that
//! links dlbridge-pyo3 (any version speaking the same registry ABI), as
//! rust-numpy shares its borrow checks through NumPy.
//!
//! The first extension to need it publishes a table of C functions in a
//! capsule in the interpreter's state dict (`PyInterpreterState_GetDict`),
//! which only C code reaches: Python code can neither remove it nor put
//! something else there, so every extension finds the same table whatever
//! `sys.modules` holds. The key is the same for every ABI major; a table of
//! another major found there refuses borrows loudly, and is never replaced by
//! a second registry that could not see the first one's borrows. Extension
//! modules are never unloaded, so the table lives as long as the process.
//!
//! Builds before this one published their registry in `sys.modules`
//! (`_dlbridge_borrows_2`, and `_dlbridge_borrows` before it). A table there
//! is such a build's, which cannot see these borrows: borrows are refused
//! then too, and a marker is left under those names so that such a build
//! loaded later refuses its own.

use core::ffi::{c_int, CStr};
use core::sync::atomic::{AtomicPtr, Ordering};

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyModule;

use super::table::{Locked, Refused};
use crate::abi_structs::write_prefix;
use crate::trust::{publish_for_interpreter, table_of, TableMismatch};

/// The key in the interpreter's dict, and the capsule's name: never changes.
pub(crate) const KEY: &CStr = c"dlbridge.borrow_registry";
/// Changed whenever a field's meaning or a struct passed through the table
/// changes; new fields are appended and counted by `size`. (3: found in the
/// interpreter's dict; locked by the GIL, or by a mutex on free-threaded
/// builds; out-structs come with their size.)
pub(crate) const ABI_MAJOR: u32 = 3;
/// Where builds before ABI 3 published their tables, and their capsules' names.
const LEGACY: [(&str, &CStr); 2] = [("_dlbridge_borrows_2", c"_dlbridge_borrows_2.api"), ("_dlbridge_borrows", c"_dlbridge_borrows.api")];

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

/// The shared table. Fields are only appended; `size` says how many a
/// publisher filled. On builds with a GIL every function is called with it
/// held; on free-threaded builds from any attached thread.
#[repr(C)]
pub(crate) struct RegistryApi {
    /// [`ABI_MAJOR`] of the publisher.
    pub(crate) abi_major: u32,
    /// Size of this struct as the publisher knows it.
    pub(crate) size: u32,
    /// Registers a borrow of bytes `start..end` (non-empty) of address space
    /// `space`: a non-zero id, or 0 when it conflicts with a live borrow,
    /// which is then described in `*conflict` (`conflict_size` bytes of it at
    /// most; may be NULL), or when there was no memory to record it
    /// (`*conflict` untouched). A shared borrow conflicts with an exclusive
    /// one, an exclusive one with any.
    pub(crate) acquire:
        unsafe extern "C" fn(space: u64, start: usize, end: usize, exclusive: c_int, conflict: *mut Conflict, conflict_size: usize) -> u64,
    /// Ends the borrow `id` (0 is ignored).
    pub(crate) release: unsafe extern "C" fn(id: u64),
    /// How many borrows are live.
    pub(crate) live: unsafe extern "C" fn() -> usize,
}

static LIVE: Locked = Locked::new();

unsafe extern "C" fn acquire(space: u64, start: usize, end: usize, exclusive: c_int, conflict: *mut Conflict, conflict_size: usize) -> u64 {
    // SAFETY: the table's contract (the GIL held on builds with one);
    // `acquire` calls nothing out.
    let outcome = unsafe { LIVE.with(|borrows| borrows.acquire(space, start, end, exclusive != 0)) };
    match outcome {
        Ok(id) => id,
        Err(Refused::Conflict { start, end, exclusive }) => {
            if !conflict.is_null() {
                // SAFETY: the caller's out struct, writable for `conflict_size` bytes.
                unsafe { write_prefix(&Conflict { start, end, exclusive }, conflict, conflict_size) };
            }
            0
        }
        Err(Refused::NoMemory) => 0,
    }
}

unsafe extern "C" fn release(id: u64) {
    // SAFETY: as in `acquire`.
    unsafe { LIVE.with(|borrows| borrows.release(id)) }
}

unsafe extern "C" fn live() -> usize {
    // SAFETY: as in `acquire`.
    unsafe { LIVE.with(|borrows| borrows.count()) }
}

static OWN: RegistryApi = RegistryApi {
    abi_major: ABI_MAJOR,
    size: core::mem::size_of::<RegistryApi>() as u32,
    acquire,
    release,
    live,
};

/// Why this extension may not borrow.
#[derive(Debug)]
pub(crate) enum Unshared {
    /// The interpreter's registry speaks another ABI major.
    OtherMajor(u32),
    /// The interpreter's entry is not a registry table, or an incomplete one.
    NotATable,
    /// An older build published its own registry in `sys.modules[name]`.
    Legacy(&'static str),
    /// The registry could not be found or published (no memory).
    Unavailable,
}

impl Unshared {
    /// What the BufferError of a refused borrow says.
    pub(crate) fn message(&self) -> String {
        let why = match self {
            Unshared::OtherMajor(major) => format!(
                "another extension in this process published a borrow registry of ABI {major}, and this one speaks ABI {ABI_MAJOR}"
            ),
            Unshared::NotATable => "the interpreter's borrow-registry entry is not a registry table".to_owned(),
            Unshared::Legacy(name) => format!(
                "an extension built with an older dlbridge-pyo3 keeps a registry of its own (sys.modules[{name:?}]) that cannot see this one's"
            ),
            Unshared::Unavailable => "the interpreter's borrow registry could not be found or published".to_owned(),
        };
        format!(
            "dlbridge-pyo3 cannot borrow tensors here: {why}; extensions that cannot see each other's borrows could \
             alias a tensor that one of them writes, so none may borrow. Rebuild the extensions against one dlbridge-pyo3"
        )
    }
}

/// The interpreter's registry, found (or published) once; the refusal
/// otherwise, which is not remembered: the next borrow asks again.
#[inline]
pub(crate) fn api() -> Result<&'static RegistryApi, Unshared> {
    let known = API.load(Ordering::Acquire);
    if known.is_null() {
        return find_api();
    }
    // SAFETY: only 'static tables are stored.
    Ok(unsafe { &*known })
}

/// The table [`api`] hands out, once found.
static API: AtomicPtr<RegistryApi> = AtomicPtr::new(core::ptr::null_mut());

#[cold]
fn find_api() -> Result<&'static RegistryApi, Unshared> {
    let found = Python::attach(shared)?;
    // Two threads may both look: both find the same table in the dict.
    API.store(core::ptr::from_ref(found).cast_mut(), Ordering::Release);
    Ok(found)
}

/// Finds the table in the interpreter's dict, or publishes ours there.
fn shared(py: Python<'_>) -> Result<&'static RegistryApi, Unshared> {
    let own = core::ptr::addr_of!(OWN).cast_mut().cast();
    // SAFETY: a static table outlives the capsule; no destructor is needed.
    let capsule = unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyCapsule_New(own, KEY.as_ptr(), None)) }.map_err(|_| Unshared::Unavailable)?;
    let entry = publish_for_interpreter(py, KEY, &capsule).ok_or(Unshared::Unavailable)?;
    let table = table_of(&entry, KEY, ABI_MAJOR, core::mem::size_of::<RegistryApi>()).map_err(|mismatch| match mismatch {
        TableMismatch::NotATable => Unshared::NotATable,
        TableMismatch::OtherMajor(major) => Unshared::OtherMajor(major),
    })?;
    check_legacy(py)?;
    // SAFETY: a table of this major and size, which lives as long as the process.
    Ok(unsafe { &*table.cast::<RegistryApi>() })
}

/// Refuses when an older build published its registry in `sys.modules`, and
/// leaves markers there that make such a build, loaded later, refuse its own.
fn check_legacy(py: Python<'_>) -> Result<(), Unshared> {
    let modules = py.import("sys").and_then(|sys| sys.getattr("modules")).map_err(|_| Unshared::Unavailable)?;
    for (name, capsule_name) in LEGACY {
        let marker = PyModule::new(py, name).map_err(|_| Unshared::Unavailable)?;
        // A module without `api`: those builds find no table and refuse.
        let entry = modules.call_method1("setdefault", (name, marker)).map_err(|_| Unshared::Unavailable)?;
        let Ok(capsule) = entry.getattr("api") else { continue };
        // SAFETY: a name check on a live object; IsValid never raises.
        if unsafe { ffi::PyCapsule_IsValid(capsule.as_ptr(), capsule_name.as_ptr()) } == 1 {
            return Err(Unshared::Legacy(name));
        }
    }
    Ok(())
}

#[cfg(all(test, target_pointer_width = "64"))]
mod layout {
    use core::mem::{offset_of, size_of};

    use super::*;

    #[test]
    fn the_structs_another_build_reads_are_those_of_abi_3() {
        assert_eq!(ABI_MAJOR, 3, "a new major: pin its layout here");
        let table = (size_of::<RegistryApi>(), offset_of!(RegistryApi, acquire), offset_of!(RegistryApi, release), offset_of!(RegistryApi, live));
        assert_eq!(table, (32, 8, 16, 24));
        assert_eq!((size_of::<Conflict>(), offset_of!(Conflict, end), offset_of!(Conflict, exclusive)), (24, 8, 16));
    }
}
