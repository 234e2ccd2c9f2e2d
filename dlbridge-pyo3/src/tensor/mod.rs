//! `dlbridge.Tensor`: an inspectable, standard-exact tensor that any framework
//! can take, and `dlbridge.DType`.
//!
//! A `Tensor` owns one managed tensor (imported, or made from Rust memory) and
//! is immutable as a Python object.
//!
//! | file | what |
//! |---|---|
//! | `dlpack.rs` | `__dlpack__`: negotiation, flags, the capsule |
//! | `buffer.rs` | the buffer protocol and both array interfaces |
//! | `tolist.rs` | `tolist()` |
//! | `pickle.rs` | pickling, out of band with protocol 5 |
//! | `dtype.rs` | `dlbridge.DType` |

mod buffer;
mod dlpack;
mod dtype;
mod pickle;
mod tolist;

use core::ffi::c_int;

use dlbridge::streams::Stream;
use dlbridge::{to_contiguous, DeviceType, Element, OwnedTensor, TensorView};
use pyo3::exceptions::{PyAttributeError, PyBufferError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use pyo3::{ffi, intern};

pub use dtype::DType;
pub(crate) use pickle::_rebuild_tensor;

use crate::capsule::AnyOwned;
use crate::convert::device_tuple;
use crate::errors::IntoPyResult;
use crate::owner::ExceptionSafe;
use crate::ready::ReadyCell;
use crate::writability::Writability;

/// An n-dimensional tensor exchanged through DLPack.
#[pyclass(frozen, freelist = 64, module = "dlbridge", name = "Tensor")]
pub struct Tensor {
    /// Dropped with any exception in flight kept intact (a deleter may run Python code).
    owned: ExceptionSafe<AnyOwned>,
    writability: Writability,
    /// The shared-memory segment the data lives in, if any: kept alive with
    /// the tensor, and asked to pickle it as a handle.
    origin: Option<Py<PyAny>>,
    /// For device memory, where its data is ready (see `crate::ready`).
    ready: ReadyCell,
}

impl Tensor {
    /// Wraps an owned tensor; writable only if its producer said so (see
    /// [`Writability`]). Its memory is from then on reachable from Python
    /// (buffer protocol, `__dlpack__`), so Rust reads it through [`read`](Self::read).
    pub fn new(owned: impl Into<AnyOwned>) -> Self {
        let owned = owned.into();
        let writability = Writability::of(&owned);
        Self::wrap(owned, writability)
    }

    /// Wraps an owned tensor with at most the writability `requested`: a
    /// producer's READ_ONLY is kept, writable may become read-only or unknown.
    pub(crate) fn with_writability(owned: AnyOwned, requested: Writability) -> Self {
        let writability = match Writability::of(&owned) {
            Writability::Writable => requested,
            own => own,
        };
        Self::wrap(owned, writability)
    }

    fn wrap(mut owned: AnyOwned, writability: Writability) -> Self {
        owned.mark_aliased();
        let ready = ReadyCell::idle(owned.view().device());
        Tensor { owned: ExceptionSafe::new(owned), writability, origin: None, ready }
    }

    /// A writable row-major tensor over a `Vec`, without copying.
    pub fn from_vec<T: Element>(data: Vec<T>, shape: &[i64]) -> PyResult<Self> {
        Ok(Tensor::new(OwnedTensor::from_vec(data, shape).py()?))
    }

    /// A tensor over an owned `ndarray` array, without copying.
    #[cfg(feature = "ndarray")]
    pub fn from_array<T: Element, D: ndarray::Dimension + Send + 'static>(array: ndarray::Array<T, D>) -> PyResult<Self> {
        Ok(Tensor::new(OwnedTensor::from_array(array).py()?))
    }

    /// The validated view: shape, strides, dtype, device and addresses. Its
    /// typed reads refuse, since Python code can reach the memory: read
    /// through [`read`](Self::read).
    pub fn view(&self) -> &TensorView<'_> {
        self.owned.view()
    }

    /// A shared borrow of the tensor's bytes, with a view whose typed reads
    /// work while it lives; BufferError while an extension holds a
    /// [`PyTensorMut`](crate::PyTensorMut) of overlapping memory.
    pub fn read(&self) -> PyResult<crate::ReadGuard<'_>> {
        self.owned.read()
    }

    /// Whether writes are not known to be allowed (read-only, or unknown).
    pub fn readonly(&self) -> bool {
        !self.writability.is_writable()
    }

    /// The same tensor, with its data ready on `stream` (device memory only;
    /// [`Stream::NO_SYNC`] leaves no stream to wait for). No handle is kept:
    /// on a CUDA stream other than the legacy default, an event dlbridge owns
    /// is recorded now, which needs the driver.
    pub fn with_ready_stream(self, stream: Option<Stream>) -> PyResult<Self> {
        self.ready_on(stream.map(Stream::value))
    }

    /// [`with_ready_stream`](Self::with_ready_stream) with a protocol value that
    /// came from a producer or a Python caller, for this call.
    pub(crate) fn ready_on(mut self, stream: Option<i64>) -> PyResult<Self> {
        self.ready = ReadyCell::keep(self.view().device(), stream)?;
        Ok(self)
    }

    /// The stream the data is ready on, for device memory with pending work:
    /// the legacy default stream (1), made to wait for the work first if it was
    /// pending elsewhere (see `crate::ready`); `None` when none is pending.
    pub fn ready_stream(&self) -> PyResult<Option<i64>> {
        self.ready.stream_for(None)
    }

    /// The stream the data is ready on for a consumer on `consumer` (`None`:
    /// the legacy default), valid for this call.
    pub(crate) fn stream_for(&self, consumer: Option<i64>) -> PyResult<Option<i64>> {
        self.ready.stream_for(consumer)
    }

    /// What the producer said about writes.
    pub fn writability(&self) -> Writability {
        self.writability
    }

    /// The owned tensor.
    pub fn owned(&self) -> &AnyOwned {
        &self.owned
    }

    /// A new owned tensor sharing this one's memory, for `from_dlpack(tensor)`:
    /// legacy when the writability is unknown, so that it stays unknown. Its
    /// data stays ready on this tensor's stream, which the caller carries over.
    pub(crate) fn share(slf: &Bound<'_, Self>) -> PyResult<AnyOwned> {
        match slf.get().writability {
            Writability::Unknown => Tensor::export_legacy(slf).map(AnyOwned::Legacy),
            _ => Tensor::export_versioned(slf).map(AnyOwned::Versioned),
        }
    }

    /// Checks that the host may read or write the memory now: refused for
    /// memory the CPU cannot reach, and waited for (see [`wait_for_host`](Self::wait_for_host)).
    /// Every path that hands the memory to host code (buffer protocol, array
    /// interface, `numpy()`, `tolist()`, copies, pickling) goes through it.
    pub(crate) fn check_host_access(&self) -> PyResult<()> {
        let device = self.view().device();
        if !device.is_cpu_accessible() {
            return Err(PyBufferError::new_err(format!(
                "the tensor is on {device}, which is not accessible from the CPU; copy it to the host first: dlbridge.from_dlpack(t, device=\"cpu\")"
            )));
        }
        self.wait_for_host()
    }

    /// [`read`](Self::read) for the host, after [`check_host_access`](Self::check_host_access).
    pub(crate) fn host_read(&self) -> PyResult<crate::ReadGuard<'_>> {
        self.check_host_access()?;
        self.read()
    }

    /// Blocks until the GPU work pending on CUDA managed memory is done, before
    /// the host reads it: a kernel may still be writing it on the ready stream.
    pub(crate) fn wait_for_host(&self) -> PyResult<()> {
        self.ready.wait_on_host()
    }
}

#[pymethods]
impl Tensor {
    /// Extent of each axis.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.view().shape())
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
        PyTuple::new(py, self.view().strides())
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

    /// Whether the data may not be written: True when the producer said so,
    /// and when it could not say (a legacy capsule).
    #[getter(readonly)]
    fn is_readonly(&self) -> bool {
        self.readonly()
    }

    /// Whether the producer made a copy for this tensor (IS_COPIED).
    #[getter]
    fn is_copied(&self) -> bool {
        self.owned.is_copied()
    }

    /// Address of element 0, `byte_offset` applied.
    #[getter]
    fn data_ptr(&self) -> usize {
        self.view().as_ptr() as usize
    }

    /// `__dlpack__`, installed as a method descriptor (see `dlpack.rs`).
    #[classattr]
    #[pyo3(name = "__dlpack__")]
    fn dlpack_descriptor(py: Python<'_>) -> PyResult<Py<PyAny>> {
        // Re-entrant during type creation: PyO3 hands out the type before
        // filling its dict with class attributes such as this one.
        let ty = py.get_type::<Tensor>();
        let def = Box::leak(Box::new(dlpack::method_def()));
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
        let device = self.view().device();
        if !device.is_cpu_accessible() {
            return Err(PyAttributeError::new_err(format!("__array_interface__ is only offered on the CPU; tensor is on {device}")));
        }
        self.wait_for_host()?;
        buffer::interface_dict(py, self)
    }

    /// The CUDA array interface (version 3), for tensors in CUDA memory.
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let device = self.view().device();
        if !matches!(device.device_type, DeviceType::CUDA | DeviceType::CUDA_MANAGED) {
            return Err(PyAttributeError::new_err(format!("__cuda_array_interface__ is only offered for CUDA memory; tensor is on {device}")));
        }
        let dict = buffer::interface_dict(py, self)?;
        // The stream the data is ready on; None when no work is pending.
        dict.set_item("stream", self.ready_stream()?)?;
        Ok(dict)
    }

    /// Buffer protocol (CPU only): struct format, shape, byte strides, read-only state.
    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        // SAFETY: CPython's own buffer request.
        unsafe { buffer::get_buffer(slf, view, flags) }
    }

    unsafe fn __releasebuffer__(&self, view: *mut ffi::Py_buffer) {
        // SAFETY: a buffer that `__getbuffer__` filled.
        unsafe { buffer::release_buffer(view) }
    }

    /// The elements as nested Python lists (CPU only).
    fn tolist<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        tolist::tolist(py, self.host_read()?.view())
    }

    /// Pickle support: out-of-band bytes with protocol 5, in-band before.
    fn __reduce_ex__<'py>(slf: &Bound<'py, Self>, protocol: i64) -> PyResult<Bound<'py, PyTuple>> {
        pickle::reduce_ex(slf, protocol)
    }

    /// `copy.copy`: the same values and writability in new memory (see pickle.rs).
    fn __copy__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        pickle::copy(slf)
    }

    /// `copy.deepcopy`: as `copy.copy`, since a tensor holds no Python objects.
    fn __deepcopy__<'py>(slf: &Bound<'py, Self>, _memo: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        pickle::copy(slf)
    }

    /// The bytes of a C-contiguous CPU tensor as a 1-d uint8 tensor sharing them.
    fn _bytes(slf: &Bound<'_, Self>) -> PyResult<Tensor> {
        pickle::bytes_view(slf)
    }

    /// "writable", "readonly" or "unknown" (see the README's Writability).
    #[getter]
    fn _writability(&self) -> &'static str {
        self.writability.name()
    }

    /// Whether a sub-byte dtype is stored one element per byte (IS_SUBBYTE_TYPE_PADDED).
    #[getter]
    fn _subbyte_padded(&self) -> bool {
        self.view().is_subbyte_padded()
    }

    /// A tensor with the same values in a shared-memory segment (this one if
    /// it already is): pickling it sends a handle, and the receiving process
    /// maps the same memory. See `dlbridge.share_memory`.
    fn share_memory<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        if slf.get().origin.is_some() {
            return Ok(slf.clone().into_any());
        }
        let py = slf.py();
        py.import(intern!(py, "dlbridge._shared"))?.getattr(intern!(py, "share_memory"))?.call1((slf,))
    }

    /// Whether the data lives in a shared-memory segment that pickles as a handle.
    #[getter]
    fn is_shared(&self) -> bool {
        self.origin.is_some()
    }

    /// A NumPy array over this tensor's memory, zero-copy and as writable as
    /// the tensor; `ml_dtypes` types (bfloat16, float8, ...) for the dtypes
    /// NumPy lacks. A packed sub-byte tensor is unpacked into a new array.
    fn numpy<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        // Whatever route NumPy is given below, host code reads the memory next.
        slf.get().check_host_access()?;
        let py = slf.py();
        py.import(intern!(py, "dlbridge._numpy"))?.getattr(intern!(py, "to_numpy"))?.call1((slf,))
    }

    /// A C-contiguous copy in fresh memory that Rust owns.
    fn copy(&self) -> PyResult<Tensor> {
        let copied: OwnedTensor = to_contiguous(self.host_read()?.view()).py()?;
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
        let ro = if self.readonly() { ", readonly" } else { "" };
        format!("Tensor(shape={shape}, dtype={}, device={}{ro})", view.dtype(), view.device())
    }
}
