//! A thread ended by `pthread_exit` inside a guarded call (as CPython ends a
//! daemon thread that takes the GIL back at interpreter exit) parks there: no
//! Rust frame outside the call is unwound (a destructor would run; std's
//! `catch_unwind` around the thread would abort the process).
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
        // SAFETY: the closure only calls pthread_exit, a foreign call that ends the thread.
        unsafe { dlbridge::thread_exit::parking_on_exit(|| libc::pthread_exit(core::ptr::null_mut())) };
        RETURNED.store(true, Ordering::SeqCst);
    });
    wait.recv().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert!(!UNWOUND.load(Ordering::SeqCst), "a Rust frame outside the guarded call was unwound");
    assert!(!RETURNED.load(Ordering::SeqCst), "the guarded call returned from pthread_exit");
}

#[test]
fn a_guarded_call_returns_its_result() {
    // SAFETY: the closure calls nothing that ends the thread.
    let value = unsafe { dlbridge::thread_exit::parking_on_exit(|| 6 * 7) };
    assert_eq!(value, 42);
}

