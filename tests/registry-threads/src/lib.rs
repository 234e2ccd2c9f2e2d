//! `dlbridge-pyo3`'s borrow table (`src/borrows/table.rs`), the very file,
//! built with `Py_GIL_DISABLED` as a free-threaded build builds it, so that
//! tests drive it from many threads without Python: `cargo test` checks the
//! registry's promise by values, and `./dev tsan` runs the same tests under
//! ThreadSanitizer, which reports any access the lock does not order.
#[path = "../../../dlbridge-pyo3/src/borrows/table.rs"]
pub mod table;
