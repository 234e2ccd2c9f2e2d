//! # dlbridge-pyo3
//!
//! DLPack for PyO3 extension authors, on top of the Python-free `dlbridge` core.
//!
//! - [`PyTensor`], [`PyTensorMut`]: `#[pyfunction]` arguments that accept any
//!   framework's tensor (NumPy, PyTorch, JAX, tvm-ffi, buffer-protocol and
//!   array-interface exporters) without copying, to read or to write in place.
//! - [`Tensor`]: the `dlbridge.Tensor` class, a return type any framework can
//!   take (`__dlpack__`, buffer protocol, `__array_interface__`).
//! - [`capsule`]: the capsule lifecycle, for code that handles capsules itself.
//! - [`register`]: adds `Tensor`, `DType`, `from_dlpack`, `asarray`, `empty`
//!   and `zeros` to a module; the `dlbridge` Python package is just that.
//!
//! ```no_run
//! use dlbridge_pyo3::{to_py_err, PyTensor, PyTensorMut, Tensor};
//! use pyo3::prelude::*;
//!
//! #[pyfunction]
//! fn scale(mut x: PyTensorMut<'_>, factor: f32) -> PyResult<()> {
//!     for v in x.view_mut()?.try_as_slice_mut::<f32>().map_err(to_py_err)? {
//!         *v *= factor;
//!     }
//!     Ok(())
//! }
//!
//! #[pyfunction]
//! fn total(x: PyTensor<'_>) -> PyResult<f64> {
//!     Ok(x.view().try_as_slice::<f64>().map_err(to_py_err)?.iter().sum())
//! }
//!
//! #[pyfunction]
//! fn arange(n: i64) -> PyResult<Tensor> {
//!     Tensor::from_vec((0..n).collect::<Vec<i64>>(), &[n])
//! }
//! ```
//!
//! ## Where things live
//! | file | what |
//! |---|---|
//! | `import/` | taking tensors from Python: DLPack negotiation, NumPy, buffers, array interfaces |
//! | `args.rs`, `borrows/` | `PyTensor`, `PyTensorMut`, `ReadGuard`, and the process-wide registry of the byte-range borrows they hold |
//! | `tensor/` | the `Tensor` class: `__dlpack__`, buffer protocol, `tolist`, `DType` |
//! | `ready.rs`, `moves.rs`, `gil.rs` | CUDA: where a tensor's data is ready; moves between host and device; driver calls without the GIL |
//! | `exchange/` | the C exchange API: our table, and using other types' tables |
//! | `capsule.rs`, `owner.rs` | capsule lifecycle; Python references a deleter may drop anywhere |
//! | `writability.rs` | the one rule for read-only, writable and unknown |
//! | `convert.rs`, `errors.rs` | Python values to core values; core errors to exceptions |
//!
//! ## Global state
//! Interned strings, cached keyword tuples, a per-thread cache of exchange
//! tables by type, `numpy.ndarray`'s type once seen, and the borrow registry.
//! Several extensions can link the crate side by side; the registry is the one
//! thing they share (published once per process in `sys.modules`, see
//! [`ReadGuard`]), so a borrow in one is seen by all.
#![deny(missing_docs, unsafe_op_in_unsafe_fn)]
// On docs.rs (and `./dev docs`), each item says which crate feature it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]
// Nothing on an import or export path may panic on foreign input: the few
// remaining `expect`s are allowed one by one, each with the reason it cannot fire.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::unreachable, clippy::todo, clippy::unimplemented))]
#![warn(clippy::undocumented_unsafe_blocks)]

mod abi_structs;
mod any_owned;
mod args;
mod borrows;
pub mod capsule;
mod convert;
mod errors;
pub mod exchange;
mod trust;
mod functions;
mod gil;
mod handoff;
pub mod import;
mod moves;
pub mod owner;
mod python_calls;
mod ready;
mod tensor;
#[cfg(feature = "testing")]
mod testing;
mod writability;

pub use args::{
    AnyDevice, AnyDtype, AnyLayout, AnyRank, CContiguous, Cpu, Cuda, DeviceKind, Dtype, FContiguous, LayoutKind, PyTensor, PyTensorMut,
    Rank,
};
pub use borrows::ReadGuard;
pub use any_owned::{AnyOwned, ObjectTensor};
pub use convert::parse_device;
pub use dlbridge;
pub use errors::to_py_err;
pub use import::{from_dlpack, from_dlpack_ready, import_any, import_any_ready, ImportOptions, Imported};
pub use pyo3;
pub use convert::DType;
pub use tensor::{Tensor, TensorObject, EXCHANGE_API};
pub use writability::Writability;

use pyo3::prelude::*;

/// Adds the classes and functions of the `dlbridge` Python package to `module`.
pub fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    // The process's borrow registry, published by the first extension that loads.
    let _ = borrows::prepare(); // refused borrows say why when they happen
    gil::release_in_driver_calls();
    module.add_class::<TensorObject>()?;
    // This module's class is the one `dlbridge.Tensor` of the process.
    tensor::publish(module)?;
    module.add_class::<DType>()?;
    module.add_function(wrap_pyfunction!(functions::py_from_dlpack, module)?)?;
    module.add_function(wrap_pyfunction!(functions::asarray, module)?)?;
    module.add_function(wrap_pyfunction!(functions::empty, module)?)?;
    module.add_function(wrap_pyfunction!(functions::zeros, module)?)?;
    module.add_function(wrap_pyfunction!(tensor::_rebuild_tensor, module)?)?;
    module.add_function(wrap_pyfunction!(functions::_ml_dtypes_type, module)?)?;
    module.add_function(wrap_pyfunction!(tensor::_shared_tensor, module)?)?;
    module.add_function(wrap_pyfunction!(tensor::_shared_exit_sweep, module)?)?;
    #[cfg(feature = "testing")]
    testing::register(module)?;
    let v = dlbridge::ffi::DLPackVersion::CURRENT;
    module.add("DLPACK_VERSION", (v.major, v.minor))?;
    Ok(())
}
