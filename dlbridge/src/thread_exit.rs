//! Threads that foreign code may end while they are inside Rust frames.
//!
//! glibc's `pthread_exit` ends a thread by unwinding its stack ("forced
//! unwinding"), and CPython 3.10 to 3.13 call it when a daemon thread takes
//! the GIL back during interpreter exit: in a finalizer that sleeps, in a
//! deleter that takes the GIL, in a user's `__index__` or property, anywhere
//! Python code runs. Rust frames cannot be unwound that way: `catch_unwind`
//! (in every PyO3 trampoline) aborts the process ("FATAL: exception not
//! rethrown"), and unwinding out of an `extern "C"` call is undefined
//! behaviour. So every way into dlbridge from Python, and every foreign call
//! that may take the GIL (deleters, releases of Python references), first
//! calls [`park_this_thread_if_ended`]: from then on, if the thread is ended
//! so, it parks for good before any frame is unwound, as CPython 3.14 parks
//! such threads itself. The process exits around it. A thread that returns
//! ends as before; one that foreign code ends on purpose later (cancellation,
//! a C library's `pthread_exit`) parks too.
//!
//! How: a glibc cleanup handler (`_pthread_cleanup_push`, looked up at run
//! time, so that no symbol version of a newer glibc is linked) whose buffer
//! lives off the stack, pushed once per thread and popped when the thread's
//! locals end. glibc runs a handler once the unwind has left the frame that
//! holds its buffer, comparing addresses from the stack's top (`unwind_stop`);
//! an address off the stack counts as left by every frame, so the handler
//! (which never returns) runs at the first frame. Elsewhere (musl and macOS
//! end threads without unwinding; Miri) nothing is registered.

use core::sync::atomic::{AtomicU64, Ordering};

/// The thread that last found itself registered (`pthread_self` of it; 0 for
/// none), so that a run of calls on one thread (the main thread, mostly) costs
/// a load and a compare. Cleared by that thread's end, before glibc can give
/// its `pthread_t` to a new thread, and in a forked child.
static LAST_REGISTERED: AtomicU64 = AtomicU64::new(0);

/// Makes the calling thread park, from now until it ends, if `pthread_exit`
/// ends it (or it is cancelled): whatever frames are then on its stack (Rust
/// ones with destructors, PyO3's `catch_unwind`, Python code a conversion
/// ran), none is unwound. One registration per thread; a check after.
#[inline]
pub fn park_this_thread_if_ended() {
    #[cfg(all(target_os = "linux", target_env = "gnu", not(miri)))]
    {
        // SAFETY: pthread_self may be called on any thread.
        let this = unsafe { libc::pthread_self() } as u64;
        if LAST_REGISTERED.load(Ordering::Relaxed) != this {
            glibc::register(this);
        }
    }
}

/// Calls `call`, a foreign call that may end the thread (a deleter, taking
/// the GIL, releasing a Python reference), with the thread registered first.
#[inline]
pub fn parking_on_exit<R>(call: impl FnOnce() -> R) -> R {
    park_this_thread_if_ended();
    call()
}

#[cfg(all(target_os = "linux", target_env = "gnu", not(miri)))]
mod glibc {
    use core::ffi::{c_int, c_void, CStr};
    use core::mem::MaybeUninit;
    use core::sync::atomic::Ordering;
    use std::sync::OnceLock;

    /// glibc's `struct _pthread_cleanup_buffer` (the same on every architecture).
    #[repr(C)]
    struct CleanupBuffer {
        routine: Option<unsafe extern "C" fn(*mut c_void)>,
        arg: *mut c_void,
        canceltype: c_int,
        prev: *mut CleanupBuffer,
    }

    type Push = unsafe extern "C" fn(*mut CleanupBuffer, unsafe extern "C" fn(*mut c_void), *mut c_void);
    type Pop = unsafe extern "C" fn(*mut CleanupBuffer, c_int);

    #[derive(Clone, Copy)]
    struct Handlers {
        push: Push,
        pop: Pop,
    }

    /// `_pthread_cleanup_push` and `_pthread_cleanup_pop`, found once.
    fn handlers() -> Option<Handlers> {
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

    /// Never returns: the thread's end was asked for after it registered.
    unsafe extern "C" fn park_forever(_: *mut c_void) {
        loop {
            // SAFETY: waits for a signal; always safe.
            unsafe { libc::pause() };
        }
    }

    /// A cleanup buffer off the stack, linked into its thread's list for the
    /// thread's life. glibc runs a buffer's handler once the unwind has left
    /// the buffer's frame, comparing addresses with the stack's top as origin
    /// (`unwind_stop`): an address off the thread's stack counts as left by
    /// every frame, so the handler runs at the first frame, before any is unwound.
    struct ThreadRegistration {
        handler: Option<(Box<MaybeUninit<CleanupBuffer>>, Handlers)>,
        /// `pthread_self` of the thread, once it registered.
        thread: core::cell::Cell<u64>,
    }

    impl ThreadRegistration {
        fn new() -> Self {
            let handler = handlers().map(|handlers| {
                let mut buffer = Box::new(MaybeUninit::<CleanupBuffer>::uninit());
                // SAFETY: glibc fills the buffer and links it into this thread's
                // list; the box lives until the thread-local's destructor unlinks it.
                unsafe { (handlers.push)(buffer.as_mut_ptr(), park_forever, core::ptr::null_mut()) };
                (buffer, handlers)
            });
            ThreadRegistration { handler, thread: core::cell::Cell::new(0) }
        }
    }

    impl Drop for ThreadRegistration {
        fn drop(&mut self) {
            // A new thread may get this one's pthread_t: it is not registered.
            let _ = super::LAST_REGISTERED.compare_exchange(self.thread.get(), 0, Ordering::Relaxed, Ordering::Relaxed);
            // The thread returned (thread-locals end after its function):
            // every buffer pushed since was popped, so this one is the head.
            if let Some((buffer, handlers)) = &mut self.handler {
                // SAFETY: the buffer `new` linked; 0: unlinked without running it.
                unsafe { (handlers.pop)(buffer.as_mut_ptr(), 0) };
            }
        }
    }

    thread_local! {
        static REGISTRATION: ThreadRegistration = ThreadRegistration::new();
    }

    /// In a forked child, the parent's other threads are gone and glibc gives
    /// their stacks, and so their `pthread_t`s, to the child's new threads.
    extern "C" fn forget_after_fork() {
        super::LAST_REGISTERED.store(0, Ordering::Relaxed);
    }

    #[cold]
    pub(super) fn register(this: u64) {
        static FORK_HANDLER: std::sync::Once = std::sync::Once::new();
        // SAFETY: a handler that stores to an atomic, as a forked child may.
        FORK_HANDLER.call_once(|| unsafe {
            libc::pthread_atfork(None, None, Some(forget_after_fork));
        });
        // Err only while the thread's locals are destroyed: it is ending by
        // returning, and is not remembered as registered.
        if REGISTRATION.try_with(|registration| registration.thread.set(this)).is_ok() {
            super::LAST_REGISTERED.store(this, Ordering::Relaxed);
        }
    }
}
