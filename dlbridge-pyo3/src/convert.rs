//! Python values to core values and back: devices, dtypes, shapes, type names.

use dlbridge::{DataType, Device, DeviceType};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyString, PyTuple};

use crate::errors::IntoPyResult;

/// The name of an object's type, for error messages.
pub(crate) fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".to_owned())
}

/// Parses a `device` argument: None, `"cpu"`, or a `(device_type, device_id)` tuple.
pub fn parse_device(device: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Device>> {
    let Some(device) = device.filter(|d| !d.is_none()) else { return Ok(None) };
    if let Ok(name) = device.cast::<PyString>() {
        return match &*name.to_cow()? {
            "cpu" => Ok(Some(Device::CPU)),
            other => Err(PyValueError::new_err(format!(
                "device {other:?} is not understood: use None, \"cpu\" or a (device_type, device_id) tuple"
            ))),
        };
    }
    parse_device_tuple(device, "device").map(Some)
}

/// Parses a `(device_type, device_id)` tuple, as `__dlpack_device__` returns and
/// `dl_device` takes; IntEnum members are accepted.
pub(crate) fn parse_device_tuple(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Device> {
    let bad = || PyTypeError::new_err(format!("{what} must be a (device_type, device_id) tuple of ints, got {obj}"));
    let tuple = obj.cast::<PyTuple>().map_err(|_| bad())?;
    if tuple.len() != 2 {
        return Err(bad());
    }
    let device_type: i32 = tuple.get_item(0)?.extract().map_err(|_| bad())?;
    let device_id: i32 = tuple.get_item(1)?.extract().map_err(|_| bad())?;
    Ok(Device::new(DeviceType(device_type), device_id))
}

/// `(device_type, device_id)` as a tuple.
pub(crate) fn device_tuple(py: Python<'_>, device: Device) -> PyResult<Bound<'_, PyTuple>> {
    PyTuple::new(py, [device.device_type.0, device.device_id])
}

/// Parses a `dtype` argument: a name or a `DType`.
pub(crate) fn parse_dtype(dtype: &Bound<'_, PyAny>) -> PyResult<DataType> {
    if let Ok(d) = dtype.cast::<crate::tensor::DType>() {
        return Ok(d.get().0);
    }
    let name = dtype
        .cast::<PyString>()
        .map_err(|_| PyTypeError::new_err(format!("dtype must be a str or dlbridge.DType, got {dtype}")))?
        .to_cow()?;
    name.parse().py()
}

/// Parses a `shape` argument: an int, or a tuple or list of ints.
pub(crate) fn parse_shape(shape: &Bound<'_, PyAny>) -> PyResult<Vec<i64>> {
    if let Ok(n) = shape.extract::<i64>() {
        return Ok(vec![n]);
    }
    if shape.cast::<PyTuple>().is_ok() || shape.cast::<PyList>().is_ok() {
        return shape.extract();
    }
    Err(PyTypeError::new_err(format!("shape must be an int or a sequence of ints, got {shape}")))
}

/// Up to 8 values on the stack, more on the heap: shapes and strides on hot paths.
pub(crate) enum SmallI64 {
    Inline([i64; 8], usize),
    Heap(Vec<i64>),
}

impl SmallI64 {
    /// `map` applied to each of `values`, stopping at the first error.
    pub(crate) fn try_map<V: Copy, E>(values: &[V], mut map: impl FnMut(usize, V) -> Result<i64, E>) -> Result<Self, E> {
        if values.len() <= 8 {
            let mut out = [0i64; 8];
            for (i, (slot, &v)) in out.iter_mut().zip(values).enumerate() {
                *slot = map(i, v)?;
            }
            Ok(SmallI64::Inline(out, values.len()))
        } else {
            values.iter().enumerate().map(|(i, &v)| map(i, v)).collect::<Result<_, E>>().map(SmallI64::Heap)
        }
    }

    /// `map` applied to each of `values`.
    pub(crate) fn map<V: Copy>(values: &[V], mut map: impl FnMut(usize, V) -> i64) -> Self {
        match Self::try_map(values, |i, v| Ok::<_, core::convert::Infallible>(map(i, v))) {
            Ok(small) => small,
            Err(never) => match never {},
        }
    }

    pub(crate) fn as_slice(&self) -> &[i64] {
        match self {
            SmallI64::Inline(values, len) => &values[..*len],
            SmallI64::Heap(values) => values,
        }
    }
}
