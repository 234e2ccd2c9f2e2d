//! Where an argument's memory is read without an export or an allocation:
//! a dlbridge `Tensor` (its own view, or the package's description of one of
//! its class), an exact NumPy array (its struct), or a producer's
//! exchange-table fill (for writes, only where the producer's exports say
//! writable without asking it, as `torch.Tensor`'s do). Anything else is imported.

use dlbridge::TensorView;
use pyo3::prelude::*;

use crate::exchange;
use crate::import::{is_exact_ndarray, numpy_view_exact};
use crate::tensor::{describe_package_tensor, PackageTensor, TensorObject};
use crate::writability::Writability;

/// An argument's memory read where it lies, without an export or an
/// allocation.
pub(super) struct InPlace {
    pub(super) view: TensorView<'static>,
    pub(super) ready: Option<i64>,
    /// What the producer says of writes (of a fill, what its export would say).
    pub(super) writability: Writability,
}

/// `source`'s memory in place, if it can be read so; `None` leaves it to the
/// owned import. For writes, a fill is tried only if its writability is
/// known without an export (see `exchange::guard`): an owned import reads
/// the producer's flags.
///
/// # Safety
/// The view reads `source`'s memory: the caller keeps `source` alive for as
/// long as it uses the view, and takes a registry borrow before reading.
// Inlined, as is everything up to the argument's construction: a view
// returned across a call is copied through memory, and a copy that reads
// bytes just stored in narrower pieces waits for them (no store forwarding).
#[inline(always)]
pub(super) unsafe fn in_place(source: &Bound<'_, PyAny>, requested: Option<i64>, for_writes: bool) -> PyResult<Option<InPlace>> {
    if let Ok(tensor) = source.cast_exact::<TensorObject>() {
        let tensor = tensor.get();
        let ready = tensor.lend_stream(requested)?;
        // SAFETY: a Tensor never changes, and `source` keeps it and its memory
        // alive (forwarded from the caller); typed reads wait for the caller's borrow.
        let view = unsafe { core::mem::transmute::<TensorView<'_>, TensorView<'static>>(tensor.view().assume_unaliased()) };
        return Ok(Some(InPlace { view, ready, writability: tensor.writability() }));
    }
    if is_exact_ndarray(source) {
        // SAFETY: an exact ndarray, just checked; the rest is forwarded from the caller.
        let view = unsafe { numpy_view_exact(source) }?;
        return Ok(view.map(|(view, read_only)| {
            let writability = if read_only { Writability::ReadOnly } else { Writability::Writable };
            InPlace { view, ready: None, writability }
        }));
    }
    if let Some(described) = describe_package_tensor(source, requested)? {
        let PackageTensor { tensor, writability, padded, ready } = described;
        // SAFETY: the package describes its own tensor's memory, which
        // `source` keeps alive (forwarded from the caller).
        if let Ok(view) = unsafe { TensorView::from_dltensor(&tensor, padded) } {
            return Ok(Some(InPlace { view, ready, writability }));
        }
    }
    if let Some(table) = exchange::lookup(source) {
        let writability = table.fill_writability;
        if !for_writes || writability.is_writable() {
            if let Some((dl, ready)) = exchange::fill_borrowed(source, table)? {
                // SAFETY: the fill describes `source`'s memory (forwarded from the
                // caller); one that does not validate is left for the owned import.
                if let Ok(view) = unsafe { TensorView::from_dltensor(&dl, false) } {
                    return Ok(Some(InPlace { view, ready, writability }));
                }
            }
        }
    }
    Ok(None)
}
