//! # dlbridge
//!
//! DLPack 1.3 for Rust: hand n-dimensional tensors to C, C++ and Python
//! libraries, and take theirs, without copying and without undefined behaviour
//! whatever a foreign producer sends.
//!
//! ```
//! use dlbridge::{DataType, OwnedTensor};
//!
//! // Export Rust memory: one allocation, the deleter drops the Vec.
//! let mut tensor = OwnedTensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?;
//!
//! // Read it through the validated view, as a consumer would.
//! let view = tensor.view();
//! assert_eq!(view.shape(), &[2, 3]);
//! assert_eq!(view.strides(), &[3, 1]);
//! assert_eq!(view.dtype(), DataType::FLOAT32);
//! assert_eq!(view.as_slice::<f32>(), Some(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0][..]));
//!
//! // Write through a mutable view; read-only tensors refuse one.
//! tensor.try_view_mut()?.try_as_slice_mut::<f32>()?[0] = 10.0;
//! assert_eq!(tensor.view().as_slice::<f32>().map(|s| s[0]), Some(10.0));
//!
//! // `into_raw` hands the `DLManagedTensorVersioned*` to C; `from_raw` takes one back.
//! # Ok::<(), dlbridge::Error>(())
//! ```
//!
//! ## Map
//! - [`ffi`]: the raw ABI, every struct, flag and function-pointer type of `dlpack.h` 1.3.
//! - [`DataType`], [`Device`]: value types, with the one dtype [`TABLE`](dtype::TABLE).
//! - [`TensorView`]: the one validation path for foreign tensors; safe accessors.
//!   [`TensorViewMut`] writes, and lends reads only for as long as it is borrowed.
//! - [`OwnedTensor`], [`OwnedLegacyTensor`]: owners of a `DLManagedTensorVersioned`
//!   or a legacy `DLManagedTensor`, which call its deleter exactly once.
//! - [`Owned::from_vec`], [`Owned::from_owner_mut`], [`Owned::from_owner`]: safe export.
//! - [`to_contiguous`], [`zeros`]: owned, 64-byte aligned copies and allocations.
//! - [`streams`]: the spec's stream hand-off as a pure decision; with feature
//!   `cuda`, `cuda` carries it out with the driver, and copies to and from devices.
//! - with feature `ndarray`: `TensorView::as_array` and `Owned::from_array`;
//!   with feature `candle`: conversions to and from candle tensors.
//!
//! Fallible accessors come in pairs: `try_x` returns `Result` with the reason,
//! `x` returns `Option`.
//!
//! ## Unsafe contract
//! The everyday paths, exporting Rust memory and reading or writing a tensor
//! already taken, are safe. `unsafe` is needed only where the crate must trust
//! a pointer it cannot check: taking a producer's pointer ([`Owned::from_raw`],
//! [`TensorView::from_dltensor`]) and exporting memory whose owner it cannot
//! see ([`export::export_raw`], [`export::export_view`],
//! [`export::export_view_in`], whose block comes from an implementation of the
//! unsafe trait [`export::BlockAllocator`]). The caller vouches for those
//! pointers; the crate checks every value behind them.
#![deny(missing_docs, unsafe_op_in_unsafe_fn)]
// On docs.rs (and `./dev docs`), each item says which crate feature it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]
// Nothing on an import or export path may panic on foreign input: the few
// remaining `expect`s are allowed one by one, each with the reason it cannot fire.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::unreachable, clippy::todo, clippy::unimplemented))]
#![warn(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]

mod buffer;
#[cfg(feature = "candle")]
mod candle;
pub mod copy;
mod cuda_result;
mod device;
mod dims;
pub mod dtype;
mod dtype_rules;
mod element;
mod error;
pub mod export;
pub mod ffi;
mod formats;
pub mod layout;
pub mod streams;
pub mod thread_exit;
#[cfg(feature = "cuda")]
pub mod cuda;
mod managed_abi;
mod owned;
#[cfg(feature = "ndarray")]
mod ndarray;
mod view;
mod view_mut;
mod view_read;

#[cfg(feature = "candle")]
pub use candle::{dtype_from_candle, dtype_to_candle};
pub use buffer::{zeros, AlignedBuffer, ALIGNMENT};
pub use copy::to_contiguous;
pub use device::{Device, DeviceType};
pub use dtype::{DataType, DataTypeCode};
pub use element::Element;
pub use error::Error;
pub use managed_abi::ManagedAbi;
pub use owned::{Owned, OwnedLegacyTensor, OwnedTensor};
pub use layout::MAX_NDIM;
pub use view::TensorView;
pub use view_mut::TensorViewMut;

/// The README's Rust example, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
