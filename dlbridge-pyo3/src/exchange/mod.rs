//! The DLPack 1.3 C exchange API, both directions.
//!
//! - `producer.rs`: `dlbridge.Tensor.__dlpack_c_exchange_api__`, a
//!   `"dlpack_exchange_api"` capsule pointing at [`EXCHANGE_API`], a static
//!   table whose five functions all work.
//! - `consumer.rs`: finding another type's table, and importing through it
//!   exactly as that type's `__dlpack__` would (or not at all);
//! - `guard.rs`: the checks a table skips (torch's), and when to make them.

mod consumer;
mod guard;
mod producer;

pub(crate) use consumer::{fill_borrowed, import_owned, lookup};
pub use consumer::Table;
pub use guard::{Guard, TorchChecks};
pub(crate) use producer::exchange_api_capsule;
pub use producer::{EXCHANGE_API, EXCHANGE_API_CAPSULE_NAME};
#[cfg(feature = "testing")]
pub(crate) use producer::CALLS;
