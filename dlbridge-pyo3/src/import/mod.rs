//! Consumer side: take a tensor from any Python producer.
//!
//! [`from_dlpack`] speaks DLPack only: our own `Tensor`, raw capsules, NumPy's
//! arrays (read from NumPy's struct), producers with a C exchange table, and
//! `__dlpack__` with the array-API negotiation. [`import_any`] adds the buffer
//! protocol, `__array_interface__` and `__cuda_array_interface__`.
//!
//! | file | what it imports |
//! |---|---|
//! | `negotiate.rs` | `__dlpack__` calls and their keyword fallbacks |
//! | `numpy.rs` | exact `numpy.ndarray`, without a capsule |
//! | `buffer.rs` | buffer-protocol exporters |
//! | `interface.rs` | both array interfaces (raw addresses: see there) |
//! | `../exchange/consumer.rs` | types with a DLPack C exchange table |

mod buffer;
mod interface;
mod negotiate;
mod numpy;

use core::ffi::c_void;

use dlbridge::export::{export_raw, RawLayout};
use dlbridge::streams::Stream;
use dlbridge::{to_contiguous, Device, DeviceType, OwnedTensor};
use pyo3::exceptions::{PyAttributeError, PyBufferError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyString;
use pyo3::{ffi, intern};

pub use buffer::import_buffer;
pub use interface::{import_array_interface, import_cuda_array_interface};
pub(crate) use negotiate::has_dlpack;
pub(crate) use numpy::{is_exact_ndarray, ml_dtypes_type, view_of_exact as numpy_view_exact};

use crate::capsule::{consume_capsule, is_capsule, AnyOwned};
use crate::convert::type_name;
use crate::errors::IntoPyResult;
use crate::exchange;
use crate::handoff::{reaches, settle, wait_if_managed};
use crate::tensor::{Tensor, TensorObject};

/// What the caller asks of an import.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ImportOptions {
    /// The device the result must be on; `None` keeps the producer's.
    pub device: Option<Device>,
    /// `Some(true)`: the result owns fresh memory. `Some(false)`: never copy.
    /// `None`: copy only if needed.
    pub copy: Option<bool>,
    /// The consumer's stream, passed to a producer on a device with streams
    /// (CUDA, ROCm), which orders its pending work before it. `None` passes
    /// that device's legacy default stream (1 on CUDA, 0 on ROCm).
    pub stream: Option<Stream>,
}

/// Wraps memory that a Python object exposes (its buffer, its array
/// interface, NumPy's struct) as an owned tensor, marked aliased: every import
/// from Python is reachable through its producer's objects too, so Rust
/// reads it under a registry borrow and writes it through `PyTensorMut` only.
///
/// # Safety
/// As [`export_raw`]: the memory must stay valid for the layout until `owner` drops.
pub(crate) unsafe fn python_memory<O: Send + 'static>(owner: O, data: *mut c_void, layout: RawLayout<'_>, flags: u64) -> PyResult<AnyOwned> {
    // SAFETY: forwarded from the caller.
    let mut owned: OwnedTensor = unsafe { export_raw(owner, data, layout, flags) }.py()?;
    owned.mark_aliased();
    Ok(AnyOwned::Versioned(owned))
}

/// An imported tensor and, for device memory, the stream its data is ready on.
pub type Imported = (AnyOwned, Option<i64>);

/// A copy of `owned` on `wanted`, which it cannot reach as it is (see
/// [`crate::moves`]), with the stream the copy is ready on.
fn move_to(py: Python<'_>, owned: &AnyOwned, ready: Option<i64>, wanted: Device) -> PyResult<Imported> {
    // The copy reads the memory: under a read borrow.
    let (copied, ready): (OwnedTensor, _) = crate::moves::copy_to(owned.read(py)?.view(), ready, wanted)?;
    Ok((AnyOwned::Versioned(copied), ready))
}

/// Refuses a CUDA import whose pointer lives on another device than its
/// producer says, when a driver can tell.
fn check_device_id(owned: &AnyOwned) -> PyResult<()> {
    let view = owned.view();
    let device = view.device();
    if device.device_type != DeviceType::CUDA || view.is_empty() {
        return Ok(());
    }
    match dlbridge::cuda::pointer_device(view.as_ptr() as usize, device.device_id) {
        Ok(actual) if actual != device.device_id => Err(PyBufferError::new_err(format!(
            "the producer says its tensor is on {device}, but its memory is on cuda:{actual}"
        ))),
        _ => Ok(()),
    }
}

/// Which stream an import's data must end up ready on.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ReadyOn {
    /// The consumer's: the stream named, else the legacy default (`from_dlpack`, `asarray`).
    Consumer,
    /// The producer's, unless a stream is named: extension arguments, which
    /// launch their work where the data is ready.
    Producer,
}

/// Applies `device`, `copy` and `stream` to an imported tensor, marked
/// aliased: its memory stays reachable through the producer's objects.
fn finish(py: Python<'_>, (mut owned, ready): Imported, options: ImportOptions, ready_on: ReadyOn) -> PyResult<Imported> {
    owned.mark_aliased();
    let device = owned.view().device();
    let requested = options.stream.map(Stream::value);
    if let Some(stream) = requested.filter(|_| !device.device_type.has_streams()) {
        return Err(PyValueError::new_err(format!("stream={stream} was given, but the tensor is on {device}, which has no streams")));
    }
    check_device_id(&owned)?;
    // Copies and host reads that dlbridge itself makes are ordered after the
    // producer's stream even when the caller passed -1 for the result.
    let produced = ready;
    let mut ready = match (ready_on, requested) {
        (ReadyOn::Producer, None) => ready,
        _ => settle(device, ready, requested)?,
    };
    let ours = ready.or(produced);
    if let Some(wanted) = options.device {
        // Managed memory asked for on the host: a copy is a host copy, and
        // the memory itself is waited for by the host before it is handed over.
        let host_bound = matches!(wanted.device_type, DeviceType::CPU | DeviceType::CUDA_HOST) && device.device_type.has_streams();
        if !reaches(device, wanted) || (host_bound && options.copy == Some(true)) {
            if options.copy == Some(false) {
                return Err(PyValueError::new_err(format!(
                    "cannot move a tensor from {device} to {wanted} without copying, and copy=False forbids it"
                )));
            }
            return move_to(py, &owned, ours, wanted);
        }
        if host_bound {
            wait_if_managed(device, ours)?;
            ready = None;
        }
        // Pinned or managed memory asked for on the CPU is handed over as CPU memory.
        if wanted == Device::CPU && device != wanted && options.copy != Some(true) {
            owned = crate::moves::relabel(owned, wanted)?;
        }
    }
    match options.copy {
        Some(true) if !owned.is_copied() => {
            if !device.device_type.has_streams() {
                return Ok((AnyOwned::Versioned(to_contiguous(owned.read(py)?.view()).py()?), ready));
            }
            // Queued on the data's stream, or the legacy default when no work is
            // pending; the copy is then ready there (and no longer "no pending work").
            let on = ours.unwrap_or(Stream::CUDA_LEGACY.value());
            // SAFETY: a stream value as for `move_to`.
            let copied: OwnedTensor = unsafe { dlbridge::cuda::copy_on_device(owned.read(py)?.view(), Some(on)) }.py()?;
            // A managed copy is made by the host, complete when it returns.
            let ready = if device.device_type == DeviceType::CUDA_MANAGED { None } else { Some(on) };
            Ok((AnyOwned::Versioned(copied), ready))
        }
        Some(false) if owned.is_copied() => Err(PyBufferError::new_err(
            "the producer copied the data (IS_COPIED is set) although copy=False was requested",
        )),
        _ => Ok((owned, ready)),
    }
}

/// Imports through DLPack: a raw `dltensor`/`dltensor_versioned` capsule (which
/// is consumed) or any object with `__dlpack__`.
///
/// Raises TypeError for an object with neither, ValueError for a used or
/// foreign capsule, BufferError for a tensor that cannot be imported, and
/// ValueError when `copy=False` forbids a needed copy.
pub fn from_dlpack(obj: &Bound<'_, PyAny>, options: ImportOptions) -> PyResult<AnyOwned> {
    from_dlpack_ready(obj, options).map(|(owned, _)| owned)
}

/// [`from_dlpack`], with the stream the data is ready on.
pub fn from_dlpack_ready(obj: &Bound<'_, PyAny>, options: ImportOptions) -> PyResult<Imported> {
    import_dlpack(obj, options, ReadyOn::Consumer)
}

fn import_dlpack(obj: &Bound<'_, PyAny>, options: ImportOptions, ready_on: ReadyOn) -> PyResult<Imported> {
    crate::gil::release_in_driver_calls();
    let finish = |imported, options| finish(obj.py(), imported, options, ready_on);
    if let Ok(tensor) = obj.cast_exact::<TensorObject>() {
        let ready = tensor.get().stream_for(options.stream.map(Stream::value))?;
        return finish((Tensor::share(tensor)?, ready), options);
    }
    if is_capsule(obj) {
        return finish((consume_capsule(obj)?, None), options);
    }
    if let Some(owned) = numpy::import(obj)? {
        return finish((owned, None), options);
    }
    import_from_producer(obj, exchange::lookup(obj), options, ready_on)
}

/// Imports through the producer's exchange table (`table`, looked up by the
/// caller), else its `__dlpack__`.
fn import_from_producer(obj: &Bound<'_, PyAny>, table: Option<exchange::Table>, options: ImportOptions, ready_on: ReadyOn) -> PyResult<Imported> {
    let finish = |imported, options| finish(obj.py(), imported, options, ready_on);
    if let Some(table) = table {
        if let Some((owned, ready)) = exchange::import_owned(obj, table)? {
            return finish((AnyOwned::Versioned(owned), ready), options);
        }
    }
    let (capsule, stream) = match negotiate::request_capsule(obj, options) {
        // A producer that cannot copy still gets the caller a copy: import the
        // tensor as it is, then copy here. tvm-ffi refuses with BufferError,
        // TensorFlow with RuntimeError; if the plain import fails too, the
        // producer's first answer is the one reported.
        Err(err) if options.copy == Some(true) => {
            negotiate::request_capsule(obj, ImportOptions { copy: None, ..options }).map_err(|_| err)?
        }
        other => other?,
    };
    let owned = consume_capsule(&capsule)?;
    // A producer asked with no stream orders its work before its device's
    // legacy default stream, as the spec says it must assume.
    let ready = match stream {
        Some(-1) => None,
        Some(s) => Some(s),
        None => owned.view().device().device_type.default_stream(),
    };
    finish((owned, ready), options)
}

/// Imports from anything that exposes DLPack, the buffer protocol,
/// `__array_interface__` or `__cuda_array_interface__`, tried in that order.
pub fn import_any(obj: &Bound<'_, PyAny>, options: ImportOptions) -> PyResult<AnyOwned> {
    import_any_ready(obj, options).map(|(owned, _)| owned)
}

/// [`import_any`], with the stream the data is ready on.
pub fn import_any_ready(obj: &Bound<'_, PyAny>, options: ImportOptions) -> PyResult<Imported> {
    import_anything(obj, options, ReadyOn::Consumer)
}

/// [`import_any_ready`] for an extension's argument: with no stream named, the
/// data stays ready on the producer's stream (see [`crate::PyTensor::ready_stream`]).
pub(crate) fn import_for_extension(obj: &Bound<'_, PyAny>, stream: Option<Stream>) -> PyResult<Imported> {
    import_anything(obj, ImportOptions { stream, ..ImportOptions::default() }, ReadyOn::Producer)
}

fn import_anything(obj: &Bound<'_, PyAny>, options: ImportOptions, ready_on: ReadyOn) -> PyResult<Imported> {
    crate::gil::release_in_driver_calls();
    let py = obj.py();
    // The cheap checks first: our own type, a capsule, NumPy's array type, then
    // a type with an exchange table (torch) or `__dlpack__`; each is imported
    // through DLPack.
    if obj.cast_exact::<TensorObject>().is_ok() || is_capsule(obj) || numpy::is_exact_ndarray(obj) {
        return import_dlpack(obj, options, ready_on);
    }
    let table = exchange::lookup(obj);
    if table.is_some() || has_dlpack(obj) {
        return import_from_producer(obj, table, options, ready_on);
    }
    // SAFETY: a type-slot check on a live object.
    let imported = if unsafe { ffi::PyObject_CheckBuffer(obj.as_ptr()) } == 1 {
        (import_buffer(obj)?, None)
    } else if let Some(interface) = optional_attr(obj, intern!(py, "__array_interface__"))? {
        // SAFETY: `obj`'s own interface, just read.
        (unsafe { interface::from_array_interface(obj, &interface) }?, None)
    } else if let Some(interface) = optional_attr(obj, intern!(py, "__cuda_array_interface__"))? {
        // SAFETY: as above.
        unsafe { interface::from_cuda_array_interface(obj, &interface) }?
    } else {
        return Err(PyTypeError::new_err(format!(
            "cannot make a tensor from {}: it has no __dlpack__, buffer protocol, __array_interface__ or __cuda_array_interface__",
            type_name(obj)
        )));
    };
    finish(obj.py(), imported, options, ready_on)
}

fn optional_attr<'py>(obj: &Bound<'py, PyAny>, name: &Bound<'py, PyString>) -> PyResult<Option<Bound<'py, PyAny>>> {
    match crate::python_calls::getattr(obj, name) {
        Ok(value) => Ok(Some(value)),
        Err(err) if err.is_instance_of::<PyAttributeError>(obj.py()) => Ok(None),
        Err(err) => Err(err),
    }
}
