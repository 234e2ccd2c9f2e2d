//! Whether a tensor's memory may be written, as dlbridge relays it.
//!
//! # The rule
//! - A versioned (`dltensor_versioned`) import is **read-only** when its producer
//!   set READ_ONLY, else **writable**; so are the buffer protocol (its `readonly`)
//!   and the array interfaces (their `data` tuple's read-only flag).
//! - A legacy (`dltensor`) capsule cannot say, so its writability is **unknown**.
//!   JAX and TensorFlow export immutable arrays this way.
//! - Unknown is never upgraded to writable: `Tensor.readonly` is True, versioned
//!   exports carry READ_ONLY, the buffer protocol and `__array_interface__` say
//!   read-only, and `PyTensorMut` refuses it. A legacy export is still allowed,
//!   since a legacy consumer (JAX, TensorFlow, tvm-ffi) loses nothing it had.
//! - A read-only tensor refuses a legacy export unless `copy=True`, as the
//!   array API says; a copy is always writable.

use dlbridge::ffi::DLPACK_FLAG_BITMASK_READ_ONLY;

use crate::any_owned::AnyOwned;

/// What the producer said about writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Writability {
    /// The producer allows writes.
    Writable,
    /// The producer forbids writes (READ_ONLY, a read-only buffer).
    ReadOnly,
    /// The producer could not say (a legacy capsule).
    Unknown,
}

impl Writability {
    /// What an owned import's ABI and flags say.
    pub fn of(owned: &AnyOwned) -> Self {
        match owned {
            AnyOwned::Legacy(_) => Writability::Unknown,
            owned if owned.is_read_only() => Writability::ReadOnly,
            _ => Writability::Writable,
        }
    }

    /// Whether writes are known to be allowed.
    pub fn is_writable(self) -> bool {
        self == Writability::Writable
    }

    /// The flags a versioned export carries: READ_ONLY unless known writable.
    pub fn flags(self) -> u64 {
        if self.is_writable() { 0 } else { DLPACK_FLAG_BITMASK_READ_ONLY }
    }

    /// Whether a legacy capsule may be exported without a copy.
    pub fn allows_legacy_export(self) -> bool {
        self != Writability::ReadOnly
    }

    /// Its name, as `Tensor._writability` and pickles carry it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Writability::Writable => "writable",
            Writability::ReadOnly => "readonly",
            Writability::Unknown => "unknown",
        }
    }

    pub(crate) fn from_name(name: &str) -> Option<Self> {
        [Writability::Writable, Writability::ReadOnly, Writability::Unknown].into_iter().find(|w| w.name() == name)
    }
}
