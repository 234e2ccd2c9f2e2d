//! `__array_interface__` and `__cuda_array_interface__` import.
//!
//! Both interfaces hand over a bare integer address, trusted as NumPy trusts
//! it; what dlbridge checks and what it cannot is in the README, "Raw addresses".

use core::ffi::c_void;

use dlbridge::export::RawLayout;
use dlbridge::layout::element_strides_from_bytes;
use dlbridge::{DataType, Device, DeviceType};
use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::buffer::import_buffer;
use crate::any_owned::AnyOwned;
use crate::errors::IntoPyResult;
use crate::owner::PyOwner;

/// The fields both array interfaces share.
struct Interface {
    shape: Vec<i64>,
    dtype: DataType,
    data: Option<(usize, bool)>,
    strides_bytes: Option<Vec<i64>>,
}

fn parse_interface<'py>(interface: &Bound<'py, PyAny>, which: &str) -> PyResult<(Interface, Bound<'py, PyDict>)> {
    let dict = interface
        .cast::<PyDict>()
        .map_err(|_| PyTypeError::new_err(format!("{which} must be a dict, got {}", interface)))?
        .clone();
    let get = |key: &str| -> PyResult<Bound<'_, PyAny>> {
        dict.get_item(key)?.ok_or_else(|| PyValueError::new_err(format!("{which} has no {key:?} key")))
    };
    let shape: Vec<i64> = get("shape")?
        .extract()
        .map_err(|_| PyTypeError::new_err(format!("{which}[\"shape\"] must be a tuple of ints")))?;
    let typestr: String = get("typestr")?
        .extract()
        .map_err(|_| PyTypeError::new_err(format!("{which}[\"typestr\"] must be a str")))?;
    let dtype = DataType::from_typestr(&typestr).py()?;
    let data = match dict.get_item("data")? {
        Some(d) if !d.is_none() => Some(d.extract::<(usize, bool)>().map_err(|_| {
            PyTypeError::new_err(format!("{which}[\"data\"] must be a (pointer: int, readonly: bool) tuple"))
        })?),
        _ => None,
    };
    let strides_bytes = match dict.get_item("strides")? {
        Some(s) if !s.is_none() => Some(
            s.extract::<Vec<i64>>()
                .map_err(|_| PyTypeError::new_err(format!("{which}[\"strides\"] must be None or a tuple of ints")))?,
        ),
        _ => None,
    };
    if dict.get_item("mask")?.is_some_and(|m| !m.is_none()) {
        return Err(PyBufferError::new_err(format!("{which} with a mask cannot be described by DLPack")));
    }
    let version = get("version")?;
    let v: i64 = version.extract().map_err(|_| PyTypeError::new_err(format!("{which}[\"version\"] must be an int")))?;
    if !(0..=3).contains(&v) {
        return Err(PyValueError::new_err(format!("{which} version {v} is not supported (expected up to 3)")));
    }
    Ok((Interface { shape, dtype, data, strides_bytes }, dict))
}

/// Imports an `__array_interface__` (version 3) exporter without copying:
/// `obj.__array_interface__`, read here, so that the address comes from the
/// object that vouches for it (README, "Raw addresses"). With `"data": None`
/// the object's own buffer is used, as NumPy does.
///
/// The interface cannot be passed apart from its object, which would let
/// safe code hand over any address:
///
/// ```compile_fail,E0061
/// # use pyo3::prelude::*;
/// # fn f(obj: &Bound<'_, PyAny>, made_up: &Bound<'_, PyAny>) {
/// let _ = dlbridge_pyo3::import::import_array_interface(obj, made_up);
/// # }
/// ```
pub fn import_array_interface(obj: &Bound<'_, PyAny>) -> PyResult<AnyOwned> {
    let interface = crate::python_calls::getattr(obj, pyo3::intern!(obj.py(), "__array_interface__"))?;
    // SAFETY: the interface was just read from `obj`.
    unsafe { from_array_interface(obj, &interface) }
}

/// [`import_array_interface`] with `obj`'s interface already read.
///
/// # Safety
/// `interface` is what `obj.__array_interface__` gave: its address is the
/// one `obj` vouches for.
pub(crate) unsafe fn from_array_interface(obj: &Bound<'_, PyAny>, interface: &Bound<'_, PyAny>) -> PyResult<AnyOwned> {
    let (parsed, dict) = parse_interface(interface, "__array_interface__")?;
    let Some((address, readonly)) = parsed.data else {
        if dict.get_item("offset")?.is_some_and(|o| !o.is_none() && o.extract::<i64>().ok() != Some(0)) {
            return Err(PyBufferError::new_err("__array_interface__ with data=None and an offset is not supported"));
        }
        return import_buffer(obj);
    };
    // SAFETY: the address of `obj`'s own interface (the caller's contract).
    unsafe { import_pointer(obj, &parsed, address, readonly, Device::CPU) }
}

/// Imports a `__cuda_array_interface__` (versions 0-3) exporter without
/// touching device memory, with the stream its data is ready on (its `stream`
/// entry: 0 and negative values are refused, absent or None means no pending
/// work). The device comes from the driver (the interface names none): CUDA
/// memory of its device, managed memory, or pinned host memory (whose stream
/// is waited for by the host, since pinned memory has no streams in DLPack);
/// an address the driver does not know is refused. Without a driver nothing
/// can reach the memory, and it is carried as cuda:0.
///
/// As for [`import_array_interface`], the interface is read from `obj`.
pub fn import_cuda_array_interface(obj: &Bound<'_, PyAny>) -> PyResult<(AnyOwned, Option<i64>)> {
    let interface = crate::python_calls::getattr(obj, pyo3::intern!(obj.py(), "__cuda_array_interface__"))?;
    // SAFETY: the interface was just read from `obj`.
    unsafe { from_cuda_array_interface(obj, &interface) }
}

/// [`import_cuda_array_interface`] with `obj`'s interface already read.
///
/// # Safety
/// `interface` is what `obj.__cuda_array_interface__` gave.
pub(crate) unsafe fn from_cuda_array_interface(obj: &Bound<'_, PyAny>, interface: &Bound<'_, PyAny>) -> PyResult<(AnyOwned, Option<i64>)> {
    let (parsed, dict) = parse_interface(interface, "__cuda_array_interface__")?;
    let mut ready = None;
    if let Some(stream) = dict.get_item("stream")?.filter(|s| !s.is_none()) {
        let s: i64 = stream
            .extract()
            .map_err(|_| PyTypeError::new_err("__cuda_array_interface__[\"stream\"] must be None or an int"))?;
        if s == 0 {
            return Err(PyValueError::new_err(
                "__cuda_array_interface__ stream 0 is ambiguous and disallowed; use 1 for the legacy default stream",
            ));
        }
        if s < 0 {
            return Err(PyValueError::new_err(format!(
                "__cuda_array_interface__ stream {s} is not a stream: 1, 2 or a cudaStream_t handle"
            )));
        }
        ready = Some(s);
    }
    let (address, readonly) =
        parsed.data.ok_or_else(|| PyValueError::new_err("__cuda_array_interface__ needs a \"data\" pointer"))?;
    let place = if address == 0 { Ok(Some((Device::cuda(0), 0))) } else { dlbridge::cuda::pointer_place(address) };
    let device = match place {
        Ok(Some((device, ordinal))) => {
            if device.device_type == DeviceType::CUDA_HOST {
                if let Some(stream) = ready.take() {
                    // SAFETY: the interface's stream value, for this call (README, "Raw addresses").
                    unsafe { dlbridge::cuda::wait_on_host(ordinal, stream) }.py()?;
                }
            }
            device
        }
        Ok(None) => {
            return Err(PyBufferError::new_err(format!(
                "__cuda_array_interface__ gives the address {address:#x}, which the CUDA driver does not know as CUDA memory"
            )))
        }
        Err(dlbridge::Error::CudaUnavailable { .. }) => Device::cuda(0),
        Err(err) => return Err(crate::errors::to_py_err(err)),
    };
    // SAFETY: the address of `obj`'s own interface (the caller's contract).
    Ok((unsafe { import_pointer(obj, &parsed, address, readonly, device) }?, ready))
}

/// # Safety
/// `address` is what `obj`'s own interface gives.
unsafe fn import_pointer(obj: &Bound<'_, PyAny>, parsed: &Interface, address: usize, readonly: bool, device: Device) -> PyResult<AnyOwned> {
    let strides = match &parsed.strides_bytes {
        Some(bytes) => Some(element_strides_from_bytes(bytes, &parsed.shape, parsed.dtype.itemsize().unwrap_or(1)).py()?),
        None => None,
    };
    let layout = RawLayout { dtype: parsed.dtype, device, shape: &parsed.shape, strides: strides.as_deref(), byte_offset: 0 };
    let flags = if readonly { dlbridge::ffi::DLPACK_FLAG_BITMASK_READ_ONLY } else { 0 };
    // SAFETY: `obj`'s own interface (the caller's contract) promises that
    // `address` with this layout is valid for as long as `obj` lives (README, "Raw addresses");
    // the owner keeps it alive. The layout itself (NULL data,
    // overflow, ...) is validated by `export_raw`.
    unsafe { super::python_memory(PyOwner::new(obj), address as *mut c_void, layout, flags) }
}
