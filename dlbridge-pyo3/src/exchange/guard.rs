//! The checks a producer's `__dlpack__` makes that its exchange table skips,
//! and when to make them; and what its `__dlpack__` says that its fill cannot.
//!
//! torch's `__dlpack__` refuses tensors that require grad and tensors with the
//! conjugate bit; its table does not, so [`Guard::Torch`] asks torch here (and
//! refuses the negative bit too, whose data DLPack would carry un-negated).
//! A fill carries no flags. The exports of torch's own table (the one
//! `torch.Tensor` publishes) never set READ_ONLY or IS_COPIED (`__dlpack__`
//! does only when the consumer asks: `read_only=True`, `copy=True`, a
//! `dl_device` that needs a copy), so its fill is taken as writable, as its
//! export would say. Any other table gets no such trust: torch's
//! `ReadOnlyTensorWrapper` publishes one whose exports are read-only.
//!
//! Nothing here is found through a name Python code can rebind
//! (`torch.Tensor`, `sys.modules`): a tensor is torch's when the static type
//! `torch._C.TensorBase` is in its MRO (only C code makes a static type), the
//! checks are that type's own descriptors (its dict is immutable), and torch's
//! table is the one returned by torch's C function `_dlpack_exchange_api`
//! (a builtin's name is its C name).
//!
//! torch's `__dlpack__` first dispatches `__torch_function__` (a subclass's,
//! a torch function mode's), which may refuse, mark the export read-only, or
//! export another tensor; a table call dispatches nothing. So a table is used
//! only where torch would dispatch nothing: for `torch.Tensor` itself and
//! types that switched dispatch off (`Parameter`), never while a mode is
//! active (asked of torch on every call, through its C function). Anything
//! else goes through `__dlpack__`, hooks and all.
//!
//! The checks then run no Python, and still run before the table exports or
//! fills, never between taking a pointer and using it, as torch's own
//! `__dlpack__` orders them. The conjugate bit exists only on complex tensors:
//! it is asked only when the tensor taken turns out complex, which is then
//! dropped and taken again after the question.

use dlbridge::ffi::DLPackExchangeAPI;
use dlbridge::{DataType, DataTypeCode};
use pyo3::exceptions::{PyBufferError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyString, PyType};
use pyo3::{ffi, intern};

use super::{compatible, EXCHANGE_API_CAPSULE_NAME};
use crate::trust::{definer, imported_module, is_static_type_named, own_dict_item};
use crate::writability::Writability;

/// Checks a producer's `__dlpack__` makes that its table does not.
#[derive(Clone, Copy, Debug)]
pub enum Guard {
    /// The table checks what `__dlpack__` checks.
    None,
    /// `torch.Tensor`: requires_grad, the conjugate and negative bits.
    Torch(&'static TorchChecks),
}

/// torch's own descriptors for the checks, taken once from
/// `torch._C.TensorBase`: calling them directly skips the instance attribute
/// lookup on every import. They dispatch to `__torch_function__` themselves,
/// as attribute access would.
#[derive(Debug)]
pub struct TorchChecks {
    /// The address of torch's own table, whose fills are writable; 0 if torch has none.
    writable_table: usize,
    /// `torch._C._disabled_torch_function_impl`: a type whose `__torch_function__`
    /// is this one dispatches nothing.
    disabled_impl: Option<Py<PyAny>>,
    /// `torch._C._is_torch_function_mode_enabled`, as its C function and self;
    /// without it, a mode is assumed.
    mode_query: Option<(ffi::PyCFunction, Py<PyAny>)>,
    requires_grad: Py<PyAny>,
    is_conj: Py<PyAny>,
    is_neg: Py<PyAny>,
}

impl TorchChecks {
    fn of(tensor_base: &Bound<'_, PyType>) -> Option<&'static TorchChecks> {
        static CHECKS: pyo3::sync::PyOnceLock<Option<&'static TorchChecks>> = pyo3::sync::PyOnceLock::new();
        let py = tensor_base.py();
        *CHECKS.get_or_init(py, || {
            let get = |name| tensor_base.getattr(name).ok().map(Bound::unbind);
            let torch = imported_module(py, intern!(py, "torch._C"));
            let torch = torch.as_ref();
            let checks = TorchChecks {
                writable_table: torch.and_then(torch_table).unwrap_or(0),
                disabled_impl: torch.and_then(|t| torch_builtin(t, intern!(py, "_disabled_torch_function_impl"))).map(Bound::unbind),
                mode_query: torch.and_then(mode_query),
                requires_grad: get(intern!(py, "requires_grad"))?,
                is_conj: get(intern!(py, "is_conj"))?,
                is_neg: get(intern!(py, "is_neg"))?,
            };
            // One per process, as torch's types.
            Some(Box::leak(Box::new(checks)))
        })
    }
}

/// torch's checks, if `torch._C.TensorBase` is in `ty`'s MRO.
pub(super) fn torch_checks(ty: &Bound<'_, PyType>) -> Option<&'static TorchChecks> {
    let base = ty.mro().iter().filter_map(|class| class.cast_into::<PyType>().ok()).find(is_tensor_base)?;
    TorchChecks::of(&base)
}

/// Whether `ty` is torch's static `torch._C.TensorBase`.
fn is_tensor_base(ty: &Bound<'_, PyType>) -> bool {
    // SAFETY: a live type object.
    unsafe { is_static_type_named(ty.as_type_ptr(), c"torch._C.TensorBase") }
}

/// `torch._C.<name>`, if it is the builtin of that C name, not whatever the
/// attribute holds now: a builtin's `__name__` is its C name, which Python
/// code cannot change.
fn torch_builtin<'py>(torch: &Bound<'py, PyAny>, name: &Bound<'py, PyString>) -> Option<Bound<'py, PyAny>> {
    let function = torch.getattr(name).ok()?;
    // SAFETY: a type check on a live object.
    let builtin = unsafe { ffi::PyCFunction_CheckExact(function.as_ptr()) } != 0;
    (builtin && function.getattr(intern!(torch.py(), "__name__")).ok()?.eq(name).ok()?).then_some(function)
}

/// The address of torch's own exchange table, from the C function that returns it.
fn torch_table(torch: &Bound<'_, PyAny>) -> Option<usize> {
    let capsule = torch_builtin(torch, intern!(torch.py(), "_dlpack_exchange_api"))?.call0().ok()?;
    // SAFETY: a name check on a live object; IsValid never raises.
    if unsafe { ffi::PyCapsule_IsValid(capsule.as_ptr(), EXCHANGE_API_CAPSULE_NAME.as_ptr()) } != 1 {
        return None;
    }
    // SAFETY: validated capsule; its pointer is a process-lifetime table.
    let header = unsafe { ffi::PyCapsule_GetPointer(capsule.as_ptr(), EXCHANGE_API_CAPSULE_NAME.as_ptr()) };
    // SAFETY: as above.
    unsafe { compatible(header.cast()) }.map(|api| core::ptr::from_ref(api) as usize)
}

/// torch's C function that says whether a torch function mode is active
/// (a thread-local read), to call without Python's call machinery.
fn mode_query(torch: &Bound<'_, PyAny>) -> Option<(ffi::PyCFunction, Py<PyAny>)> {
    let function = torch_builtin(torch, intern!(torch.py(), "_is_torch_function_mode_enabled"))?;
    // SAFETY: `function` is an exact builtin (checked): these read its method definition.
    unsafe {
        if ffi::PyCFunction_GetFlags(function.as_ptr()) != ffi::METH_NOARGS {
            return None;
        }
        let meth = ffi::PyCFunction_GetFunction(function.as_ptr())?;
        let this = Bound::from_borrowed_ptr_or_opt(torch.py(), ffi::PyCFunction_GetSelf(function.as_ptr()))?;
        Some((meth, this.unbind()))
    }
}

impl TorchChecks {
    /// Whether `api` is torch's own table (its address, from torch's C function).
    pub(crate) fn is_torch_table(&self, api: &DLPackExchangeAPI) -> bool {
        self.writable_table != 0 && self.writable_table == core::ptr::from_ref(api) as usize
    }

    /// Whether a torch function mode is active on this thread (or torch cannot say).
    fn mode_active(&self, py: Python<'_>) -> bool {
        let Some((meth, this)) = &self.mode_query else { return true };
        // SAFETY: a METH_NOARGS builtin is called with its self and NULL, as
        // CPython calls it; it returns a new reference or NULL with an error set.
        let Ok(answer) = (unsafe { Bound::from_owned_ptr_or_err(py, meth(this.as_ptr(), core::ptr::null_mut())) }) else {
            return true;
        };
        // SAFETY: comparing with the `False` singleton.
        answer.as_ptr() != unsafe { ffi::Py_False() }
    }
}

impl Guard {
    /// Whether torch dispatches no `__torch_function__` for instances of `ty`
    /// (modes aside, asked per call): `torch.Tensor` itself, whose own
    /// `__torch_function__` torch never dispatches for its exact instances, or
    /// a type whose `__torch_function__` is torch's disabled one. Others, even
    /// subclasses that only inherit torch's default, go through `__dlpack__`.
    pub(crate) fn dispatches_nothing(self, ty: &Bound<'_, PyType>) -> bool {
        let Guard::Torch(checks) = self else { return true };
        let name = intern!(ty.py(), "__torch_function__");
        let Some(definer) = definer(ty, name) else { return false };
        if let (Some(value), Some(disabled)) = (own_dict_item(&definer, name), &checks.disabled_impl) {
            if value.is(disabled) {
                return true;
            }
        }
        if !definer.is(ty) {
            return false;
        }
        // SAFETY: `tp_base` of a live type is NULL or a live type.
        let base = unsafe { Bound::from_borrowed_ptr_or_opt(ty.py(), (*ty.as_type_ptr()).tp_base.cast()) };
        base.and_then(|b| b.cast_into::<PyType>().ok()).is_some_and(|b| is_tensor_base(&b))
    }

    /// What the versioned export of `api` would say of writes to the tensor
    /// its fill describes: Writable for torch's own table (see above), else Unknown.
    pub(crate) fn fill_writability(self, api: &DLPackExchangeAPI) -> Writability {
        match self {
            Guard::Torch(checks) if checks.is_torch_table(api) => Writability::Writable,
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
        if checks.mode_active(obj.py()) {
            return Ok(None);
        }
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
