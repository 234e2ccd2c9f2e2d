//! `dlbridge.Tensor`: an inspectable, standard-exact tensor that any framework
//! can take, and `dlbridge.DType`.
//!
//! A `Tensor` owns one managed tensor (imported, or made from Rust memory) and
//! is immutable as a Python object.
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | [`Tensor`], the data and its Rust API |
//! | `object.rs` | `dlbridge.Tensor`, the Python class: its methods and properties |
//! | `package.rs` | one `dlbridge.Tensor` class for every extension in a process |
//! | `exchange_table.rs` | dlbridge's DLPack C exchange table, `Tensor.__dlpack_c_exchange_api__` |
//! | `dlpack.rs` | `__dlpack__`: negotiation, flags, the capsule |
//! | `buffer.rs` | the buffer protocol and both array interfaces |
//! | `tolist.rs` | `tolist()` |
//! | `pickle.rs` | pickling, out of band with protocol 5 |

mod buffer;
mod dlpack;
mod exchange_table;
mod object;
mod package;
mod pickle;
mod shared;
mod tolist;

use dlbridge::streams::Stream;
use dlbridge::{Element, OwnedTensor, TensorView};
use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;

pub use exchange_table::EXCHANGE_API;
#[cfg(feature = "testing")]
pub(crate) use exchange_table::CALLS;
pub use object::TensorObject;
pub(crate) use package::{describe_package_tensor, import as import_package, prepare_package_api, publish, PackageTensor};
pub(crate) use pickle::_rebuild_tensor;
pub(crate) use shared::{_shared_exit_sweep, _shared_tensor, empty as shared_empty};
#[cfg(all(feature = "testing", unix))]
pub(crate) use shared::SKIP_FREE_SPACE_CHECK;

use crate::any_owned::AnyOwned;
use crate::borrows::HeldRead;
use crate::errors::IntoPyResult;
use crate::owner::ExceptionSafe;
use crate::ready::ReadyCell;
use crate::writability::Writability;

/// An n-dimensional tensor exchanged through DLPack: what an extension
/// returns to Python, and what `dlbridge.Tensor` objects hold.
///
/// Returned from a `#[pyfunction]`, it becomes an instance of the `dlbridge`
/// package's one `Tensor` class when the package is installed (see
/// `package.rs`), else of this extension's own class of the same name, which
/// works everywhere DLPack does.
pub struct Tensor {
    /// Dropped with any exception in flight kept intact (a deleter may run Python code).
    owned: ExceptionSafe<AnyOwned>,
    writability: Writability,
    /// The shared-memory segment the data lives in, if any: pickled as a handle.
    origin: Option<std::sync::Arc<shared::Shared>>,
    /// For device memory, where its data is ready (see `crate::ready`).
    ready: ReadyCell,
    /// For a tensor over another's bytes that Python code reads later
    /// (`_bytes()`): a shared borrow of them for as long as this one lives.
    held_read: HeldRead,
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
        Tensor { owned: ExceptionSafe::new(owned), writability, origin: None, ready, held_read: HeldRead::default() }
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
    pub fn read<'a>(&'a self, py: Python<'a>) -> PyResult<crate::ReadGuard<'a>> {
        self.owned.read(py)
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

    /// [`stream_for`](Self::stream_for) for a consumer that may work on the
    /// stream it is given (an extension argument, the exchange table): one
    /// that names none gets the data's stream, the legacy default for idle
    /// CUDA memory, which the tensor keeps as its data's stream from then on.
    pub(crate) fn lend_stream(&self, consumer: Option<i64>) -> PyResult<Option<i64>> {
        match consumer {
            None => self.ready.lend(),
            Some(_) => self.ready.stream_for(consumer),
        }
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
    pub(crate) fn share(slf: &Bound<'_, TensorObject>) -> PyResult<AnyOwned> {
        match slf.get().writability {
            Writability::Unknown => Tensor::share_as(slf).map(AnyOwned::Legacy),
            _ => Tensor::share_as(slf).map(AnyOwned::Versioned),
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
    pub(crate) fn host_read<'a>(&'a self, py: Python<'a>) -> PyResult<crate::ReadGuard<'a>> {
        self.check_host_access()?;
        self.read(py)
    }

    /// Blocks until the GPU work pending on CUDA managed memory is done, before
    /// the host reads it: a kernel may still be writing it on the ready stream.
    pub(crate) fn wait_for_host(&self) -> PyResult<()> {
        self.ready.wait_on_host()
    }
}
