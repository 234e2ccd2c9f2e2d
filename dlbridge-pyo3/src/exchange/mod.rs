//! The DLPack 1.3 C exchange API, as a consumer: other types' tables.
//!
//! - `consumer.rs`: finding another type's table, and importing through it
//!   exactly as that type's `__dlpack__` would (or not at all);
//! - `guard.rs`: the checks a table skips (torch's), and when to make them;
//!   and whether its fill may be written (its export would say so);
//! - here: what both read of a table chain and of a type.
//!
//! dlbridge's own table, which `dlbridge.Tensor` publishes, is in
//! `tensor/exchange_table.rs`.

use core::ffi::CStr;

use dlbridge::ffi::{DLPackExchangeAPI, DLPackExchangeAPIHeader, DLPACK_MAJOR_VERSION};

mod consumer;
mod guard;

pub(crate) use consumer::{fill_borrowed, import_owned, lookup};
pub use consumer::Table;
pub use guard::{Guard, TorchChecks};

/// The name of the capsule that carries a `DLPackExchangeAPI`.
pub const EXCHANGE_API_CAPSULE_NAME: &CStr = c"dlpack_exchange_api";

/// The newest table in a chain whose major version this crate speaks.
///
/// # Safety
/// `header` must be NULL or point at a live table whose `prev_api` chain is
/// NULL-terminated; tables are static by the header's rules.
pub(crate) unsafe fn compatible(mut header: *const DLPackExchangeAPIHeader) -> Option<&'static DLPackExchangeAPI> {
    for _ in 0..16 {
        if header.is_null() {
            return None;
        }
        // SAFETY: forwarded from the caller.
        let h = unsafe { &*header };
        if h.version.major == DLPACK_MAJOR_VERSION {
            // SAFETY: a header with our major heads a `DLPackExchangeAPI` of our layout.
            return Some(unsafe { &*header.cast::<DLPackExchangeAPI>() });
        }
        header = h.prev_api;
    }
    None
}
