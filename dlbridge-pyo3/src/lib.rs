//! # dlbridge-pyo3
//!
//! DLPack for PyO3 extension authors, on top of the Python-free `dlbridge` core.
//!
//! - [`PyTensor`]: a `#[pyfunction]` argument that accepts any framework's
//!   tensor (NumPy, PyTorch, JAX, tvm-ffi, buffer-protocol and array-interface
//!   exporters) without copying.
//! - [`Tensor`]: the `dlbridge.Tensor` class, a return type any framework can
//!   take (`__dlpack__`, buffer protocol, `__array_interface__`).
//! - [`capsule`]: the capsule lifecycle, for code that handles capsules itself.
//! - [`register`]: adds `Tensor`, `DType`, `from_dlpack`, `asarray`, `empty`
//!   and `zeros` to a module; the `dlbridge` Python package is just that.
//!
//! ```no_run
//! use dlbridge_pyo3::{PyTensor, Tensor};
//! use pyo3::prelude::*;
//!
//! #[pyfunction]
//! fn scale(mut x: PyTensor<'_>, factor: f32) -> PyResult<()> {
//!     let mut view = x.view_mut()?;
//!     for v in view.try_as_slice_mut::<f32>().map_err(dlbridge_pyo3::to_py_err)? {
//!         *v *= factor;
//!     }
//!     Ok(())
//! }
//!
//! #[pyfunction]
//! fn arange(n: i64) -> PyResult<Tensor> {
//!     Tensor::from_vec((0..n).collect::<Vec<i64>>(), &[n])
//! }
//! ```
//!
//! The crate keeps no global state beyond interned strings and cached keyword
//! tuples, so several extensions can link it side by side.
#![deny(missing_docs, unsafe_op_in_unsafe_fn)]
// Nothing on an import or export path may panic on foreign input: the few
// remaining `expect`s are allowed one by one, each with the reason it cannot fire.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::unreachable, clippy::todo, clippy::unimplemented))]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod capsule;
pub mod consumer;
mod errors;
pub mod exchange;
pub mod owner;
mod tensor;

pub use capsule::AnyManaged;
pub use consumer::{from_dlpack, import_any, ImportOptions, PyTensor};
pub use dlbridge;
pub use errors::to_py_err;
pub use pyo3;
pub use tensor::{DType, Tensor};

use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::errors::IntoPyResult;

/// `from_dlpack(x, /, *, device=None, copy=None)`: a tensor from any DLPack
/// producer or raw capsule (which is consumed).
#[pyfunction(name = "from_dlpack")]
#[pyo3(signature = (x, /, *, device=None, copy=None))]
fn py_from_dlpack(x: &Bound<'_, PyAny>, device: Option<&Bound<'_, PyAny>>, copy: Option<bool>) -> PyResult<Tensor> {
    let options = ImportOptions { device: consumer::parse_device(device)?, copy };
    Ok(Tensor::new(from_dlpack(x, options)?))
}

/// `asarray(obj, /, *, copy=None)`: a tensor from DLPack, the buffer protocol,
/// `__array_interface__` or `__cuda_array_interface__`. A `Tensor` is returned
/// as is unless `copy=True`.
#[pyfunction]
#[pyo3(signature = (obj, /, *, copy=None))]
fn asarray(obj: &Bound<'_, PyAny>, copy: Option<bool>) -> PyResult<Py<PyAny>> {
    if copy != Some(true) && obj.cast_exact::<Tensor>().is_ok() {
        return Ok(obj.clone().unbind());
    }
    Ok(Bound::new(obj.py(), Tensor::new(import_any(obj, copy)?))?.into_any().unbind())
}

fn parse_shape(shape: &Bound<'_, PyAny>) -> PyResult<Vec<i64>> {
    if let Ok(n) = shape.extract::<i64>() {
        return Ok(vec![n]);
    }
    if shape.cast::<PyTuple>().is_ok() || shape.cast::<pyo3::types::PyList>().is_ok() {
        return shape.extract();
    }
    Err(pyo3::exceptions::PyTypeError::new_err(format!("shape must be an int or a sequence of ints, got {shape}")))
}

/// `empty(shape, dtype="float32")`: a CPU tensor whose memory Rust owns (it is
/// zero-filled: fresh pages cost the same either way).
#[pyfunction]
#[pyo3(signature = (shape, dtype=None))]
fn empty(shape: &Bound<'_, PyAny>, dtype: Option<&Bound<'_, PyAny>>) -> PyResult<Tensor> {
    zeros(shape, dtype)
}

/// `zeros(shape, dtype="float32")`: a zero-filled CPU tensor whose memory Rust owns.
#[pyfunction]
#[pyo3(signature = (shape, dtype=None))]
fn zeros(shape: &Bound<'_, PyAny>, dtype: Option<&Bound<'_, PyAny>>) -> PyResult<Tensor> {
    let dtype = match dtype {
        Some(d) if !d.is_none() => tensor::parse_dtype(d)?,
        _ => dlbridge::DataType::FLOAT32,
    };
    let shape = parse_shape(shape)?;
    let managed: dlbridge::ManagedTensor = dlbridge::zeros(dtype, &shape).py()?;
    Ok(Tensor::new(managed))
}

/// How often each function of dlbridge's exchange-API table ran: a dict with
/// keys allocator, from_py_object, to_py_object, dltensor_from_py_object and
/// current_work_stream. For tests that must prove a consumer took the fast path.
#[pyfunction]
fn _exchange_api_calls(py: Python<'_>) -> PyResult<Bound<'_, pyo3::types::PyDict>> {
    let names = ["allocator", "from_py_object", "to_py_object", "dltensor_from_py_object", "current_work_stream"];
    let dict = pyo3::types::PyDict::new(py);
    for (name, calls) in names.iter().zip(&exchange::CALLS) {
        dict.set_item(name, calls.load(std::sync::atomic::Ordering::Relaxed))?;
    }
    Ok(dict)
}

/// Imports `x` through DLPack and drops the owned tensor on a new Rust thread
/// that has never held the GIL, while this thread waits with the GIL released:
/// the producer's deleter must cope. For tests.
#[pyfunction]
fn _drop_on_rust_thread(py: Python<'_>, x: &Bound<'_, PyAny>) -> PyResult<()> {
    let managed = from_dlpack(x, ImportOptions::default())?;
    py.detach(|| std::thread::spawn(move || drop(managed)).join())
        .map_err(|_| pyo3::exceptions::PyRuntimeError::new_err("the dropping thread panicked"))
}

/// Adds the classes and functions of the `dlbridge` Python package to `module`.
pub fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<Tensor>()?;
    module.add_class::<DType>()?;
    module.add_function(wrap_pyfunction!(py_from_dlpack, module)?)?;
    module.add_function(wrap_pyfunction!(asarray, module)?)?;
    module.add_function(wrap_pyfunction!(empty, module)?)?;
    module.add_function(wrap_pyfunction!(zeros, module)?)?;
    module.add_function(wrap_pyfunction!(_exchange_api_calls, module)?)?;
    module.add_function(wrap_pyfunction!(_drop_on_rust_thread, module)?)?;
    let v = dlbridge::ffi::DLPackVersion::CURRENT;
    module.add("DLPACK_VERSION", (v.major, v.minor))?;
    Ok(())
}
