//! A thread of a forked child is registered by itself, whatever pthread_t it
//! was given: glibc gives the child's next thread the stack (and so the
//! pthread_t) of a parent's thread, which may be the last one registered. Alone
//! in its binary, so that no other test's thread registers meanwhile.
#![cfg(all(target_os = "linux", target_env = "gnu", not(miri)))]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

#[test]
fn a_thread_of_a_forked_child_registers_itself() {
    // A registered thread alive at the fork is the last registered; in the child, glibc gives its
    // stack, and with it its pthread_t, to the child's next thread.
    let (registered, wait_registered) = mpsc::channel();
    let (release, wait_release) = mpsc::channel::<()>();
    let alive = std::thread::spawn(move || {
        dlbridge::thread_exit::park_this_thread_if_ended();
        // SAFETY: pthread_self may be called on any thread.
        registered.send(unsafe { libc::pthread_self() }).unwrap();
        wait_release.recv().unwrap();
    });
    let parent_thread = wait_registered.recv().unwrap();
    // SAFETY: the child only spawns a thread, sleeps and leaves with _exit.
    let child = unsafe { libc::fork() };
    if child == 0 {
        static UNWOUND_IN_CHILD: AtomicBool = AtomicBool::new(false);
        struct MarkerInChild;
        impl Drop for MarkerInChild {
            fn drop(&mut self) {
                UNWOUND_IN_CHILD.store(true, Ordering::SeqCst);
            }
        }
        std::thread::spawn(move || {
            // SAFETY: as above.
            let _reused = unsafe { libc::pthread_self() } == parent_thread;
            dlbridge::thread_exit::park_this_thread_if_ended();
            let _marker = MarkerInChild;
            // SAFETY: ends the thread; nothing after it runs.
            unsafe { libc::pthread_exit(core::ptr::null_mut()) };
        });
        std::thread::sleep(Duration::from_millis(200));
        // SAFETY: leaves the child at once, as a forked child of a threaded process must.
        unsafe { libc::_exit(i32::from(UNWOUND_IN_CHILD.load(Ordering::SeqCst))) };
    }
    let mut status = 0;
    // SAFETY: waits for the child just forked.
    assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
    release.send(()).unwrap();
    alive.join().unwrap();
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "the child's thread was unwound (status {status:#x})");
}
