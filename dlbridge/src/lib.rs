//! # dlbridge
//!
//! DLPack 1.3 for Rust: hand n-dimensional tensors to C, C++ and Python
//! libraries, and take theirs, without copying and without undefined behaviour
//! whatever a foreign producer sends.
//!
//! ```
//! use dlbridge::{DataType, ManagedTensor};
//!
//! // Export Rust memory: one allocation, the deleter drops the Vec.
//! let tensor = ManagedTensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?;
//!
//! // Hand it to C, and take it back, as a consumer would.
//! let raw = tensor.into_raw();
//! // SAFETY: `raw` is an owned managed tensor that nothing else uses.
//! let imported = unsafe { ManagedTensor::from_raw(raw) }?;
//!
//! // Everything after import is safe and validated.
//! let view = imported.view();
//! assert_eq!(view.shape(), &[2, 3]);
//! assert_eq!(view.strides(), &[3, 1]);
//! assert_eq!(view.dtype(), DataType::FLOAT32);
//! assert_eq!(view.dtype().to_string(), "float32");
//! assert_eq!(view.as_slice::<f32>(), Some(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0][..]));
//! # Ok::<(), dlbridge::Error>(())
//! ```
//!
//! ## Map
//! - [`ffi`]: the raw ABI, every struct, flag and function-pointer type of `dlpack.h` 1.3.
//! - [`DataType`], [`Device`]: value types, with the one dtype [`TABLE`](dtype::TABLE).
//! - [`TensorView`]: the one validation path for foreign tensors; safe accessors.
//! - [`ManagedTensor`], [`LegacyManagedTensor`]: owners that call the deleter exactly once.
//! - [`Managed::from_vec`], [`Managed::from_owner_mut`], [`Managed::from_owner`]: safe export.
//! - [`to_contiguous`], [`zeros`]: owned, 64-byte aligned copies and allocations.
//! - with feature `ndarray`: `TensorView::as_array` and `Managed::from_array`.
//!
//! ## Unsafe contract
//! Only two things are `unsafe`: taking a raw pointer from a producer
//! ([`Managed::from_raw`], [`TensorView::from_dltensor`]) and exporting memory
//! the crate cannot see the owner of ([`export::export_raw`]). The caller vouches
//! for the pointers; the crate checks every value.
#![deny(missing_docs, unsafe_op_in_unsafe_fn)]
// Nothing on an import or export path may panic on foreign input: the few
// remaining `expect`s are allowed one by one, each with the reason it cannot fire.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::unreachable, clippy::todo, clippy::unimplemented))]
#![warn(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]

pub mod copy;
mod device;
pub mod dtype;
mod error;
pub mod export;
pub mod ffi;
mod managed;
#[cfg(feature = "ndarray")]
mod ndarray;
mod view;

pub use copy::{to_contiguous, zeros, AlignedBuffer, ALIGNMENT};
pub use device::{Device, DeviceType};
pub use dtype::{DataType, DataTypeCode, Element};
pub use error::Error;
pub use managed::{LegacyManagedTensor, Managed, ManagedAbi, ManagedTensor};
pub use view::{TensorView, TensorViewMut, MAX_NDIM};
