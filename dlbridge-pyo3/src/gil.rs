//! Blocking CUDA driver calls run without the GIL.
//!
//! A synchronisation, a synchronous copy, a pinned allocation or a free can
//! wait for GPU work for as long as it runs. Holding the GIL meanwhile would
//! stall every other Python thread, and deadlock against host callbacks that
//! need it (CuPy's `launch_host_func`, numba's `add_callback`) queued before
//! the work waited for. The core runs those calls through a hook
//! (`dlbridge::cuda::set_blocking_hook`); this one detaches from Python around
//! them when the calling thread holds the GIL. Nothing Python is touched
//! inside: the memory involved is owned, or kept alive by the caller.

use pyo3::{ffi, Python};

/// A `&mut dyn FnMut()` to run on this same thread once detached.
struct SameThread<'a>(&'a mut dyn FnMut());

// SAFETY: `Python::detach` runs its closure on the calling thread, before it
// returns; the function never leaves this thread.
unsafe impl Send for SameThread<'_> {}

impl SameThread<'_> {
    // Taking the whole value makes a closure capture all of it (Send), not
    // its field (which is not).
    fn run(self) {
        (self.0)();
    }
}

/// Whether the calling thread holds the GIL. Safe on any thread, with or
/// without it. (PyGILState_Check answers 1 on every thread once a
/// sub-interpreter exists, and detaching without the GIL is fatal.)
pub(crate) fn holds_gil() -> bool {
    // SAFETY: reads the current thread state, which may be NULL; allowed
    // without the GIL.
    let current = unsafe { ffi::compat::PyThreadState_GetUnchecked() };
    if current.is_null() {
        return false;
    }
    // From 3.12 the current state is the calling thread's own. Before, it is
    // the state of whichever thread holds the GIL, so it must be this
    // thread's (what PyGILState_Check compares).
    // SAFETY: this thread's auto state, or NULL; allowed without the GIL.
    thread_local_current_state() || current == unsafe { ffi::PyGILState_GetThisThreadState() }
}

/// Whether this interpreter keeps the current thread state per thread (3.12 and later).
fn thread_local_current_state() -> bool {
    static KNOWN: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *KNOWN.get_or_init(|| {
        // SAFETY: a static string, "3.11.7 (main, ...)", readable on any thread.
        let version = unsafe { core::ffi::CStr::from_ptr(ffi::Py_GetVersion()) }.to_bytes();
        let mut parts = version.split(|&b| b == b'.' || b == b' ');
        let number = |part: Option<&[u8]>| core::str::from_utf8(part.unwrap_or_default()).ok()?.parse::<u32>().ok();
        matches!((number(parts.next()), number(parts.next())), (Some(major), Some(minor)) if (major, minor) >= (3, 12))
    })
}

fn detached(call: &mut dyn FnMut()) {
    if holds_gil() {
        // SAFETY: this thread holds the GIL (checked just above).
        let py = unsafe { Python::assume_attached() };
        let call = SameThread(call);
        py.detach(move || call.run());
    } else {
        call();
    }
}

/// Installs the hook (once per copy of the core: each extension links its own).
pub(crate) fn release_in_driver_calls() {
    dlbridge::cuda::set_blocking_hook(detached);
}
