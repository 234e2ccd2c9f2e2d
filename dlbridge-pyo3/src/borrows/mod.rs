//! Live borrows of tensor memory by extension arguments, tracked by byte range
//! while an extension function runs, as rust-numpy's `borrow` module does.
//!
//! Any number of [`PyTensor`](crate::PyTensor)s may read the same bytes; a
//! [`PyTensorMut`](crate::PyTensorMut) needs its bytes to itself. So `f(a, a)`
//! with two writable arguments, or a writable and a read-only one over
//! overlapping memory, gets a BufferError for the second argument instead of
//! two aliasing Rust references. Ranges are conservative: two interleaved
//! views whose elements never meet but whose byte ranges overlap conflict too.
//! Python code that writes the same memory while the extension runs (from
//! another thread, or a callback) is outside what Rust borrows can see.

use core::ops::Range;
use core::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use dlbridge::{Device, TensorView};
use pyo3::exceptions::PyBufferError;
use pyo3::PyResult;

struct Entry {
    id: u64,
    space: Device,
    bytes: Range<usize>,
    exclusive: bool,
}

static LIVE: Mutex<Vec<Entry>> = Mutex::new(Vec::new());
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn live() -> std::sync::MutexGuard<'static, Vec<Entry>> {
    // A panic elsewhere cannot leave the list inconsistent: every change is one push or retain.
    LIVE.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Releases its borrow when dropped.
#[derive(Debug)]
pub(crate) struct Borrow {
    id: u64,
}

impl Drop for Borrow {
    fn drop(&mut self) {
        if self.id != 0 {
            live().retain(|e| e.id != self.id);
        }
    }
}

/// The address space a view's bytes live in: all CPU-reachable memory is one.
fn space_of(view: &TensorView<'_>) -> Device {
    if view.device().is_cpu_accessible() {
        Device::CPU
    } else {
        view.device()
    }
}

/// Registers a borrow of `view`'s bytes, refused if it conflicts with a live
/// one: a shared borrow conflicts with an exclusive one, an exclusive with any.
pub(crate) fn acquire(view: &TensorView<'_>, exclusive: bool) -> PyResult<Borrow> {
    let bytes = view.byte_range();
    if bytes.is_empty() {
        return Ok(Borrow { id: 0 });
    }
    let space = space_of(view);
    let mut live = live();
    let overlaps = |e: &&Entry| e.space == space && e.bytes.start < bytes.end && bytes.start < e.bytes.end;
    if let Some(other) = live.iter().find(|e| overlaps(e) && (exclusive || e.exclusive)) {
        let (mine, theirs) = if exclusive { ("writable", if other.exclusive { "writable" } else { "read-only" }) } else { ("read-only", "writable") };
        return Err(PyBufferError::new_err(format!(
            "cannot borrow this tensor as {mine}: its memory overlaps another argument already borrowed as {theirs} \
             (bytes {:#x}..{:#x}), and a Rust extension may not hold aliasing references",
            other.bytes.start, other.bytes.end
        )));
    }
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    live.push(Entry { id, space, bytes, exclusive });
    Ok(Borrow { id })
}

/// How many borrows are live (for tests).
#[cfg(feature = "testing")]
pub(crate) fn live_count() -> usize {
    live().len()
}
