//! The live borrows of a process: byte ranges of address spaces, each shared
//! or exclusive, and the lock they live behind.
//!
//! Plain Rust with no Python in it, so that `tests/registry-threads` drives
//! the very code here from many threads under ThreadSanitizer (it includes
//! this file by path, built as free-threaded builds build it).

use std::collections::TryReserveError;

/// One live borrow.
#[derive(Clone, Copy, Debug)]
struct Entry {
    id: u64,
    space: u64,
    start: usize,
    end: usize,
    exclusive: bool,
}

/// Why a borrow was not recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// It overlaps this live borrow: a shared one conflicts with an exclusive
    /// one, an exclusive one with any.
    Conflict { start: usize, end: usize, exclusive: bool },
    /// There was no memory to record it.
    NoMemory,
}

/// The live borrows, and the next id to give out (ids start at 1; 0 means none).
#[derive(Debug)]
pub struct Borrows {
    live: Vec<Entry>,
    next_id: u64,
}

impl Borrows {
    /// No borrows.
    pub const fn new() -> Self {
        Borrows { live: Vec::new(), next_id: 1 }
    }

    /// Records a borrow of bytes `start..end` (non-empty) of address space
    /// `space`, or says why not.
    pub fn acquire(&mut self, space: u64, start: usize, end: usize, exclusive: bool) -> Result<u64, Refused> {
        let clash = self.live.iter().find(|e| e.space == space && e.start < end && start < e.end && (exclusive || e.exclusive));
        if let Some(other) = clash {
            return Err(Refused::Conflict { start: other.start, end: other.end, exclusive: other.exclusive });
        }
        // No allocation on the common path: the list keeps its capacity.
        self.live.try_reserve(1).map_err(|_: TryReserveError| Refused::NoMemory)?;
        let id = self.next_id;
        self.next_id += 1;
        self.live.push(Entry { id, space, start, end, exclusive });
        Ok(id)
    }

    /// Ends borrow `id`; unknown ids (0 included) are ignored.
    pub fn release(&mut self, id: u64) {
        if let Some(i) = self.live.iter().rposition(|e| e.id == id) {
            self.live.swap_remove(i);
        }
    }

    /// How many borrows are live.
    pub fn count(&self) -> usize {
        self.live.len()
    }
}

impl Default for Borrows {
    fn default() -> Self {
        Self::new()
    }
}

/// [`Borrows`] behind the process's lock. On builds with a GIL, every caller
/// holds the GIL, which is the lock: a borrow costs no atomic instruction
/// (a mutex would cost two, a tenth of a one-argument extension call). On
/// free-threaded builds (`Py_GIL_DISABLED`), a mutex; nothing is called out
/// while it is held, so it is never held across Python code.
pub struct Locked {
    #[cfg(Py_GIL_DISABLED)]
    borrows: std::sync::Mutex<Borrows>,
    #[cfg(not(Py_GIL_DISABLED))]
    borrows: core::cell::UnsafeCell<Borrows>,
}

// SAFETY: with a GIL, the cell is reached only through `with`, whose callers
// hold the GIL, which one thread holds at a time; without one, a mutex.
#[cfg(not(Py_GIL_DISABLED))]
unsafe impl Sync for Locked {}

impl Locked {
    /// No borrows.
    pub const fn new() -> Self {
        #[cfg(Py_GIL_DISABLED)]
        return Locked { borrows: std::sync::Mutex::new(Borrows::new()) };
        #[cfg(not(Py_GIL_DISABLED))]
        return Locked { borrows: core::cell::UnsafeCell::new(Borrows::new()) };
    }

    /// Runs `f` on the borrows, alone.
    ///
    /// # Safety
    /// On builds with a GIL, the caller holds it. `f` calls nothing that
    /// could reach `with` again.
    pub unsafe fn with<R>(&self, f: impl FnOnce(&mut Borrows) -> R) -> R {
        #[cfg(Py_GIL_DISABLED)]
        {
            // A panic while held is impossible (nothing in `Borrows` panics);
            // a poisoned lock still holds consistent borrows.
            let mut borrows = self.borrows.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            f(&mut borrows)
        }
        #[cfg(not(Py_GIL_DISABLED))]
        // SAFETY: the GIL excludes every other thread (the caller's contract),
        // and `f` does not reenter, so this is the only reference.
        f(unsafe { &mut *self.borrows.get() })
    }
}

impl Default for Locked {
    fn default() -> Self {
        Self::new()
    }
}
