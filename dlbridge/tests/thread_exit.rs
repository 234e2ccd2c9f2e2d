//! A thread ended by `pthread_exit` once it registered (as CPython ends a
//! daemon thread that takes the GIL back at interpreter exit) parks there: no
//! Rust frame is unwound (a destructor would run; std's `catch_unwind` around
//! the thread would abort the process).
#![cfg(all(target_os = "linux", target_env = "gnu", not(miri)))]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

/// Sets its flag when dropped: the frame that holds it was unwound.
struct Marker(Arc<AtomicBool>);

impl Drop for Marker {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Runs `body`, which ends its thread, on a new thread under a frame with a
/// destructor (and std's `catch_unwind`, around every spawned thread); whether
/// that frame was unwound.
fn unwound_when_ended(body: impl FnOnce() + Send + 'static) -> bool {
    let unwound = Arc::new(AtomicBool::new(false));
    let marker = Marker(Arc::clone(&unwound));
    let (entered, wait) = mpsc::channel();
    std::thread::spawn(move || {
        let _marker = marker;
        entered.send(()).unwrap();
        body();
    });
    wait.recv().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    unwound.load(Ordering::SeqCst)
}

fn end_thread() {
    // SAFETY: ends the calling thread; nothing after it runs.
    unsafe { libc::pthread_exit(core::ptr::null_mut()) }
}

fn this_thread() -> libc::pthread_t {
    // SAFETY: may be called on any thread.
    unsafe { libc::pthread_self() }
}

#[test]
fn a_thread_ended_inside_a_guarded_call_parks_without_unwinding_rust_frames() {
    let returned = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&returned);
    let unwound = unwound_when_ended(move || {
        dlbridge::thread_exit::parking_on_exit(end_thread);
        flag.store(true, Ordering::SeqCst);
    });
    assert!(!unwound, "a Rust frame outside the guarded call was unwound");
    assert!(!returned.load(Ordering::SeqCst), "the guarded call returned from pthread_exit");
}

#[test]
fn a_guarded_call_returns_its_result() {
    let value = dlbridge::thread_exit::parking_on_exit(|| 6 * 7);
    assert_eq!(value, 42);
}

#[test]
fn a_registered_thread_ended_anywhere_parks_without_unwinding_rust_frames() {
    let unwound = unwound_when_ended(|| {
        dlbridge::thread_exit::park_this_thread_if_ended();
        end_thread();
    });
    assert!(!unwound, "a Rust frame was unwound after the thread registered");
}

#[test]
fn a_registered_thread_that_returns_ends_normally() {
    // Its registration is undone when its locals end, whatever it called.
    let handle = std::thread::spawn(|| {
        dlbridge::thread_exit::park_this_thread_if_ended();
        dlbridge::thread_exit::park_this_thread_if_ended();
        dlbridge::thread_exit::parking_on_exit(|| 7)
    });
    assert_eq!(handle.join().unwrap(), 7);
}

#[test]
fn a_thread_given_an_ended_threads_pthread_t_registers_itself() {
    let ended = std::thread::spawn(|| {
        dlbridge::thread_exit::park_this_thread_if_ended();
        this_thread()
    })
    .join()
    .unwrap();
    // glibc gives a joined thread's stack, and with it its pthread_t, to the next thread.
    let reused = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&reused);
    let unwound = unwound_when_ended(move || {
        flag.store(this_thread() == ended, Ordering::SeqCst);
        dlbridge::thread_exit::park_this_thread_if_ended();
        end_thread();
    });
    let reused = reused.load(Ordering::SeqCst);
    assert!(!unwound, "a thread with a reused pthread_t (reused: {reused}) was unwound");
}
