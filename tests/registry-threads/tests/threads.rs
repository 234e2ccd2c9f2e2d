//! Many threads borrow overlapping ranges of one buffer through one
//! `Locked` table, as extensions do on a free-threaded build, and use the
//! memory as the borrows allow: a writer fills its range, a reader checks
//! that what it reads does not change while it holds its borrow. Plain
//! (non-atomic) memory accesses, so that ThreadSanitizer sees any two that
//! the table failed to keep apart, and the values show it without TSan.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicUsize, Ordering};

use registry_threads::table::{Locked, Refused};

const WORDS: usize = 64;
const THREADS: usize = 8;
const ROUNDS: usize = 4000;

/// Memory that Rust code reaches only under a borrow of the table.
struct Memory(UnsafeCell<[u64; WORDS]>);

// SAFETY: every access below is made under a borrow from the table, which keeps
// writers apart from readers and from each other (what the test checks).
unsafe impl Sync for Memory {}

/// A small deterministic generator, one per thread.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

#[test]
fn borrows_keep_writers_apart_from_readers_and_each_other() {
    let table = Locked::new();
    let memory = Memory(UnsafeCell::new([0; WORDS]));
    let base = memory.0.get() as usize;
    let (granted, refused) = (AtomicUsize::new(0), AtomicUsize::new(0));
    std::thread::scope(|scope| {
        for thread in 0..THREADS {
            let (table, memory, granted, refused) = (&table, &memory, &granted, &refused);
            scope.spawn(move || {
                let mut rng = 0x9E37_79B9_7F4A_7C15 ^ (thread as u64 + 1);
                for round in 0..ROUNDS {
                    let first = (next(&mut rng) % WORDS as u64) as usize;
                    let len = 1 + (next(&mut rng) % 8) as usize;
                    let last = (first + len).min(WORDS);
                    let exclusive = next(&mut rng) % 3 == 0;
                    let (start, end) = (base + first * 8, base + last * 8);
                    // SAFETY: no Python here; `acquire` calls nothing out.
                    let id = match unsafe { table.with(|b| b.acquire(1, start, end, exclusive)) } {
                        Ok(id) => id,
                        Err(Refused::Conflict { start: s, end: e, .. }) => {
                            assert!(s < end && start < e, "a conflict names an overlapping borrow");
                            refused.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                        Err(Refused::NoMemory) => panic!("no memory for a borrow"),
                    };
                    granted.fetch_add(1, Ordering::Relaxed);
                    let words = memory.0.get().cast::<u64>();
                    let stamp = ((thread as u64) << 32) | round as u64;
                    for i in first..last {
                        // SAFETY: in bounds; this thread holds a borrow of word `i`.
                        unsafe {
                            if exclusive {
                                words.add(i).write(stamp);
                            } else {
                                let before = words.add(i).read();
                                std::hint::spin_loop();
                                assert_eq!(words.add(i).read(), before, "a word changed under its reader");
                            }
                        }
                    }
                    if exclusive {
                        for i in first..last {
                            // SAFETY: as above.
                            assert_eq!(unsafe { words.add(i).read() }, stamp, "another writer wrote under this one");
                        }
                    }
                    // SAFETY: as above.
                    unsafe { table.with(|b| b.release(id)) };
                }
            });
        }
    });
    // SAFETY: no thread runs any more.
    assert_eq!(unsafe { table.with(|b| b.count()) }, 0, "every borrow was released");
    let (granted, refused) = (granted.into_inner(), refused.into_inner());
    println!("{granted} borrows granted, {refused} refused as conflicts");
    assert!(granted > 0 && refused > 0, "the threads met: {granted} granted, {refused} refused");
}

#[test]
fn a_conflict_names_the_borrow_in_the_way() {
    let table = Locked::new();
    // SAFETY: one thread, no Python.
    unsafe {
        let reader = table.with(|b| b.acquire(1, 100, 200, false)).unwrap();
        assert!(table.with(|b| b.acquire(1, 150, 160, false)).is_ok(), "readers share");
        assert_eq!(table.with(|b| b.acquire(1, 199, 300, true)), Err(Refused::Conflict { start: 100, end: 200, exclusive: false }));
        assert!(table.with(|b| b.acquire(2, 100, 200, true)).is_ok(), "another address space");
        table.with(|b| b.release(reader));
        table.with(|b| b.release(0)); // ignored
    }
}
