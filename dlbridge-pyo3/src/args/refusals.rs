//! Why an argument is refused, in words: what it asked for and what came, or
//! why the memory may not be written, with what to pass instead.

use dlbridge::TensorView;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

use super::kinds::{self, DeviceKind, Dtype, LayoutKind, Rank};
use crate::writability::Writability;

/// Why memory with this writability, provenance and layout may not be
/// written, with what to do instead; `None` if it may.
#[inline(always)] // as `in_place` is
pub(super) fn write_refusal(writability: Writability, copied: bool, view: &TensorView<'_>) -> Option<&'static str> {
    match writability {
        Writability::Writable => {}
        Writability::ReadOnly => return Some("its producer marked it read-only; pass a writable copy (e.g. numpy.array(x))"),
        Writability::Unknown => {
            return Some(
                "it came through a legacy DLPack capsule, which cannot say whether writes are allowed \
                 (JAX and TensorFlow arrays are immutable); pass a writable copy (e.g. numpy.array(x))",
            )
        }
    }
    if copied {
        return Some("its producer handed over a copy (IS_COPIED), so writes would be lost; pass memory the caller owns");
    }
    if !view.is_non_overlapping() {
        return Some("its elements overlap in memory (a broadcast); pass a copy (e.g. numpy.array(x))");
    }
    None
}

/// Refuses, with TypeError, a tensor that is not what the argument's type asks for.
#[inline(always)] // as `in_place` is; the message is built out of line
pub(super) fn check_kind<T: Dtype, D: Rank, Dev: DeviceKind, L: LayoutKind>(view: &TensorView<'_>, source: &Bound<'_, PyAny>) -> PyResult<()> {
    match kinds::mismatch::<T, D, Dev, L>(view) {
        None => Ok(()),
        Some(_) => Err(kind_error::<T, D, Dev, L>(view, source)),
    }
}

#[cold]
#[inline(never)]
fn kind_error<T: Dtype, D: Rank, Dev: DeviceKind, L: LayoutKind>(view: &TensorView<'_>, source: &Bound<'_, PyAny>) -> PyErr {
    PyTypeError::new_err(format!("expected {}, got {}", kinds::expected::<T, D, Dev, L>(), described(view, source)))
}

/// A tensor whose elements cannot be read as `T` (misaligned, or bytes that
/// are no `bool`): a TypeError naming the argument's type, with the reason.
pub(super) fn element_error<T: Dtype, D: Rank, Dev: DeviceKind, L: LayoutKind>(view: &TensorView<'_>, source: &Bound<'_, PyAny>, err: dlbridge::Error) -> PyErr {
    PyTypeError::new_err(format!("expected {}, got {}: {err}", kinds::expected::<T, D, Dev, L>(), described(view, source)))
}

/// "a torch.Tensor of float64 with shape (2, 3, 4) on cuda:0".
fn described(view: &TensorView<'_>, source: &Bound<'_, PyAny>) -> String {
    let shape: Vec<String> = view.shape().iter().map(i64::to_string).collect();
    let shape = if shape.len() == 1 { format!("({},)", shape[0]) } else { format!("({})", shape.join(", ")) };
    let layout = if view.is_c_contiguous() { "" } else if view.is_f_contiguous() { ", F-contiguous" } else { ", strided" };
    crate::convert::with_article(&format!("{} of {} with shape {shape}{layout} on {}", qualified_type_name(source), view.dtype(), view.device()))
}

/// `module.Type` of an object, as Python users know it ("torch.Tensor", "numpy.ndarray").
fn qualified_type_name(obj: &Bound<'_, PyAny>) -> String {
    let ty = obj.get_type();
    match (ty.module(), ty.name()) {
        (Ok(module), Ok(name)) if module.to_cow().is_ok_and(|m| m != "builtins") => format!("{module}.{name}"),
        (_, Ok(name)) => name.to_string(),
        _ => "?".to_owned(),
    }
}
