//! The DLPack 1.3 C exchange API, as a consumer: other types' tables.
//!
//! - `consumer.rs`: finding another type's table, and importing through it
//!   exactly as that type's `__dlpack__` would (or not at all);
//! - `guard.rs`: the checks a table skips (torch's), and when to make them;
//!   and whether its fill may be written (its export would say so).
//!
//! dlbridge's own table, which `dlbridge.Tensor` publishes, is in
//! `tensor/exchange_table.rs`.

use core::ffi::CStr;

mod consumer;
mod guard;

pub(crate) use consumer::{fill_borrowed, import_owned, lookup};
pub use consumer::Table;
pub use guard::{Guard, TorchChecks};

/// The name of the capsule that carries a `DLPackExchangeAPI`.
pub const EXCHANGE_API_CAPSULE_NAME: &CStr = c"dlpack_exchange_api";
