//! `Tensor.__dlpack__`: the producer side of the array API's DLPack protocol.
//!
//! A legacy `dltensor` capsule when `max_version` is None or below 1.0, else a
//! `dltensor_versioned` at 1.3, flags set as the [writability rule](crate::writability)
//! says. For CUDA memory the consumer's `stream` is made to wait for the data's
//! ([`dlbridge::streams::plan`]); a `dl_device` across host and CUDA gives a
//! copy ([`crate::moves`]). Installed as a `METH_FASTCALL | METH_KEYWORDS` method
//! descriptor with keyword names matched by identity, which PyO3's generic parser cannot offer.

use core::ptr::NonNull;

use dlbridge::export::export_view;
use dlbridge::ffi::{DLManagedTensor, DLManagedTensorVersioned, DLTensor, DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED};
use dlbridge::{to_contiguous, Device, DeviceType, ManagedAbi, Owned};
use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::impl_::trampoline::{fastcall_cfunction_with_keywords, MethodDef};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt, PyString, PyTuple};
use pyo3::{ffi, intern, Borrowed};

use super::{Tensor, TensorObject};
use crate::capsule::{given_up, raw_into_capsule};
use crate::convert::parse_device_tuple;
use crate::errors::IntoPyResult;
use crate::handoff::{reaches, settle};
use crate::moves::{can_move, copy_to};
use crate::owner::{export_in_python_blocks, PyOwner};

/// The parsed keywords of `__dlpack__`.
pub(super) struct ExportRequest {
    legacy: bool,
    device: Device,
    copy: Option<bool>,
    /// The consumer's stream (`None`: the legacy default, as the spec says).
    stream: Option<i64>,
    /// Whether to order the consumer's stream after the data's: false for the
    /// exchange API's `no_sync` exports, which leave that to the caller.
    order: bool,
    /// Whether `device` needs a copy off the tensor's device (CUDA to host).
    moved: bool,
}

impl ExportRequest {
    /// What the exchange API's exports ask: the same memory, as is, versioned,
    /// with no stream ordering.
    fn unsynchronised(device: Device) -> Self {
        ExportRequest { legacy: false, device, copy: None, stream: None, order: false, moved: false }
    }
}

fn parse_max_version(max_version: Option<&Bound<'_, PyAny>>) -> PyResult<bool> {
    let Some(v) = max_version.filter(|v| !v.is_none()) else { return Ok(true) };
    let bad = || PyTypeError::new_err(format!("max_version must be None or a (major, minor) tuple of ints, got {v}"));
    let tuple = v.cast::<PyTuple>().map_err(|_| bad())?;
    if tuple.len() != 2 {
        return Err(bad());
    }
    // Items borrowed, not extracted as a Rust tuple: this runs on every export.
    // SAFETY: the tuple has two items (checked above).
    let (major, minor) = unsafe { (tuple.get_borrowed_item_unchecked(0), tuple.get_borrowed_item_unchecked(1)) };
    if !major.is_instance_of::<PyInt>() || !minor.is_instance_of::<PyInt>() || major.is_instance_of::<PyBool>() {
        return Err(bad());
    }
    // Any int, however large (a far-future major still gets our newest).
    match major.extract::<i64>() {
        Ok(major) => Ok(major < 1),
        Err(_) => major.lt(1),
    }
}

fn parse_copy(copy: Option<&Bound<'_, PyAny>>) -> PyResult<Option<bool>> {
    match copy.filter(|c| !c.is_none()) {
        None => Ok(None),
        Some(c) => c
            .cast::<PyBool>()
            .map(|b| Some(b.is_true()))
            .map_err(|_| PyTypeError::new_err(format!("copy must be None, True or False, got {c}"))),
    }
}

/// Parses `stream` and checks it against the spec's rules for `device`.
fn parse_stream(stream: Option<&Bound<'_, PyAny>>, device: Device) -> PyResult<Option<i64>> {
    let Some(stream) = stream.filter(|s| !s.is_none()) else { return Ok(None) };
    if !device.device_type.has_streams() {
        return Err(PyValueError::new_err(format!(
            "stream must be None for a tensor on {device}, which has no streams; got {stream}"
        )));
    }
    if !stream.is_instance_of::<PyInt>() {
        return Err(PyTypeError::new_err(format!("stream must be None or an int, got {}", stream.repr()?)));
    }
    // An int too large for any stream is refused as an invalid stream.
    let value: i64 = stream.extract().map_err(|_| PyValueError::new_err(format!("stream {stream} is not valid for a tensor on {device}")))?;
    if !device.device_type.accepts_stream(value) {
        return Err(PyValueError::new_err(format!("stream {value} is not valid for a tensor on {device}")));
    }
    Ok(Some(value))
}

impl Tensor {
    pub(super) fn parse_request(
        &self,
        stream: Option<&Bound<'_, PyAny>>,
        max_version: Option<&Bound<'_, PyAny>>,
        dl_device: Option<&Bound<'_, PyAny>>,
        copy: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<ExportRequest> {
        let legacy = parse_max_version(max_version)?;
        let copy = parse_copy(copy)?;
        let own = self.view().device();
        let (device, moved) = match dl_device.filter(|d| !d.is_none()) {
            None => (own, false),
            Some(d) => {
                let wanted = parse_device_tuple(d, "dl_device")?;
                if reaches(own, wanted) {
                    (wanted, false)
                } else if can_move(own, wanted) {
                    // A copy dlbridge makes itself (see `crate::moves`). The method
                    // reference: with copy=False, a copy needed for CPU access is a
                    // ValueError; any other cross-device move is a BufferError.
                    if copy == Some(false) {
                        let message = format!("cannot move a tensor from {own} to {wanted} without copying, and copy=False forbids it");
                        return Err(if wanted.device_type == DeviceType::CPU {
                            PyValueError::new_err(message)
                        } else {
                            PyBufferError::new_err(message)
                        });
                    }
                    (wanted, true)
                } else if copy == Some(false) {
                    return Err(PyBufferError::new_err(format!(
                        "exporting to {wanted} would need a copy from {own}, and copy=False forbids it"
                    )));
                } else {
                    return Err(PyBufferError::new_err(format!("unsupported device requested: {wanted} (tensor is on {own})")));
                }
            }
        };
        let stream = parse_stream(stream, device)?;
        if legacy && !self.writability.allows_legacy_export() && copy != Some(true) {
            return Err(PyBufferError::new_err(
                "cannot export a read-only tensor as a legacy DLPack capsule, which cannot signal read-only; \
                 pass max_version=(1, 0) or higher, or copy=True",
            ));
        }
        if legacy && self.view().is_subbyte_padded() {
            return Err(PyBufferError::new_err("a padded sub-byte tensor needs a versioned capsule to say so"));
        }
        Ok(ExportRequest { legacy, device, copy, stream, order: true, moved })
    }

    /// An owning versioned export sharing this tensor's memory, as
    /// `__dlpack__(max_version=(1, 3))` gives; the caller owns it.
    #[must_use = "the caller owns the export: drop it through its deleter"]
    pub(crate) fn export_versioned(slf: &Bound<'_, TensorObject>) -> PyResult<NonNull<DLManagedTensorVersioned>> {
        let request = ExportRequest::unsynchronised(slf.get().view().device());
        Self::export::<DLManagedTensorVersioned>(slf, &request)
    }

    /// Makes the legacy default stream wait for this tensor's pending work (an
    /// event, no host sync): what the exchange API's `no_sync` functions do,
    /// since they hand out data that `current_work_stream` says is ready on
    /// that stream. Then the legacy stream is the data's stream, so that work a
    /// consumer queues there later (an in-place kernel) is ordered before the
    /// next export too (idle CUDA memory included). Nothing for memory without streams.
    pub(crate) fn order_default_stream(&self) -> PyResult<()> {
        self.lend_stream(None).map(drop)
    }

    /// A non-owning DLTensor of this tensor's memory, shape and strides, valid
    /// while the tensor lives.
    pub(crate) fn borrowed_dltensor(&self) -> DLTensor {
        let view = self.view();
        let (shape, strides) = if view.ndim() == 0 {
            (core::ptr::null_mut(), core::ptr::null_mut())
        } else {
            (view.shape().as_ptr().cast_mut(), view.strides().as_ptr().cast_mut())
        };
        DLTensor {
            data: if view.is_empty() { core::ptr::null_mut() } else { view.as_ptr().cast_mut() },
            device: view.device(),
            ndim: view.ndim() as i32,
            dtype: view.dtype(),
            shape,
            strides,
            byte_offset: 0,
        }
    }

    /// An owned tensor of ABI `M` sharing this tensor's memory, for
    /// `from_dlpack(tensor)`: its validated view is kept, padding included,
    /// which a legacy struct could not say.
    pub(crate) fn share_as<M: ManagedAbi>(slf: &Bound<'_, TensorObject>) -> PyResult<Owned<M>> {
        let this = slf.get();
        let view = this.view();
        // SAFETY: as for the shared export in `export`.
        unsafe { export_view(PyOwner::new(slf.as_any()), view, view.device(), this.export_flags()) }.py()
    }

    /// READ_ONLY unless known writable, and the padding of sub-byte elements.
    fn export_flags(&self) -> u64 {
        let mut flags = self.writability.flags();
        if self.view().is_subbyte_padded() {
            flags |= DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED;
        }
        flags
    }

    /// A managed tensor of ABI `M` sharing this tensor's memory, or a fresh
    /// copy, owned by the caller (a capsule takes it over as it is).
    /// For device memory, the consumer's stream is first made to wait for the
    /// data's (an event, no host sync), unless the request says not to.
    #[must_use = "the caller owns the export: drop it through its deleter"]
    fn export<M: ManagedAbi>(slf: &Bound<'_, TensorObject>, request: &ExportRequest) -> PyResult<NonNull<M>> {
        let this = slf.get();
        let view = this.view();
        let own = view.device();
        if request.moved {
            // A host copy is complete when made; a device copy is ready on the
            // legacy stream, which the consumer's is then made to wait for.
            let ready = if own.device_type.has_streams() { this.stream_for(None)? } else { None };
            let (copy, ready) = copy_to::<M>(this.read(slf.py())?.view(), ready, request.device)?;
            if request.order && ready.is_some() {
                settle(request.device, ready, request.stream)?;
            }
            return Ok(given_up(copy));
        }
        // A host consumer: one that asked for host memory, or one that passed no
        // stream for managed memory (NumPy reads it on the host).
        let host_bound = matches!(request.device.device_type, DeviceType::CPU | DeviceType::CUDA_HOST)
            || (own.device_type == DeviceType::CUDA_MANAGED && request.stream.is_none());
        let mut ready = None;
        // -1: the consumer orders its stream itself; only a copy made here needs the data's.
        let ordered = request.order && (request.stream != Some(-1) || request.copy == Some(true));
        if ordered && own.device_type.has_streams() {
            if host_bound {
                // Managed memory for a host consumer: the host itself must wait.
                this.wait_for_host()?;
            } else {
                ready = this.stream_for(request.stream)?;
                settle(own, ready, request.stream)?;
                // A copy is then queued on the consumer's stream, so that what it
                // waits for includes the copy; with -1 it stays on the data's.
                if let Some(consumer) = request.stream.or(own.device_type.default_stream()).filter(|&s| s != -1) {
                    ready = Some(consumer);
                }
            }
        }
        if request.copy == Some(true) {
            if own.device_type.has_streams() && request.device == own {
                // Fresh memory of the same kind: device memory copied on the
                // consumer's stream, or managed memory copied by the host.
                // SAFETY: a stream value as above.
                return unsafe { dlbridge::cuda::copy_on_device::<M>(this.read(slf.py())?.view(), ready) }.py().map(given_up);
            }
            // Host memory, or managed memory asked for on the host (waited for above).
            return to_contiguous::<M>(this.read(slf.py())?.view()).py().map(given_up);
        }
        let flags = this.export_flags();
        // SAFETY: the memory is this tensor's, valid for its validated layout for
        // as long as the tensor object lives, which the owner guarantees. It is
        // written only if the tensor is writable (READ_ONLY is set otherwise,
        // and a legacy export is only made of memory not known read-only).
        // `request.device` reaches the same memory (checked by `parse_request`).
        unsafe { export_in_python_blocks(slf.as_any(), view, request.device, flags) }.py()
    }
}

pub(super) const DLPACK_DOC: &core::ffi::CStr = c"__dlpack__($self, /, *, stream=None, max_version=None, dl_device=None, copy=None)\n--\n\nThe DLPack export, per the array API: a legacy \"dltensor\" capsule when max_version is None or below (1, 0), else a \"dltensor_versioned\" capsule at version 1.3.";

const DLPACK_KEYWORDS: [&str; 4] = ["stream", "max_version", "dl_device", "copy"];

/// The keyword arguments of a `__dlpack__` vectorcall, by position in [`DLPACK_KEYWORDS`].
///
/// # Safety
/// `args`, `nargsf` and `kwnames` must be those of a vectorcall made with the GIL held.
unsafe fn dlpack_keywords<'a, 'py>(
    py: Python<'py>,
    args: *const *mut ffi::PyObject,
    nargsf: ffi::Py_ssize_t,
    kwnames: *mut ffi::PyObject,
) -> PyResult<[Option<Borrowed<'a, 'py, PyAny>>; 4]> {
    // SAFETY: forwarded from the caller.
    let nargs = unsafe { ffi::PyVectorcall_NARGS(nargsf as usize) };
    if nargs != 0 {
        return Err(PyTypeError::new_err(format!("__dlpack__() takes 0 positional arguments but {nargs} were given")));
    }
    let mut found = [None, None, None, None];
    if kwnames.is_null() {
        return Ok(found);
    }
    let interned = [intern!(py, "stream"), intern!(py, "max_version"), intern!(py, "dl_device"), intern!(py, "copy")];
    // SAFETY: `kwnames` is a tuple of str; the values follow the positional
    // arguments in `args`, one per name, all borrowed for the call.
    let names: Borrowed<'a, 'py, PyAny> = unsafe { Borrowed::from_ptr(py, kwnames) };
    let names = names.cast::<PyTuple>()?;
    for (i, name) in names.iter().enumerate() {
        let slot = interned.iter().position(|k| k.as_ptr() == name.as_ptr()).or_else(|| {
            let name = name.cast::<PyString>().ok()?.to_cow().ok()?;
            DLPACK_KEYWORDS.iter().position(|k| *k == name)
        });
        let Some(slot) = slot else {
            return Err(PyTypeError::new_err(format!("__dlpack__() got an unexpected keyword argument {}", name.repr()?)));
        };
        if found[slot].is_some() {
            return Err(PyTypeError::new_err(format!("__dlpack__() got multiple values for argument {}", name.repr()?)));
        }
        // SAFETY: see above.
        found[slot] = Some(unsafe { Borrowed::from_ptr(py, *args.add(nargs as usize + i)) });
    }
    Ok(found)
}

/// The body of `Tensor.__dlpack__`, run by PyO3's trampoline, which attaches
/// PyO3 to the thread (so that temporary references are released at once,
/// not deferred) and turns errors and panics into Python exceptions.
///
/// # Safety
/// Called by CPython through the method descriptor, with a `Tensor` self and
/// the arguments of a vectorcall.
unsafe fn dlpack_body(
    py: Python<'_>,
    slf: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargsf: ffi::Py_ssize_t,
    kwnames: *mut ffi::PyObject,
) -> PyResult<*mut ffi::PyObject> {
    crate::python_calls::entered();
    // SAFETY: a method descriptor of Tensor only calls this with a Tensor `self`;
    // the arguments are those of this vectorcall.
    let (slf, [stream, max_version, dl_device, copy]) = unsafe {
        (Borrowed::from_ptr(py, slf).cast_unchecked::<TensorObject>(), dlpack_keywords(py, args, nargsf, kwnames)?)
    };
    let request = slf.get().parse_request(stream.as_deref(), max_version.as_deref(), dl_device.as_deref(), copy.as_deref())?;
    // SAFETY: each export is a fresh managed tensor that the capsule takes over.
    let capsule = unsafe {
        if request.legacy {
            raw_into_capsule(py, Tensor::export::<DLManagedTensor>(&slf, &request)?)?
        } else {
            raw_into_capsule(py, Tensor::export::<DLManagedTensorVersioned>(&slf, &request)?)?
        }
    };
    Ok(capsule.into_ptr())
}

struct DlpackMethod;

// PyO3's own `#[pymethods]` use this trampoline; it is public but hidden, and
// pinned with PyO3 by Cargo.lock.
impl MethodDef<fastcall_cfunction_with_keywords::Func> for DlpackMethod {
    const METH: fastcall_cfunction_with_keywords::Func = dlpack_body;
}

/// The method definition behind `Tensor.__dlpack__`.
pub(super) fn method_def() -> ffi::PyMethodDef {
    ffi::PyMethodDef {
        ml_name: c"__dlpack__".as_ptr(),
        ml_meth: ffi::PyMethodDefPointer {
            PyCFunctionFastWithKeywords: fastcall_cfunction_with_keywords::<DlpackMethod>,
        },
        ml_flags: ffi::METH_FASTCALL | ffi::METH_KEYWORDS,
        ml_doc: DLPACK_DOC.as_ptr(),
    }
}
