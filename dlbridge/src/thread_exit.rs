//! Calls into foreign code that may end the calling thread.
//!
//! glibc's `pthread_exit` ends a thread by unwinding its stack ("forced
//! unwinding"), and CPython 3.10 to 3.13 call it when a daemon thread takes
//! the GIL back during interpreter exit: in a finalizer that sleeps, in a
//! deleter that takes the GIL, anywhere Python code runs. Rust frames cannot
//! be unwound that way: `catch_unwind` (in every PyO3 trampoline) aborts the
//! process ("FATAL: exception not rethrown"), and unwinding out of an
//! `extern "C"` call is undefined behaviour. So the foreign calls that may take
//! the GIL back (deleters, releases of Python references, taking the GIL) go
//! through [`parking_on_exit`]: a thread ended inside one parks there for
//! good, before any Rust frame is unwound, as CPython 3.14 parks such threads
//! itself. The process exits around it; NumPy's C frames need nothing of the
//! kind, since C frames unwind without running anything.
//!
//! How: a glibc cleanup handler (`_pthread_cleanup_push`, looked up at run
//! time, so that no symbol version of a newer glibc is linked) registered in
//! the guarding frame runs, and never returns, when the unwind is about to
//! leave that frame's caller: glibc judges a handler by the stack pointer of
//! the frame being unwound. So neither the guarding frame nor the frames of the
//! call may have anything to run on unwinding (no destructors; no
//! `catch_unwind`): the unwinder would run it first. Elsewhere (musl and macOS
//! end threads without unwinding; Miri) the call is made as it is.

use core::ffi::c_void;
use core::sync::atomic::{AtomicU64, Ordering};

/// A thread that is never ended so (`pthread_self` of it; 0 for none): the
/// one that will finalize the interpreter, CPython's main thread. Calls on it
/// skip the handler, whose push and pop cost a tenth of a quick call.
static UNENDED: AtomicU64 = AtomicU64::new(0);

/// Says that the thread whose `pthread_self()` is `thread` is never ended by
/// `pthread_exit` (CPython's main thread, which finalizes the interpreter and
/// which CPython never ends): guarded calls on it run as they are.
pub fn set_unended_thread(thread: u64) {
    UNENDED.store(thread, Ordering::Relaxed);
}

/// Whether the calling thread is the one [`set_unended_thread`] named.
#[inline]
fn on_unended_thread() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu", not(miri)))]
    {
        let unended = UNENDED.load(Ordering::Relaxed);
        // SAFETY: pthread_self may be called on any thread.
        unended != 0 && unended == unsafe { libc::pthread_self() } as u64
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu", not(miri))))]
    true
}

/// Calls `call`; if the thread is ended inside it by `pthread_exit` (forced
/// unwinding), the thread parks forever instead of unwinding any frame outside
/// the call.
///
/// # Safety
/// `call` must be sound to call, must not panic, and must be a plain frame:
/// the frames inside the guard are unwound first, so it makes foreign calls
/// only (Python's, a deleter), with no value that has a destructor alive
/// across them. (Its captures are `Copy`, so they have none.)
#[inline]
pub unsafe fn parking_on_exit<R: Copy, F: FnOnce() -> R + Copy>(call: F) -> R {
    if on_unended_thread() {
        return call();
    }
    /// The closure and, once it ran, its result.
    struct Slot<F, R> {
        call: F,
        result: Option<R>,
    }
    unsafe extern "C-unwind" fn run<F: FnOnce() -> R + Copy, R: Copy>(slot: *mut c_void) {
        // SAFETY: the slot below, alive for the call.
        let slot = unsafe { &mut *slot.cast::<Slot<F, R>>() };
        slot.result = Some((slot.call)());
    }
    let mut slot = Slot { call, result: None };
    let arg = core::ptr::from_mut(&mut slot).cast::<c_void>();
    // SAFETY: `run` calls the caller's closure, a plain frame (the caller's contract).
    unsafe { guarded(run::<F, R>, arg) };
    match slot.result {
        Some(result) => result,
        // `run` returns only after storing the result.
        None => unreachable_result(),
    }
}

#[cold]
fn unreachable_result() -> ! {
    std::process::abort()
}

/// `call(arg)`, guarded where glibc can be asked to.
///
/// # Safety
/// `call(arg)` is sound to call and a plain frame.
unsafe fn guarded(call: unsafe extern "C-unwind" fn(*mut c_void), arg: *mut c_void) {
    #[cfg(all(target_os = "linux", target_env = "gnu", not(miri)))]
    if let Some(handlers) = glibc::handlers() {
        // SAFETY: forwarded from the caller.
        return unsafe { glibc::guarded(handlers, call, arg) };
    }
    // SAFETY: forwarded from the caller.
    unsafe { call(arg) }
}

#[cfg(all(target_os = "linux", target_env = "gnu", not(miri)))]
mod glibc {
    use core::ffi::{c_int, c_void, CStr};
    use core::mem::MaybeUninit;
    use std::sync::OnceLock;

    /// glibc's `struct _pthread_cleanup_buffer` (the same on every architecture).
    #[repr(C)]
    pub(super) struct CleanupBuffer {
        routine: Option<unsafe extern "C" fn(*mut c_void)>,
        arg: *mut c_void,
        canceltype: c_int,
        prev: *mut CleanupBuffer,
    }

    type Push = unsafe extern "C" fn(*mut CleanupBuffer, unsafe extern "C" fn(*mut c_void), *mut c_void);
    type Pop = unsafe extern "C" fn(*mut CleanupBuffer, c_int);

    #[derive(Clone, Copy)]
    pub(super) struct Handlers {
        push: Push,
        pop: Pop,
    }

    /// `_pthread_cleanup_push` and `_pthread_cleanup_pop`, found once.
    pub(super) fn handlers() -> Option<Handlers> {
        static FOUND: OnceLock<Option<Handlers>> = OnceLock::new();
        *FOUND.get_or_init(|| {
            let find = |name: &CStr| {
                // SAFETY: a lookup by NUL-terminated name in the loaded objects.
                let address = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
                (!address.is_null()).then_some(address)
            };
            let (push, pop) = (find(c"_pthread_cleanup_push")?, find(c"_pthread_cleanup_pop")?);
            // SAFETY: glibc's functions of these signatures (sys/pthread.h, since glibc 2.0).
            unsafe { Some(Handlers { push: core::mem::transmute::<*mut c_void, Push>(push), pop: core::mem::transmute::<*mut c_void, Pop>(pop) }) }
        })
    }

    /// Never returns: the thread's end was asked for inside a guarded call.
    unsafe extern "C" fn park_forever(_: *mut c_void) {
        loop {
            // SAFETY: waits for a signal; always safe.
            unsafe { libc::pause() };
        }
    }

    /// The buffer lives in this frame, so glibc runs `park_forever` when a
    /// forced unwind reaches this frame's caller, after the frames of `call`
    /// and this one (which hold nothing to run on unwinding: no drop guard,
    /// so the pop is explicit, and `call` must not panic).
    #[inline(never)]
    pub(super) unsafe fn guarded(handlers: Handlers, call: unsafe extern "C-unwind" fn(*mut c_void), arg: *mut c_void) {
        let mut buffer = MaybeUninit::<CleanupBuffer>::uninit();
        // SAFETY: glibc fills the buffer and links it into this thread's list;
        // it is unlinked below, before the frame ends (`call` does not unwind
        // but by ending the thread, when the handler parks it here).
        unsafe {
            (handlers.push)(buffer.as_mut_ptr(), park_forever, core::ptr::null_mut());
            call(arg);
            // 0: unlink it without running it.
            (handlers.pop)(buffer.as_mut_ptr(), 0);
        }
    }
}
