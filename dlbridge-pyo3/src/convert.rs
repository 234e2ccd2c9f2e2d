//! Python values to core values and back: devices, dtypes (and `dlbridge.DType`),
//! shapes, type names.

use dlbridge::{DataType, Device, DeviceType, MAX_NDIM};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyString, PyTuple};

use crate::python_calls::entered;

/// The name of an object's type, for error messages.
pub(crate) fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".to_owned())
}

/// `words` after "a" or "an", as they are read: "an int4 tensor", "an
/// F-contiguous", "a uint8" (you-int), "an array.array".
pub(crate) fn with_article(words: &str) -> String {
    let article = if words.starts_with(['a', 'e', 'i', 'o', 'A', 'E', 'I', 'O', 'F']) { "an" } else { "a" };
    format!("{article} {words}")
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
    if let Ok(d) = dtype.cast::<DType>() {
        return Ok(d.get().0);
    }
    let name = dtype
        .cast::<PyString>()
        .map_err(|_| PyTypeError::new_err(format!("dtype must be a str or dlbridge.DType, got {dtype}")))?
        .to_cow()?;
    parse_dtype_name(&name)
}

/// A dtype from its name; a name that is not a valid DLPack dtype is a ValueError.
pub(crate) fn parse_dtype_name(name: &str) -> PyResult<DataType> {
    name.parse::<DataType>().map_err(|err| PyValueError::new_err(err.to_string()))
}

/// Parses a `shape` argument: an int, or a tuple or list of ints.
pub(crate) fn parse_shape(shape: &Bound<'_, PyAny>) -> PyResult<Vec<i64>> {
    let extents: Vec<i64> = if let Ok(n) = shape.extract::<i64>() {
        vec![n]
    } else if shape.cast::<PyTuple>().is_ok() || shape.cast::<PyList>().is_ok() {
        shape.extract()?
    } else {
        return Err(PyTypeError::new_err(format!("shape must be an int or a sequence of ints, got {shape}")));
    };
    // As NumPy says it: a shape of a tensor to make is an argument, not a tensor's metadata.
    if let Some(n) = extents.iter().find(|&&n| n < 0) {
        return Err(PyValueError::new_err(format!("negative dimensions are not allowed: {n} in shape {extents:?}")));
    }
    Ok(extents)
}

/// An element type: `str(dtype)` is the canonical name, and it compares equal
/// to that name.
#[pyclass(frozen, module = "dlbridge", name = "DType")]
#[derive(Clone, Copy)]
pub struct DType(pub DataType);

#[pymethods]
impl DType {
    /// Parses a canonical name such as `"float32"` or `"float32x4"`.
    #[new]
    fn py_new(name: &str) -> PyResult<Self> {
        entered();
        parse_dtype_name(name).map(DType)
    }

    /// The DLPack type code.
    #[getter]
    fn code(&self) -> u8 {
        entered();
        self.0.code.0
    }

    /// Bits of one lane.
    #[getter]
    fn bits(&self) -> u8 {
        entered();
        self.0.bits
    }

    /// Lanes per element.
    #[getter]
    fn lanes(&self) -> u16 {
        entered();
        self.0.lanes
    }

    /// Bytes per element, or None for packed sub-byte types.
    #[getter]
    fn itemsize(&self) -> Option<usize> {
        entered();
        self.0.itemsize()
    }

    fn __str__(&self) -> String {
        entered();
        self.0.to_string()
    }

    fn __repr__(&self) -> String {
        entered();
        format!("dlbridge.DType('{}')", self.0)
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        entered();
        if let Ok(other) = other.cast::<DType>() {
            return other.get().0 == self.0;
        }
        // Only the canonical name: equal objects must hash alike, and the hash
        // is the canonical name's ("float32x1" names float32 but is not equal).
        if let Ok(name) = other.cast::<PyString>() {
            return name.to_str().is_ok_and(|n| n == self.0.to_string());
        }
        false
    }

    fn __hash__(&self, py: Python<'_>) -> PyResult<isize> {
        entered();
        // Equal to the hash of the canonical name, since the two compare equal.
        PyString::new(py, &self.0.to_string()).hash()
    }
}

/// A pickled shape: a tuple or list of at most `MAX_NDIM` ints (checked before
/// anything is allocated for it).
pub(crate) fn parse_pickled_shape(shape: &Bound<'_, PyAny>) -> PyResult<Vec<i64>> {
    let len = if let Ok(t) = shape.cast::<PyTuple>() {
        t.len()
    } else if let Ok(l) = shape.cast::<PyList>() {
        l.len()
    } else {
        return Err(PyTypeError::new_err(format!("shape must be a tuple of ints, got {}", shape.get_type())));
    };
    if len > MAX_NDIM {
        return Err(PyValueError::new_err(format!("{len} dimensions; at most {MAX_NDIM} are supported")));
    }
    shape.extract()
}
