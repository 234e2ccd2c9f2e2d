//! The module-level functions of the `dlbridge` Python package.

use dlbridge::streams::Stream;
use dlbridge::OwnedTensor;
use pyo3::exceptions::{PyMemoryError, PyOverflowError};
use pyo3::prelude::*;
use pyo3::IntoPyObject;

use crate::convert::{parse_device, parse_dtype, parse_shape};
use crate::errors::IntoPyResult;
use crate::import::{from_dlpack_ready, import_any_ready, ImportOptions};
use crate::python_calls::{entered, Scalar};
use crate::tensor::{Tensor, TensorObject};

/// `from_dlpack(x, /, *, device=None, copy=None, stream=None)`: a tensor from
/// any DLPack producer or raw capsule (which is consumed). `stream` is the
/// consumer's stream for a producer on CUDA or ROCm (None: the legacy default).
#[pyfunction(name = "from_dlpack")]
#[pyo3(signature = (x, /, *, device=None, copy=None, stream=None))]
pub(crate) fn py_from_dlpack(
    x: &Bound<'_, PyAny>,
    device: Option<&Bound<'_, PyAny>>,
    copy: Option<Scalar<bool>>,
    stream: Option<Scalar<i64>>,
) -> PyResult<Tensor> {
    entered();
    let (copy, stream) = (copy.map(|c| c.0), stream.map(|s| s.0));
    // SAFETY: Python's protocols hand streams over as raw integers, which
    // dlbridge passes on as they are (README, "Raw addresses").
    let stream = stream.map(|s| unsafe { Stream::from_raw(s) });
    let options = ImportOptions { device: parse_device(device)?, copy, stream };
    let (owned, ready) = from_dlpack_ready(x, options)?;
    Tensor::new(owned).ready_on(ready)
}

/// `asarray(obj, /, *, copy=None)`: a tensor from DLPack, the buffer protocol,
/// `__array_interface__` or `__cuda_array_interface__`. A `Tensor` is returned
/// as is unless `copy=True`.
#[pyfunction]
#[pyo3(signature = (obj, /, *, copy=None))]
pub(crate) fn asarray(obj: &Bound<'_, PyAny>, copy: Option<Scalar<bool>>) -> PyResult<Py<PyAny>> {
    entered();
    let copy = copy.map(|c| c.0);
    if copy != Some(true) && obj.cast_exact::<TensorObject>().is_ok() {
        return Ok(obj.clone().unbind());
    }
    let (owned, ready) = import_any_ready(obj, ImportOptions { copy, ..ImportOptions::default() })?;
    Ok(Tensor::new(owned).ready_on(ready)?.into_pyobject(obj.py())?.unbind())
}

/// `empty(shape, dtype=None, *, shared=False)`: a CPU tensor whose memory Rust
/// owns (float32 by default; zero-filled, since fresh pages cost the same either
/// way), or with `shared=True` a tensor in a shared-memory segment, which
/// pickles as a handle (see `dlbridge._shared`).
#[pyfunction]
#[pyo3(signature = (shape, dtype=None, *, shared=Scalar(false)), text_signature = "(shape, dtype=None, *, shared=False)")]
pub(crate) fn empty<'py>(shape: &Bound<'py, PyAny>, dtype: Option<&Bound<'py, PyAny>>, shared: Scalar<bool>) -> PyResult<Bound<'py, PyAny>> {
    entered();
    let py = shape.py();
    if shared.0 {
        let (dtype, shape) = (dtype_or_float32(dtype)?, parse_shape(shape)?);
        check_size(&shape, dtype)?;
        return crate::tensor::shared_empty(py, dtype, &shape)?.into_pyobject(py);
    }
    zeros(shape, dtype)?.into_pyobject(py)
}

fn dtype_or_float32(dtype: Option<&Bound<'_, PyAny>>) -> PyResult<dlbridge::DataType> {
    match dtype {
        Some(d) if !d.is_none() => parse_dtype(d),
        _ => Ok(dlbridge::DataType::FLOAT32),
    }
}

/// `_ml_dtypes_type(dtype)`: the `ml_dtypes` scalar type of `dtype` as the
/// Rust side read and checked it once, for `Tensor.numpy()`; TypeError without
/// ml_dtypes.
#[pyfunction]
pub(crate) fn _ml_dtypes_type<'py>(dtype: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    entered();
    crate::import::ml_dtypes_type(dtype.py(), parse_dtype(dtype)?)
}

/// `zeros(shape, dtype=None)`: a zero-filled CPU tensor whose memory Rust owns
/// (float32 by default). MemoryError when the memory cannot be had.
#[pyfunction]
#[pyo3(signature = (shape, dtype=None))]
pub(crate) fn zeros(shape: &Bound<'_, PyAny>, dtype: Option<&Bound<'_, PyAny>>) -> PyResult<Tensor> {
    entered();
    let (dtype, shape) = (dtype_or_float32(dtype)?, parse_shape(shape)?);
    check_size(&shape, dtype)?;
    let owned: OwnedTensor = dlbridge::zeros(dtype, &shape).py()?;
    Ok(Tensor::new(owned))
}

/// Refuses a shape no machine can hold before anything is allocated:
/// OverflowError when its element count does not fit in 64 bits, MemoryError
/// when its bytes do not fit in the address space.
pub(crate) fn check_size(shape: &[i64], dtype: dlbridge::DataType) -> PyResult<()> {
    let numel = match dlbridge::layout::element_count(shape) {
        Ok(numel) => numel,
        Err(dlbridge::Error::SizeOverflow { .. }) => {
            return Err(PyOverflowError::new_err(format!("shape {shape:?} has more elements than fit in 64 bits")))
        }
        Err(err) => return Err(crate::to_py_err(err)),
    };
    match dtype.storage_bytes(numel as u64, false) {
        Some(bytes) if bytes <= isize::MAX as u64 => Ok(()),
        _ => Err(PyMemoryError::new_err(format!(
            "{} of shape {shape:?} needs more bytes than the address space holds", crate::convert::with_article(&format!("{dtype} tensor"))
        ))),
    }
}
