//! `dlbridge.Tensor`: an inspectable, standard-exact tensor that any framework
//! can take, and `dlbridge.DType`.
//!
//! A `Tensor` owns one managed tensor (imported, or made from Rust memory) and
//! is immutable as a Python object. It is a producer for `__dlpack__`,
//! `__dlpack_device__`, the buffer protocol, `__array_interface__` and
//! `__cuda_array_interface__`.

use core::ffi::{c_int, c_void};

use dlbridge::export::export_view;
use dlbridge::ffi::{
    DLManagedTensor, DLManagedTensorVersioned, DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED, DLPACK_FLAG_BITMASK_READ_ONLY,
};
use dlbridge::{to_contiguous, DataType, DataTypeCode, Device, DeviceType, Element, Managed, ManagedAbi, ManagedTensor, TensorView};
use pyo3::exceptions::{PyAttributeError, PyBufferError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyComplex, PyDict, PyList, PyString, PyTuple};
use pyo3::{ffi, intern, Borrowed, IntoPyObjectExt};

use crate::capsule::{into_capsule, AnyManaged};
use crate::consumer::{parse_device_tuple, typestr};
use crate::errors::IntoPyResult;
use crate::owner::PyOwner;

/// An n-dimensional tensor exchanged through DLPack.
#[pyclass(frozen, freelist = 64, module = "dlbridge", name = "Tensor")]
pub struct Tensor {
    managed: AnyManaged,
    readonly: bool,
}

impl Tensor {
    /// Wraps an owned tensor; it is read-only if its producer said so.
    pub fn new(managed: impl Into<AnyManaged>) -> Self {
        let managed = managed.into();
        let readonly = managed.is_read_only();
        Tensor { managed, readonly }
    }

    /// A writable row-major tensor over a `Vec`, without copying.
    pub fn from_vec<T: Element>(data: Vec<T>, shape: &[i64]) -> PyResult<Self> {
        Ok(Tensor::new(ManagedTensor::from_vec(data, shape).py()?))
    }

    /// A tensor over an owned `ndarray` array, without copying.
    #[cfg(feature = "ndarray")]
    pub fn from_array<T: Element, D: ndarray::Dimension + Send + 'static>(array: ndarray::Array<T, D>) -> PyResult<Self> {
        Ok(Tensor::new(ManagedTensor::from_array(array).py()?))
    }

    /// The validated view.
    pub fn view(&self) -> &TensorView<'_> {
        self.managed.view()
    }

    /// Whether writes are forbidden.
    pub fn readonly(&self) -> bool {
        self.readonly
    }

    /// The owned tensor.
    pub fn managed(&self) -> &AnyManaged {
        &self.managed
    }
}

/// The parsed keywords of `__dlpack__`.
struct ExportRequest {
    legacy: bool,
    device: Device,
    copy: Option<bool>,
}

fn parse_max_version(max_version: Option<&Bound<'_, PyAny>>) -> PyResult<bool> {
    let Some(v) = max_version.filter(|v| !v.is_none()) else { return Ok(true) };
    let (major, _minor): (i64, i64) = v
        .extract()
        .map_err(|_| PyTypeError::new_err(format!("max_version must be None or a (major, minor) tuple of ints, got {v}")))?;
    Ok(major < 1)
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

/// Checks `stream` against the spec's rules for the device. No work is pending
/// on any stream for a dlbridge tensor, so a valid stream needs no synchronisation.
fn check_stream(stream: Option<&Bound<'_, PyAny>>, device: Device) -> PyResult<()> {
    let Some(stream) = stream.filter(|s| !s.is_none()) else { return Ok(()) };
    if !device.device_type.has_streams() {
        return Err(PyValueError::new_err(format!(
            "stream must be None for a tensor on {device}, which has no streams; got {stream}"
        )));
    }
    let value: i64 = stream
        .extract()
        .map_err(|_| PyTypeError::new_err(format!("stream must be None or an int, got {stream}")))?;
    let valid = match device.device_type {
        DeviceType::ROCM => value == -1 || value == 0 || value > 2,
        _ => value == -1 || value >= 1,
    };
    if !valid {
        return Err(PyValueError::new_err(format!("stream {value} is not valid for a tensor on {device}")));
    }
    Ok(())
}

impl Tensor {
    fn parse_request(
        &self,
        stream: Option<&Bound<'_, PyAny>>,
        max_version: Option<&Bound<'_, PyAny>>,
        dl_device: Option<&Bound<'_, PyAny>>,
        copy: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<ExportRequest> {
        let legacy = parse_max_version(max_version)?;
        let copy = parse_copy(copy)?;
        let own = self.view().device();
        let device = match dl_device.filter(|d| !d.is_none()) {
            None => own,
            Some(d) => {
                let wanted = parse_device_tuple(d, "dl_device")?;
                if wanted == own || (wanted == Device::CPU && own.is_cpu_accessible()) {
                    wanted
                } else if copy == Some(false) {
                    return Err(PyBufferError::new_err(format!(
                        "exporting to {wanted} would need a copy from {own}, and copy=False forbids it"
                    )));
                } else {
                    return Err(PyBufferError::new_err(format!("unsupported device requested: {wanted} (tensor is on {own})")));
                }
            }
        };
        check_stream(stream, device)?;
        if legacy && self.readonly && copy != Some(true) {
            return Err(PyBufferError::new_err(
                "cannot export a read-only tensor as a legacy DLPack capsule, which cannot signal read-only; \
                 pass max_version=(1, 0) or higher, or copy=True",
            ));
        }
        if legacy && self.view().is_subbyte_padded() {
            return Err(PyBufferError::new_err("a padded sub-byte tensor needs a versioned capsule to say so"));
        }
        Ok(ExportRequest { legacy, device, copy })
    }

    /// An owning versioned export sharing this tensor's memory, as
    /// `__dlpack__(max_version=(1, 3))` gives; for the exchange API.
    pub(crate) fn export_versioned(slf: &Bound<'_, Self>) -> PyResult<ManagedTensor> {
        let request = ExportRequest { legacy: false, device: slf.get().view().device(), copy: None };
        Self::export::<DLManagedTensorVersioned>(slf, &request)
    }

    /// A managed tensor of ABI `M` sharing this tensor's memory, or a fresh copy.
    fn export<M: ManagedAbi>(slf: &Bound<'_, Self>, request: &ExportRequest) -> PyResult<Managed<M>> {
        let this = slf.get();
        let view = this.view();
        if request.copy == Some(true) {
            return to_contiguous::<M>(view).py();
        }
        let mut flags = if this.readonly { DLPACK_FLAG_BITMASK_READ_ONLY } else { 0 };
        if view.is_subbyte_padded() {
            flags |= DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED;
        }
        // SAFETY: the memory is this tensor's, valid for its validated layout for
        // as long as the tensor object lives, which the owner guarantees. It is
        // written only if the tensor is writable (READ_ONLY is set otherwise).
        // `request.device` reaches the same memory (checked by `parse_request`).
        Ok(unsafe { export_view(PyOwner::new(slf.as_any()), view, request.device, flags) })
    }

    fn cpu_view(&self) -> PyResult<&TensorView<'_>> {
        let view = self.view();
        if !view.device().is_cpu_accessible() {
            return Err(PyBufferError::new_err(format!("tensor on {} is not accessible from the CPU", view.device())));
        }
        Ok(view)
    }
}

fn shape_tuple<'py>(py: Python<'py>, values: &[i64]) -> PyResult<Bound<'py, PyTuple>> {
    PyTuple::new(py, values)
}

fn device_tuple(py: Python<'_>, device: Device) -> PyResult<Bound<'_, PyTuple>> {
    PyTuple::new(py, [device.device_type.0, device.device_id])
}

/// One element at `ptr` as a Python object.
///
/// # Safety
/// `ptr` must point at a readable element of `dtype`.
unsafe fn read_scalar<'py>(py: Python<'py>, ptr: *const u8, dtype: DataType) -> PyResult<Bound<'py, PyAny>> {
    use DataTypeCode as C;
    // SAFETY: forwarded from the caller; every read is unaligned and of the
    // dtype's own size, checked by the match.
    unsafe {
        macro_rules! read {
            ($t:ty) => {
                ptr.cast::<$t>().read_unaligned()
            };
        }
        let value = match (dtype.code, dtype.bits, dtype.lanes) {
            (C::BOOL, 8, 1) => (read!(u8) != 0).into_bound_py_any(py)?,
            (C::INT, 8, 1) => read!(i8).into_bound_py_any(py)?,
            (C::INT, 16, 1) => read!(i16).into_bound_py_any(py)?,
            (C::INT, 32, 1) => read!(i32).into_bound_py_any(py)?,
            (C::INT, 64, 1) => read!(i64).into_bound_py_any(py)?,
            (C::UINT, 8, 1) => read!(u8).into_bound_py_any(py)?,
            (C::UINT, 16, 1) => read!(u16).into_bound_py_any(py)?,
            (C::UINT, 32, 1) => read!(u32).into_bound_py_any(py)?,
            (C::UINT, 64, 1) => read!(u64).into_bound_py_any(py)?,
            (C::FLOAT, 16, 1) => half::f16::from_bits(read!(u16)).to_f64().into_bound_py_any(py)?,
            (C::FLOAT, 32, 1) => f64::from(read!(f32)).into_bound_py_any(py)?,
            (C::FLOAT, 64, 1) => read!(f64).into_bound_py_any(py)?,
            (C::BFLOAT, 16, 1) => f64::from(half::bf16::from_bits(read!(u16)).to_f32()).into_bound_py_any(py)?,
            (C::COMPLEX, 64, 1) => {
                let [re, im] = read!([f32; 2]);
                PyComplex::from_doubles(py, re.into(), im.into()).into_any()
            }
            (C::COMPLEX, 128, 1) => {
                let [re, im] = read!([f64; 2]);
                PyComplex::from_doubles(py, re, im).into_any()
            }
            _ => return Err(PyBufferError::new_err(format!("tolist() does not support dtype {dtype}"))),
        };
        Ok(value)
    }
}

/// Nested lists of the elements reached from `ptr`.
///
/// # Safety
/// Every element the layout reaches from `ptr` must be readable.
unsafe fn build_list<'py>(py: Python<'py>, ptr: *const u8, shape: &[i64], strides: &[isize], dtype: DataType) -> PyResult<Bound<'py, PyAny>> {
    match shape.split_first() {
        // SAFETY: forwarded from the caller.
        None => unsafe { read_scalar(py, ptr, dtype) },
        Some((&n, rest)) => {
            let list = PyList::empty(py);
            for i in 0..n as isize {
                // SAFETY: index i < n along this axis stays within the layout.
                list.append(unsafe { build_list(py, ptr.wrapping_offset(i * strides[0]), rest, &strides[1..], dtype)? })?;
            }
            Ok(list.into_any())
        }
    }
}

#[pymethods]
impl Tensor {
    /// Extent of each axis.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        shape_tuple(py, self.view().shape())
    }

    /// Number of axes.
    #[getter]
    fn ndim(&self) -> usize {
        self.view().ndim()
    }

    /// Number of elements.
    #[getter]
    fn size(&self) -> usize {
        self.view().len()
    }

    /// Bytes the elements take when contiguous.
    #[getter]
    fn nbytes(&self) -> usize {
        self.view().nbytes()
    }

    /// Stride of each axis, in elements; always filled in.
    #[getter]
    fn strides<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        shape_tuple(py, self.view().strides())
    }

    /// Element type.
    #[getter]
    fn dtype(&self) -> DType {
        DType(self.view().dtype())
    }

    /// `(device_type, device_id)`, as `__dlpack_device__` returns.
    #[getter]
    fn device<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        device_tuple(py, self.view().device())
    }

    /// Whether the data may not be written.
    #[getter(readonly)]
    fn is_readonly(&self) -> bool {
        self.readonly
    }

    /// Whether the producer made a copy for this tensor (IS_COPIED).
    #[getter]
    fn is_copied(&self) -> bool {
        self.managed.is_copied()
    }

    /// Address of element 0, `byte_offset` applied.
    #[getter]
    fn data_ptr(&self) -> usize {
        self.view().as_ptr() as usize
    }

    /// `__dlpack__`, installed as a method descriptor over [`dlpack_fastcall`]:
    /// CPython's `METH_FASTCALL | METH_KEYWORDS` convention with keyword names
    /// matched by identity, which PyO3's generic parser cannot offer.
    #[classattr]
    #[pyo3(name = "__dlpack__")]
    fn dlpack_descriptor(py: Python<'_>) -> PyResult<Py<PyAny>> {
        // Re-entrant during type creation: PyO3 hands out the type before
        // filling its dict with class attributes such as this one.
        let ty = py.get_type::<Tensor>();
        let def = Box::leak(Box::new(ffi::PyMethodDef {
            ml_name: c"__dlpack__".as_ptr(),
            ml_meth: ffi::PyMethodDefPointer { PyCFunctionFastWithKeywords: dlpack_fastcall },
            ml_flags: ffi::METH_FASTCALL | ffi::METH_KEYWORDS,
            ml_doc: DLPACK_DOC.as_ptr(),
        }));
        // SAFETY: the type is live and the method definition is leaked, so it
        // outlives the descriptor, as CPython requires.
        unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyDescr_NewMethod(ty.as_type_ptr(), def)) }.map(Bound::unbind)
    }

    /// The DLPack 1.3 C exchange API: a `"dlpack_exchange_api"` capsule holding
    /// a static table shared by every tensor.
    #[classattr]
    fn __dlpack_c_exchange_api__(py: Python<'_>) -> PyResult<Py<PyAny>> {
        crate::exchange::exchange_api_capsule(py)
    }

    /// `(device_type, device_id)` of the memory.
    fn __dlpack_device__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        device_tuple(py, self.view().device())
    }

    /// NumPy's array interface (version 3), for CPU-accessible tensors.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let view = self.view();
        if !view.device().is_cpu_accessible() {
            return Err(PyAttributeError::new_err(format!("__array_interface__ is only offered on the CPU; tensor is on {}", view.device())));
        }
        self.interface_dict(py)
    }

    /// The CUDA array interface (version 3), for tensors in CUDA memory.
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let device = self.view().device();
        if !matches!(device.device_type, DeviceType::CUDA | DeviceType::CUDA_MANAGED) {
            return Err(PyAttributeError::new_err(format!("__cuda_array_interface__ is only offered for CUDA memory; tensor is on {device}")));
        }
        let dict = self.interface_dict(py)?;
        // No work of ours is pending on any stream.
        dict.set_item("stream", py.None())?;
        Ok(dict)
    }

    /// Buffer protocol (CPU only): struct format, shape, byte strides, read-only state.
    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        let this = slf.get();
        // SAFETY: CPython passes a writable Py_buffer; `obj` must be NULL on failure.
        unsafe { (*view).obj = core::ptr::null_mut() };
        let tensor = this.cpu_view()?;
        if flags & ffi::PyBUF_WRITABLE != 0 && this.readonly {
            return Err(PyBufferError::new_err("tensor is read-only"));
        }
        let dtype = tensor.dtype();
        let format = dtype
            .buffer_format()
            .ok_or_else(|| PyBufferError::new_err(format!("dtype {dtype} has no buffer-protocol (struct) format")))?;
        let itemsize = dtype.itemsize().unwrap_or(1) as isize;
        let wants = |bits: c_int| flags & bits == bits;
        let c_contig = tensor.is_c_contiguous();
        if (!wants(ffi::PyBUF_STRIDES) || flags & 0x20 != 0) && !c_contig {
            return Err(PyBufferError::new_err("tensor is not C-contiguous"));
        }
        if flags & 0x40 != 0 && !tensor.is_f_contiguous() {
            return Err(PyBufferError::new_err("tensor is not Fortran-contiguous"));
        }
        if flags & 0x80 != 0 && !c_contig && !tensor.is_f_contiguous() {
            return Err(PyBufferError::new_err("tensor is not contiguous"));
        }
        let ndim = tensor.ndim();
        let mut dims: Box<Vec<isize>> = Box::new(Vec::with_capacity(2 * ndim));
        dims.extend(tensor.shape().iter().map(|&d| d as isize));
        dims.extend(tensor.strides().iter().map(|&s| s as isize * itemsize));
        let dims_ptr = dims.as_mut_ptr();
        // SAFETY: every field is written before CPython reads any; the shape and
        // strides live in `internal` until `__releasebuffer__`, and `obj` holds a
        // strong reference that keeps the memory alive.
        unsafe {
            (*view).buf = tensor.as_ptr().cast_mut();
            (*view).len = (tensor.len() as isize) * itemsize;
            (*view).readonly = c_int::from(this.readonly);
            (*view).itemsize = itemsize;
            (*view).format = if wants(ffi::PyBUF_FORMAT) { format.as_ptr().cast_mut() } else { core::ptr::null_mut() };
            (*view).ndim = ndim as c_int;
            (*view).shape = if wants(ffi::PyBUF_ND) { dims_ptr } else { core::ptr::null_mut() };
            (*view).strides = if wants(ffi::PyBUF_STRIDES) { dims_ptr.add(ndim) } else { core::ptr::null_mut() };
            (*view).suboffsets = core::ptr::null_mut();
            (*view).internal = Box::into_raw(dims).cast::<c_void>();
            (*view).obj = slf.into_any().into_ptr();
        }
        Ok(())
    }

    unsafe fn __releasebuffer__(&self, view: *mut ffi::Py_buffer) {
        // SAFETY: `internal` was set by `__getbuffer__` to a leaked Box<Vec<isize>>,
        // released once here.
        unsafe {
            let internal = (*view).internal.cast::<Vec<isize>>();
            if !internal.is_null() {
                drop(Box::from_raw(internal));
                (*view).internal = core::ptr::null_mut();
            }
        }
    }

    /// The elements as nested Python lists (CPU only).
    fn tolist<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let view = self.cpu_view()?;
        let itemsize = view
            .dtype()
            .itemsize()
            .ok_or_else(|| PyBufferError::new_err(format!("tolist() does not support dtype {}", view.dtype())))?
            as isize;
        let strides: Vec<isize> = view.strides().iter().map(|&s| s as isize * itemsize).collect();
        if view.is_empty() {
            // Nothing is read: nested empty lists down to the first zero extent.
            return empty_lists(py, view.shape());
        }
        // SAFETY: the view was validated; every index of its shape reaches a
        // readable element through these byte strides.
        unsafe { build_list(py, view.as_ptr().cast(), view.shape(), &strides, view.dtype()) }
    }

    /// A C-contiguous copy in fresh memory that Rust owns.
    fn copy(&self) -> PyResult<Tensor> {
        let copied: ManagedTensor = to_contiguous(self.view()).py()?;
        Ok(Tensor::new(copied))
    }

    fn __len__(&self) -> PyResult<usize> {
        self.view()
            .shape()
            .first()
            .map(|&d| d as usize)
            .ok_or_else(|| PyTypeError::new_err("len() of a 0-d tensor"))
    }

    fn __repr__(&self) -> String {
        let view = self.view();
        let shape: Vec<String> = view.shape().iter().map(i64::to_string).collect();
        let shape = if shape.len() == 1 { format!("({},)", shape[0]) } else { format!("({})", shape.join(", ")) };
        let ro = if self.readonly { ", readonly" } else { "" };
        format!("Tensor(shape={shape}, dtype={}, device={}{ro})", view.dtype(), view.device())
    }
}

const DLPACK_DOC: &core::ffi::CStr = c"__dlpack__($self, /, *, stream=None, max_version=None, dl_device=None, copy=None)\n--\n\nThe DLPack export, per the array API: a legacy \"dltensor\" capsule when max_version is None or below (1, 0), else a \"dltensor_versioned\" capsule at version 1.3.";

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
        // SAFETY: see above.
        found[slot] = Some(unsafe { Borrowed::from_ptr(py, *args.add(nargs as usize + i)) });
    }
    Ok(found)
}

/// The C entry point of `Tensor.__dlpack__` (`METH_FASTCALL | METH_KEYWORDS`).
unsafe extern "C" fn dlpack_fastcall(
    slf: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargsf: ffi::Py_ssize_t,
    kwnames: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: CPython calls methods with the GIL held.
    let py = unsafe { Python::assume_attached() };
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| -> PyResult<Bound<'_, PyAny>> {
        // SAFETY: a method descriptor of Tensor only calls this with a Tensor
        // `self`; the arguments are those of this vectorcall.
        let (slf, [stream, max_version, dl_device, copy]) = unsafe {
            (Borrowed::from_ptr(py, slf).cast_unchecked::<Tensor>(), dlpack_keywords(py, args, nargsf, kwnames)?)
        };
        let request = slf.get().parse_request(stream.as_deref(), max_version.as_deref(), dl_device.as_deref(), copy.as_deref())?;
        if request.legacy {
            into_capsule(py, Tensor::export::<DLManagedTensor>(&slf, &request)?)
        } else {
            into_capsule(py, Tensor::export::<DLManagedTensorVersioned>(&slf, &request)?)
        }
    }));
    match outcome {
        Ok(Ok(capsule)) => capsule.into_ptr(),
        Ok(Err(err)) => {
            err.restore(py);
            core::ptr::null_mut()
        }
        Err(_) => {
            pyo3::exceptions::PyRuntimeError::new_err("dlbridge panicked in __dlpack__").restore(py);
            core::ptr::null_mut()
        }
    }
}

fn empty_lists<'py>(py: Python<'py>, shape: &[i64]) -> PyResult<Bound<'py, PyAny>> {
    match shape.split_first() {
        Some((&0, _)) | None => Ok(PyList::empty(py).into_any()),
        Some((&n, rest)) => {
            let list = PyList::empty(py);
            for _ in 0..n {
                list.append(empty_lists(py, rest)?)?;
            }
            Ok(list.into_any())
        }
    }
}

impl Tensor {
    fn interface_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let view = self.view();
        let dtype = view.dtype();
        let typestr = typestr(dtype)
            .ok_or_else(|| PyBufferError::new_err(format!("dtype {dtype} has no NumPy typestr")))?;
        let itemsize = dtype.itemsize().unwrap_or(1) as i64;
        let dict = PyDict::new(py);
        dict.set_item("shape", shape_tuple(py, view.shape())?)?;
        dict.set_item("typestr", &typestr)?;
        dict.set_item("descr", PyList::new(py, [("", typestr.as_str())])?)?;
        let address = if view.is_empty() { 0 } else { view.as_ptr() as usize };
        dict.set_item("data", (address, self.readonly))?;
        if view.is_c_contiguous() {
            dict.set_item("strides", py.None())?;
        } else {
            let strides: Vec<i64> = view.strides().iter().map(|s| s * itemsize).collect();
            dict.set_item("strides", PyTuple::new(py, strides)?)?;
        }
        dict.set_item("version", 3)?;
        Ok(dict)
    }
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
        name.parse().map(DType).py()
    }

    /// The DLPack type code.
    #[getter]
    fn code(&self) -> u8 {
        self.0.code.0
    }

    /// Bits of one lane.
    #[getter]
    fn bits(&self) -> u8 {
        self.0.bits
    }

    /// Lanes per element.
    #[getter]
    fn lanes(&self) -> u16 {
        self.0.lanes
    }

    /// Bytes per element, or None for packed sub-byte types.
    #[getter]
    fn itemsize(&self) -> Option<usize> {
        self.0.itemsize()
    }

    fn __str__(&self) -> String {
        self.0.to_string()
    }

    fn __repr__(&self) -> String {
        format!("dlbridge.DType('{}')", self.0)
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        if let Ok(other) = other.cast::<DType>() {
            return other.get().0 == self.0;
        }
        if let Ok(name) = other.cast::<PyString>() {
            return name.to_str().ok().and_then(|n| n.parse::<DataType>().ok()) == Some(self.0);
        }
        false
    }

    fn __hash__(&self, py: Python<'_>) -> PyResult<isize> {
        // Equal to the hash of the canonical name, since the two compare equal.
        PyString::new(py, &self.0.to_string()).hash()
    }
}

/// Parses a `dtype` argument: a name or a `DType`.
pub(crate) fn parse_dtype(dtype: &Bound<'_, PyAny>) -> PyResult<DataType> {
    if let Ok(d) = dtype.cast::<DType>() {
        return Ok(d.get().0);
    }
    let name: &str = &dtype
        .cast::<PyString>()
        .map_err(|_| PyTypeError::new_err(format!("dtype must be a str or dlbridge.DType, got {dtype}")))?
        .to_cow()?;
    name.parse().py()
}
