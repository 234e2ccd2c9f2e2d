//! This process's segments: each mapped once (a handle unpickled where its
//! segment is mapped already gives the same memory, so borrows see two
//! tensors of it overlap), and the ones it made, which it alone unlinks: when
//! the last tensor over one goes, or at exit.
//!
//! Python's resource tracker (a process of its own) is told of each segment
//! made and of each unlink, so that it unlinks what a killed process left.
//! Telling it runs Python code, which may give the GIL up, and a daemon thread
//! that CPython ends meanwhile at interpreter exit parks there
//! (`dlbridge::thread_exit`). So that no segment stays behind and the tracker
//! never warns: the exit sweep (atexit, while threads still run) waits for the
//! notices in flight, then unlinks every segment left and tells the tracker;
//! segments made after it are not told, and the interpreter's last act
//! (`Py_AtExit`, when no thread runs Python) unlinks them. The table's lock is
//! never held across Python code, so a parked thread never holds it.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Once, PoisonError, Weak};
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use pyo3::{ffi, intern};

use super::segment::{self, Segment};

/// What the resource tracker knows of a segment this process made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Notice {
    /// Being told of it (a thread runs the tracker's Python code).
    Registering,
    /// Told of it.
    Registered,
    /// Unlinked; being told so.
    Unregistering,
    /// Never to be told (made after the exit sweep).
    Untold,
}

#[derive(Default)]
struct Table {
    /// Every mapped segment by name.
    mapped: HashMap<String, Weak<Shared>>,
    /// The segments this process made and has not unlinked (and told of) yet.
    /// A forked child inherits them; only the process that made one (`made_by`)
    /// acts on it.
    made: HashMap<String, Notice>,
    /// The process whose `made` this is (a forked child's copy is its parent's).
    made_by: u32,
    /// Whether the exit sweep ran: the tracker is told of nothing more.
    swept: bool,
}

static TABLE: Mutex<Option<Table>> = Mutex::new(None);
/// Signalled whenever a notice settles.
static SETTLED: Condvar = Condvar::new();

fn table() -> MutexGuard<'static, Option<Table>> {
    TABLE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs `f` on the table, alone; nothing in `f` calls Python.
fn with_table<R>(f: impl FnOnce(&mut Table) -> R) -> R {
    let mut guard = table();
    let t = guard.get_or_insert_with(Table::default);
    let me = std::process::id();
    if t.made_by != me {
        // A forked child: the parent's segments are the parent's to unlink.
        t.made.clear();
        t.made_by = me;
    }
    f(t)
}

/// A mapped segment as tensors hold it: the last one to go tells the table.
#[derive(Debug)]
pub(crate) struct Shared(Segment);

impl core::ops::Deref for Shared {
    type Target = Segment;
    fn deref(&self) -> &Segment {
        &self.0
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        last_gone(&self.0);
    }
}

/// A new segment of `size` bytes, made by this process and told to the tracker.
pub(crate) fn create(py: Python<'_>, size: usize) -> PyResult<Arc<Shared>> {
    let made = Arc::new(Shared(Segment::create(size, new_name)?));
    let name = made.name.clone();
    // Recorded before any Python runs: from here on, an exit unlinks it.
    let tell = with_table(|t| {
        t.mapped.insert(name.clone(), Arc::downgrade(&made));
        let notice = if t.swept { Notice::Untold } else { Notice::Registering };
        t.made.insert(name.clone(), notice);
        notice == Notice::Registering
    });
    unlink_at_the_very_end();
    if tell {
        let told = call_shared(py, intern!(py, "_track"), &name);
        let unlinked_meanwhile = with_table(|t| match t.made.get_mut(&name) {
            Some(notice @ Notice::Registering) => {
                *notice = if told.is_ok() { Notice::Registered } else { Notice::Untold };
                false
            }
            _ => told.is_ok(),
        });
        SETTLED.notify_all();
        if unlinked_meanwhile {
            call_shared(py, intern!(py, "_untrack"), &name)?;
        }
        told?;
    }
    Ok(made)
}

/// The segment `name` of `size` bytes: this process's mapping if it has one,
/// else a new one.
pub(crate) fn attach(name: &str, size: usize) -> PyResult<Arc<Shared>> {
    with_table(|t| {
    if let Some(mapped) = t.mapped.get(name).and_then(Weak::upgrade) {
        if mapped.size != size {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "malformed dlbridge shared-memory handle: segment {name:?} holds {} bytes, not {size}",
                mapped.size
            )));
        }
        return Ok(mapped);
    }
    // Opened and mapped under the lock (no Python runs): two threads attaching
    // at once map it once.
    let opened = Arc::new(Shared(Segment::open(name, size)?));
    t.mapped.insert(name.to_owned(), Arc::downgrade(&opened));
    Ok(opened)
    })
}

/// The last tensor over a segment went: forget its mapping, and if this
/// process made it, unlink it and tell the tracker. Called where the segment
/// is dropped, with or without the GIL.
fn last_gone(segment: &Segment) {
    let mine = segment.creator == Some(std::process::id());
    let tell = with_table(|t| {
        if t.mapped.get(&segment.name).is_some_and(|w| w.strong_count() == 0) {
            t.mapped.remove(&segment.name);
        }
        if !mine {
            return false;
        }
        match t.made.get(&segment.name).copied() {
            Some(Notice::Registered) => {
                t.made.insert(segment.name.clone(), Notice::Unregistering);
                segment::unlink(&segment.name);
                true
            }
            Some(Notice::Untold) => {
                t.made.remove(&segment.name);
                segment::unlink(&segment.name);
                false
            }
            // Unlinked by the sweep, or told right after its registration ends.
            Some(Notice::Registering) => {
                t.made.remove(&segment.name);
                segment::unlink(&segment.name);
                false
            }
            Some(Notice::Unregistering) | None => false,
        }
    });
    if tell {
        crate::owner::with_gil_unless_finalized(|| {
            // SAFETY: the GIL was just taken.
            let py = unsafe { Python::assume_attached() };
            let _ = call_shared(py, intern!(py, "_untrack"), &segment.name);
        });
        with_table(|t| t.made.remove(&segment.name));
        SETTLED.notify_all();
    }
}

/// The exit sweep (atexit, and multiprocessing's finalizers for workers that
/// leave through `os._exit`): waits (at most a few seconds, without the GIL)
/// for notices other threads are giving, then unlinks every segment this
/// process made and still has, and tells the tracker.
pub(crate) fn exit_sweep(py: Python<'_>) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (told, in_flight) = with_table(|t| {
            t.swept = true;
            let mut told = Vec::new();
            let mut in_flight = false;
            for (name, notice) in t.made.iter_mut() {
                match notice {
                    Notice::Registered => {
                        *notice = Notice::Unregistering;
                        told.push(name.clone());
                    }
                    Notice::Registering | Notice::Unregistering => in_flight = true,
                    Notice::Untold => {}
                }
            }
            (told, in_flight)
        });
        for name in &told {
            segment::unlink(name);
            let _ = call_shared(py, intern!(py, "_untrack"), name);
            with_table(|t| t.made.remove(name));
        }
        if !in_flight || Instant::now() >= deadline {
            break;
        }
        // The threads giving notices need the GIL to finish.
        py.detach(|| {
            let guard = table();
            drop(SETTLED.wait_timeout(guard, Duration::from_millis(20)));
        });
    }
    unlink_untold();
}

/// Unlinks the segments the tracker was never told of (made after the sweep).
fn unlink_untold() {
    with_table(|t| {
        t.made.retain(|name, notice| {
            if *notice == Notice::Untold {
                segment::unlink(name);
                return false;
            }
            true
        })
    });
}

/// Registers, once per process, the last unlink: at the end of interpreter
/// finalization, when no thread runs Python, of whatever is left.
fn unlink_at_the_very_end() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        extern "C" fn at_exit() {
            // Never blocks at exit: a lock held now stays held.
            let Ok(mut guard) = TABLE.try_lock() else { return };
            if let Some(t) = guard.as_mut().filter(|t| t.made_by == std::process::id()) {
                for name in t.made.keys() {
                    segment::unlink(name);
                }
                t.made.clear();
            }
        }
        // SAFETY: registers a function with no Python in it, as Py_AtExit requires.
        unsafe { ffi::Py_AtExit(Some(at_exit)) };
    });
}

/// `dlbridge._shared.<function>(name)`: the tracker's notices, in Python.
fn call_shared(py: Python<'_>, function: &Bound<'_, pyo3::types::PyString>, name: &str) -> PyResult<()> {
    let module = crate::python_calls::import(py, intern!(py, "dlbridge._shared"))?;
    let function = module.getattr(function)?;
    crate::python_calls::call1(&function, pyo3::types::PyString::new(py, name).as_any()).map(drop)
}

/// `dlb<pid namespace>_<pid>_<random>`, all hex: `cleanup_shared_memory()`
/// judges a segment's creator by it.
fn new_name() -> String {
    use std::hash::{BuildHasher, Hasher};
    use std::os::unix::fs::MetadataExt;
    let namespace = std::fs::metadata("/proc/self/ns/pid").map_or(0, |m| m.ino());
    let random = std::collections::hash_map::RandomState::new().build_hasher().finish() as u32;
    format!("dlb{namespace:x}_{:x}_{random:08x}", std::process::id())
}
