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

fn detached(call: &mut dyn FnMut()) {
    // Whether this thread holds the GIL: its thread state is the current one.
    // (PyGILState_Check answers 1 on every thread once a sub-interpreter
    // exists, and detaching without the GIL is a fatal error.)
    // SAFETY: reads the calling thread's current state, which may be NULL;
    // safe on any thread, with or without the GIL.
    if unsafe { !ffi::compat::PyThreadState_GetUnchecked().is_null() } {
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
