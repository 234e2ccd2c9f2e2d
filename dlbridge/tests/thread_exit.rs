//! A thread ended by `pthread_exit` once it registered (as CPython ends a
//! daemon thread that takes the GIL back at interpreter exit) parks there: no
//! Rust frame is unwound (a destructor would run; std's `catch_unwind` around
//! the thread would abort the process).
#![cfg(all(target_os = "linux", target_env = "gnu", not(miri)))]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

static UNWOUND: AtomicBool = AtomicBool::new(false);
static RETURNED: AtomicBool = AtomicBool::new(false);

struct Marker;

impl Drop for Marker {
    fn drop(&mut self) {
        UNWOUND.store(true, Ordering::SeqCst);
    }
}

#[test]
fn a_thread_ended_inside_a_guarded_call_parks_without_unwinding_rust_frames() {
    let (entered, wait) = mpsc::channel();
    std::thread::spawn(move || {
        let _marker = Marker;
        entered.send(()).unwrap();
        // SAFETY: pthread_exit ends the thread; nothing after it runs.
        dlbridge::thread_exit::parking_on_exit(|| unsafe { libc::pthread_exit(core::ptr::null_mut()) });
        RETURNED.store(true, Ordering::SeqCst);
    });
    wait.recv().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert!(!UNWOUND.load(Ordering::SeqCst), "a Rust frame outside the guarded call was unwound");
    assert!(!RETURNED.load(Ordering::SeqCst), "the guarded call returned from pthread_exit");
}

#[test]
fn a_guarded_call_returns_its_result() {
    let value = dlbridge::thread_exit::parking_on_exit(|| 6 * 7);
    assert_eq!(value, 42);
}

#[test]
fn a_registered_thread_ended_anywhere_parks_without_unwinding_rust_frames() {
    static UNWOUND_HERE: AtomicBool = AtomicBool::new(false);
    struct MarkerHere;
    impl Drop for MarkerHere {
        fn drop(&mut self) {
            UNWOUND_HERE.store(true, Ordering::SeqCst);
        }
    }
    let (entered, wait) = mpsc::channel();
    std::thread::spawn(move || {
        dlbridge::thread_exit::park_this_thread_if_ended();
        // A frame with a destructor and std's catch_unwind (around every spawned
        // thread) between the registration and the end: neither may run.
        let _marker = MarkerHere;
        entered.send(()).unwrap();
        // SAFETY: ends the thread; nothing after it runs.
        unsafe { libc::pthread_exit(core::ptr::null_mut()) };
    });
    wait.recv().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert!(!UNWOUND_HERE.load(Ordering::SeqCst), "a Rust frame was unwound after the thread registered");
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
    static UNWOUND_REUSED: AtomicBool = AtomicBool::new(false);
    struct MarkerReused;
    impl Drop for MarkerReused {
        fn drop(&mut self) {
            UNWOUND_REUSED.store(true, Ordering::SeqCst);
        }
    }
    // SAFETY: pthread_self may be called on any thread.
    let ended = std::thread::spawn(|| {
        dlbridge::thread_exit::park_this_thread_if_ended();
        unsafe { libc::pthread_self() }
    })
    .join()
    .unwrap();
    // glibc gives a joined thread's stack, and with it its pthread_t, to the next thread.
    let (entered, wait) = mpsc::channel();
    std::thread::spawn(move || {
        // SAFETY: as above.
        let reused = unsafe { libc::pthread_self() } == ended;
        dlbridge::thread_exit::park_this_thread_if_ended();
        let _marker = MarkerReused;
        entered.send(reused).unwrap();
        // SAFETY: ends the thread; nothing after it runs.
        unsafe { libc::pthread_exit(core::ptr::null_mut()) };
    });
    let reused = wait.recv().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert!(!UNWOUND_REUSED.load(Ordering::SeqCst), "a thread with a reused pthread_t (reused: {reused}) was unwound");
}
