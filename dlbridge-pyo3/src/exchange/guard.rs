//! The checks a producer's `__dlpack__` makes that its exchange table skips,
//! and when to make them; and what its `__dlpack__` says that its fill cannot.
//!
//! torch's `__dlpack__` refuses tensors that require grad and tensors with the
//! conjugate bit; its table does not, so [`Guard::Torch`] asks torch here (and
//! refuses the negative bit too, whose data DLPack would carry un-negated).
//! A fill carries no flags. The exports of `torch.Tensor`'s own table never
//! set READ_ONLY or IS_COPIED (`__dlpack__` does only when the consumer asks:
//! `read_only=True`, `copy=True`, a `dl_device` that needs a copy), so its
//! fill is taken as writable, as its export would say. A subclass that
//! publishes a table of its own gets no such trust: torch's
//! `ReadOnlyTensorWrapper` publishes one whose exports are read-only.
//!
//! Asking runs Python whenever torch dispatches `__torch_function__` (a
//! subclass that overrides it, a torch function mode), and that code may free
//! or move the storage. So every check runs before the table exports or
//! fills, never between taking a pointer and using it, as torch's own
//! `__dlpack__` orders them. The conjugate bit exists only on complex tensors:
//! it is asked only when the tensor taken turns out complex, which is then
//! dropped and taken again after the question.

use dlbridge::{DataType, DataTypeCode};
use pyo3::exceptions::{PyBufferError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::PyType;
use pyo3::{ffi, intern};

use crate::writability::Writability;

/// Checks a producer's `__dlpack__` makes that its table does not.
#[derive(Clone, Copy, Debug)]
pub enum Guard {
    /// The table checks what `__dlpack__` checks.
    None,
    /// `torch.Tensor`: requires_grad, the conjugate and negative bits.
    Torch(&'static TorchChecks),
}

/// torch's own descriptors for the checks, taken once from `torch.Tensor`:
/// calling them directly skips the instance attribute lookup on every import.
/// They dispatch to `__torch_function__` themselves, as attribute access would.
#[derive(Debug)]
pub struct TorchChecks {
    /// `torch.Tensor` itself, whose own table's fills are writable.
    tensor_type: Py<PyType>,
    requires_grad: Py<PyAny>,
    is_conj: Py<PyAny>,
    is_neg: Py<PyAny>,
}

impl TorchChecks {
    fn of(tensor_type: &Bound<'_, PyType>) -> Option<&'static TorchChecks> {
        static CHECKS: pyo3::sync::PyOnceLock<Option<&'static TorchChecks>> = pyo3::sync::PyOnceLock::new();
        let py = tensor_type.py();
        *CHECKS.get_or_init(py, || {
            let get = |name| tensor_type.getattr(name).ok().map(Bound::unbind);
            let checks = TorchChecks {
                tensor_type: tensor_type.clone().unbind(),
                requires_grad: get(intern!(py, "requires_grad"))?,
                is_conj: get(intern!(py, "is_conj"))?,
                is_neg: get(intern!(py, "is_neg"))?,
            };
            // One per process, as torch.Tensor itself.
            Some(Box::leak(Box::new(checks)))
        })
    }
}

/// `torch.Tensor`'s checks, if `ty` is `torch.Tensor` or a subclass and torch is imported.
pub(super) fn torch_checks(ty: &Bound<'_, PyType>) -> Option<&'static TorchChecks> {
    let py = ty.py();
    // SAFETY: GetModule never imports; it returns a new reference or NULL.
    let torch = unsafe { Bound::from_owned_ptr_or_opt(py, ffi::PyImport_GetModule(intern!(py, "torch").as_ptr())) };
    let Some(torch) = torch else {
        let _ = PyErr::take(py);
        return None;
    };
    let tensor = torch.getattr(intern!(py, "Tensor")).ok()?.cast_into::<PyType>().ok()?;
    if !ty.is_subclass(&tensor).unwrap_or(false) {
        return None;
    }
    TorchChecks::of(&tensor)
}

impl Guard {
    /// What the versioned export of `publisher`'s table would say of writes to
    /// the tensor its fill describes: Writable for `torch.Tensor`'s own table
    /// (see above), else Unknown.
    pub(crate) fn fill_writability(self, publisher: &Bound<'_, PyAny>) -> Writability {
        match self {
            Guard::Torch(checks) if publisher.is(checks.tensor_type.bind(publisher.py())) => Writability::Writable,
            _ => Writability::Unknown,
        }
    }

    /// Takes a tensor with `take` (an export or a fill) after the checks, as
    /// torch's `__dlpack__` would: `requires_grad` and the negative bit first;
    /// then, if what was taken is complex, it is dropped, the conjugate bit is
    /// asked, and it is taken again. `Ok(None)`: use `__dlpack__` instead (the
    /// checks themselves failed, as for a subclass whose `__torch_function__`
    /// blocks attribute access, or `take` did); `Err`: the refusal that
    /// `__dlpack__` would make.
    pub(crate) fn take<T>(self, obj: &Bound<'_, PyAny>, mut take: impl FnMut() -> Option<T>, dtype: impl Fn(&T) -> DataType) -> PyResult<Option<T>> {
        let Guard::Torch(checks) = self else { return Ok(take()) };
        if !outcome(obj, check_torch(obj, checks))? {
            return Ok(None);
        }
        let Some(first) = take() else { return Ok(None) };
        if dtype(&first).code != DataTypeCode::COMPLEX {
            return Ok(Some(first));
        }
        drop(first);
        if !outcome(obj, check_conj(obj, checks))? {
            return Ok(None);
        }
        Ok(take())
    }
}

/// A refusal stays a refusal; any other failure of the checks means "ask `__dlpack__`".
fn outcome(obj: &Bound<'_, PyAny>, checked: PyResult<()>) -> PyResult<bool> {
    match checked {
        Ok(()) => Ok(true),
        Err(err) if err.is_instance_of::<PyBufferError>(obj.py()) => Err(err),
        Err(_) => Ok(false),
    }
}

/// `descriptor(obj)`: a getter or a method of torch.Tensor, applied to `obj`.
/// True only for Python's `True`.
fn torch_flag(obj: &Bound<'_, PyAny>, descriptor: &Py<PyAny>, is_getter: bool) -> PyResult<bool> {
    let py = obj.py();
    let descriptor = descriptor.bind(py);
    // SAFETY: with the GIL; the descriptor and `obj` are live for the call. A
    // getter is called through its type's `tp_descr_get` slot, a method
    // descriptor by vectorcall with `obj` as self; both return a new reference
    // or NULL with an exception set.
    let result = unsafe {
        let raw = if is_getter {
            match (*ffi::Py_TYPE(descriptor.as_ptr())).tp_descr_get {
                Some(get) => get(descriptor.as_ptr(), obj.as_ptr(), ffi::Py_TYPE(obj.as_ptr()).cast()),
                None => return Err(PyTypeError::new_err("torch's requires_grad is not a descriptor")),
            }
        } else {
            let args = [obj.as_ptr()];
            ffi::PyObject_Vectorcall(descriptor.as_ptr(), args.as_ptr(), 1, core::ptr::null_mut())
        };
        Bound::from_owned_ptr_or_err(py, raw)?
    };
    // SAFETY: comparing with the `True` singleton.
    Ok(result.as_ptr() == unsafe { ffi::Py_True() })
}

/// The refusals of torch's `__dlpack__` that its table skips, with its words,
/// for every dtype.
fn check_torch(obj: &Bound<'_, PyAny>, checks: &TorchChecks) -> PyResult<()> {
    if torch_flag(obj, &checks.requires_grad, true)? {
        return Err(PyBufferError::new_err("Can't export tensors that require gradient, use tensor.detach()"));
    }
    if torch_flag(obj, &checks.is_neg, false)? {
        return Err(PyBufferError::new_err(
            "Can't export tensors with the negative bit set: DLPack would carry the values un-negated; use tensor.resolve_neg()",
        ));
    }
    Ok(())
}

/// The conjugate bit, which only complex tensors carry.
fn check_conj(obj: &Bound<'_, PyAny>, checks: &TorchChecks) -> PyResult<()> {
    if torch_flag(obj, &checks.is_conj, false)? {
        return Err(PyBufferError::new_err("Can't export tensors with the conjugate bit set"));
    }
    Ok(())
}
