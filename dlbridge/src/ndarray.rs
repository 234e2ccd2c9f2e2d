//! `ndarray` integration (feature `ndarray`): views of tensors, and zero-copy
//! export of owned arrays.
//!
//! Views accept every layout DLPack can describe: negative strides (built from
//! the lowest address, then the axes are inverted), zero strides (read-only
//! views only), and any rank, fixed or dynamic.

use ndarray::{ArcArray, Array, ArrayView, ArrayViewMut, Axis, Dimension, IxDyn, ShapeBuilder};

use crate::element::Element;
use crate::error::Error;
use crate::export::{export_placed, place_owner};
use crate::layout::{extent_of, Small};
use crate::ffi::DLPACK_FLAG_BITMASK_READ_ONLY;
use crate::managed_abi::ManagedAbi;
use crate::owned::Owned;
use crate::view::TensorView;
use crate::view_mut::TensorViewMut;

/// The lowest-address element and the axes (a bit mask) whose strides are
/// negative: ndarray wants non-negative strides from the lowest address.
fn placement<T: Element>(view: &TensorView<'_>) -> (*const u8, u64) {
    let size = core::mem::size_of::<T>() as isize;
    let mut base = view.as_ptr().cast::<u8>();
    let mut inverted = 0u64;
    for (axis, (&dim, &stride)) in view.shape().iter().zip(view.strides()).enumerate() {
        if stride < 0 && dim > 1 {
            // Cannot wrap: validation bounded every address the layout reaches.
            base = base.wrapping_offset((dim as isize - 1) * stride as isize * size);
            inverted |= 1 << axis;
        }
    }
    if view.is_empty() {
        base = core::ptr::NonNull::<T>::dangling().as_ptr().cast();
    }
    (base, inverted)
}

/// Shape and absolute strides of a view as a `D` (whose rank the caller checked).
fn layout_as<D: Dimension>(view: &TensorView<'_>) -> (D, D) {
    let (mut shape, mut strides) = (D::zeros(view.ndim()), D::zeros(view.ndim()));
    for (axis, (&dim, &stride)) in view.shape().iter().zip(view.strides()).enumerate() {
        shape.slice_mut()[axis] = dim as usize;
        strides.slice_mut()[axis] = stride.unsigned_abs() as usize;
    }
    (shape, strides)
}

fn invert<V, D>(array: &mut ndarray::ArrayBase<V, D>, inverted: u64)
where
    V: ndarray::RawData,
    D: Dimension,
{
    let mut bits = inverted;
    while bits != 0 {
        let axis = bits.trailing_zeros() as usize;
        array.invert_axis(Axis(axis));
        bits &= bits - 1;
    }
}

impl<'a> TensorView<'a> {
    /// An `ndarray` view of rank `D` (use `IxDyn` for any rank), `None` when
    /// [`try_as_array`](Self::try_as_array) refuses.
    pub fn as_array<T: Element, D: Dimension>(&self) -> Option<ArrayView<'a, T, D>> {
        self.try_as_array().ok()
    }

    /// An `ndarray` view of rank `D`, with the reason for a refusal. Checks the
    /// device, dtype, alignment and, for `bool`, that every byte is 0 or 1.
    pub fn try_as_array<T: Element, D: Dimension>(&self) -> Result<ArrayView<'a, T, D>, Error> {
        self.check_array::<T, D>()?;
        if T::DTYPE == crate::DataType::BOOL {
            // SAFETY: the same layout read as bytes (every bool is one byte): the
            // checks above are those of `as_array_unchecked::<u8, _>`.
            let bytes = unsafe { self.as_array_unchecked::<u8, IxDyn>() };
            if bytes.iter().any(|&b| b > 1) {
                return Err(Error::InvalidValues { dtype: self.dtype() });
            }
        }
        // SAFETY: every check of `try_as_array` just passed.
        Ok(unsafe { self.as_array_unchecked() })
    }

    /// [`try_as_array`](Self::try_as_array) without its checks, for a view
    /// already checked (a typed extension argument, checked at extraction).
    ///
    /// # Safety
    /// `try_as_array::<T, D>()` must succeed on this view (or a clone of it):
    /// host-readable, not aliased, of `T`'s dtype, aligned, of `D`'s rank and,
    /// for `bool`, holding only 0 and 1.
    pub unsafe fn as_array_unchecked<T: Element, D: Dimension>(&self) -> ArrayView<'a, T, D> {
        let (base, inverted) = placement::<T>(self);
        let (shape, strides) = layout_as::<D>(self);
        // SAFETY: validation proved every element the layout reaches is readable
        // for 'a; `base` is the lowest-address element, so with absolute strides
        // every index lands on one of them. Type, alignment, rank and values are
        // the caller's promise.
        let mut array = unsafe { ArrayView::<T, D>::from_shape_ptr(shape.strides(strides), base.cast()) };
        invert(&mut array, inverted);
        array
    }

    fn check_array<T: Element, D: Dimension>(&self) -> Result<(), Error> {
        self.check_typed::<T>()?;
        match D::NDIM {
            Some(rank) if rank != self.ndim() => Err(Error::RankMismatch { expected: rank, found: self.ndim() }),
            _ => Ok(()),
        }
    }
}

impl<'a> TensorViewMut<'a> {
    /// A mutable `ndarray` view, `None` when [`try_as_array_mut`](Self::try_as_array_mut) refuses.
    pub fn as_array_mut<T: Element, D: Dimension>(&mut self) -> Option<ArrayViewMut<'_, T, D>> {
        self.try_as_array_mut().ok()
    }

    /// A mutable `ndarray` view; the checks of [`TensorView::try_as_array`] apply.
    pub fn try_as_array_mut<T: Element, D: Dimension>(&mut self) -> Result<ArrayViewMut<'_, T, D>, Error> {
        // Reading first runs every check, bool values included.
        drop(self.view().try_as_array::<T, D>()?);
        // SAFETY: every check just passed.
        Ok(unsafe { self.as_array_mut_unchecked() })
    }

    /// [`try_as_array_mut`](Self::try_as_array_mut) without its checks.
    ///
    /// # Safety
    /// As [`TensorView::as_array_unchecked`].
    pub unsafe fn as_array_mut_unchecked<T: Element, D: Dimension>(&mut self) -> ArrayViewMut<'_, T, D> {
        // SAFETY: forwarded from the caller; the array borrows `self` mutably,
        // so it is the only path to the bytes while it lives.
        unsafe { array_mut_of(self.view()) }
    }

    /// Gives up the view for its elements as a mutable `ndarray` view for the
    /// rest of `'a`, without the checks of [`try_as_array_mut`](Self::try_as_array_mut).
    ///
    /// # Safety
    /// As [`TensorView::as_array_unchecked`].
    pub unsafe fn into_array_mut_unchecked<T: Element, D: Dimension>(self) -> ArrayViewMut<'a, T, D> {
        // SAFETY: forwarded from the caller; `self` is given up: the only borrow.
        unsafe { array_mut_of(self.view()) }
    }
}

/// The elements of a writable view as a mutable `ndarray` view, for `'b`.
///
/// # Safety
/// As [`TensorView::as_array_unchecked`]; `view` belongs to a [`TensorViewMut`]
/// (writable, unaliased memory) of which the result is the only path to the
/// bytes for `'b`, and those bytes stay valid for `'b`.
unsafe fn array_mut_of<'b, T: Element, D: Dimension>(view: &TensorView<'_>) -> ArrayViewMut<'b, T, D> {
    let (base, inverted) = placement::<T>(view);
    let (shape, strides) = layout_as::<D>(view);
    // SAFETY: as in `as_array_unchecked`, with writes allowed by the caller.
    let mut array = unsafe { ArrayViewMut::<T, D>::from_shape_ptr(shape.strides(strides), base.cast_mut().cast()) };
    invert(&mut array, inverted);
    array
}

impl<M: ManagedAbi> Owned<M> {
    /// Exports an owned array without copying, in whatever layout it has
    /// (negative strides included). The array is dropped by the deleter.
    ///
    /// ```
    /// use dlbridge::OwnedTensor;
    /// use ndarray::{array, Ix2};
    ///
    /// let a = array![[1.0f32, 2.0, 3.0], [4.0, 5.0, 6.0]].reversed_axes(); // 3x2, column-major
    /// let address = a.as_ptr();
    /// let t = OwnedTensor::from_array(a)?;
    /// assert_eq!((t.view().shape(), t.view().strides()), (&[3i64, 2][..], &[1i64, 3][..]));
    /// assert_eq!(t.view().as_ptr().cast::<f32>(), address); // no copy
    /// let back = t.view().try_as_array::<f32, Ix2>()?;
    /// assert_eq!(back[[2, 1]], 6.0);
    /// # Ok::<(), dlbridge::Error>(())
    /// ```
    pub fn from_array<T: Element, D: Dimension + Send + 'static>(array: Array<T, D>) -> Result<Self, Error> {
        // The array is uniquely owned, so it is writable.
        export_array(array, |a| a.as_mut_ptr(), 0)
    }

    /// Exports a shared array without copying. A uniquely held array is exported
    /// writable; one whose data other clones share is exported READ_ONLY.
    pub fn from_arc_array<T: Element, D: Dimension + Send + Sync + 'static>(array: ArcArray<T, D>) -> Result<Self, Error> {
        if array.is_unique() {
            return Self::from_array(array.into_owned());
        }
        // Only read (READ_ONLY), as the other clones only read it.
        export_array(array, |a| a.as_ptr().cast_mut(), DLPACK_FLAG_BITMASK_READ_ONLY)
    }
}

/// Exports an array with its own shape and strides; `element0` is asked for
/// the address of element 0 once the array sits in the export block.
fn export_array<M, A, S, D>(
    array: ndarray::ArrayBase<S, D>,
    element0: impl FnOnce(&mut ndarray::ArrayBase<S, D>) -> *mut A,
    flags: u64,
) -> Result<Owned<M>, Error>
where
    M: ManagedAbi,
    A: Element,
    S: ndarray::Data<Elem = A> + Send + 'static,
    D: Dimension + Send + 'static,
{
    let ndim = array.ndim();
    let shape = Small::from_fn(ndim, |i| array.shape()[i] as i64);
    let strides = Small::from_fn(ndim, |i| array.strides()[i] as i64);
    let (shape, strides) = (shape.as_slice(), strides.as_slice());
    let place = extent_of(shape, Some(strides))?;
    let block = place_owner::<M, _, _>(array, ndim, &crate::export::GlobalBlocks)?;
    // SAFETY: the array now lives in the block, which does not move; this is
    // the only borrow of it.
    let data = element0(unsafe { &mut (*block.as_ptr()).owner });
    // SAFETY: `data` is element 0 of the array in its final place, and the layout
    // is the array's own, so every element it reaches is in the array's buffer.
    Ok(unsafe { export_placed(block, data, shape, Some(strides), &place, flags) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::OwnedTensor;
    use ndarray::{arr2, s, Ix2};

    #[test]
    fn negative_and_zero_strides() {
        let t = OwnedTensor::from_owner_mut((0..6).collect::<Vec<i32>>(), &[2, 3], Some(&[-3, -1])).unwrap();
        let a = t.view().try_as_array::<i32, Ix2>().unwrap();
        assert_eq!(a, arr2(&[[5, 4, 3], [2, 1, 0]]));
        let t = OwnedTensor::from_owner_mut(vec![7i32, 8], &[3, 2], Some(&[0, 1])).unwrap();
        let a = t.view().try_as_array::<i32, IxDyn>().unwrap();
        assert_eq!(a, arr2(&[[7, 8], [7, 8], [7, 8]]).into_dyn());
    }

    #[test]
    fn mutable_views_and_refusals() {
        let mut t = OwnedTensor::from_vec(vec![1.0f64; 4], &[2, 2]).unwrap();
        t.view_mut().unwrap().try_as_array_mut::<f64, Ix2>().unwrap()[[1, 0]] = 5.0;
        assert_eq!(t.view().as_slice::<f64>().unwrap(), &[1.0, 1.0, 5.0, 1.0]);
        assert!(matches!(t.view().try_as_array::<f32, Ix2>(), Err(Error::DtypeMismatch { .. })));
        assert!(matches!(t.view().try_as_array::<f64, ndarray::Ix3>(), Err(Error::RankMismatch { expected: 3, found: 2 })));
        let mut b = OwnedTensor::from_owner_mut(vec![1.0f64], &[3], Some(&[0])).unwrap();
        assert!(matches!(b.try_view_mut(), Err(Error::OverlappingMemory)));
    }

    #[test]
    fn bool_values_are_checked() {
        let t = OwnedTensor::from_vec(vec![0u8, 1, 2], &[3]).unwrap();
        // Relabel the bytes as bool through a raw tensor of the same memory.
        let mut dl = t.as_raw().dl_tensor;
        dl.dtype = crate::DataType::BOOL;
        // SAFETY: `dl` describes `t`'s live buffer.
        let v = unsafe { TensorView::from_dltensor(&dl, false) }.unwrap();
        assert!(matches!(v.try_as_array::<bool, IxDyn>(), Err(Error::InvalidValues { .. })));
        assert!(v.as_slice::<bool>().is_none());
    }

    #[test]
    fn arrays_export_without_copy() {
        let mut a = arr2(&[[1i64, 2, 3], [4, 5, 6]]);
        a.invert_axis(Axis(1));
        let ptr = a.as_ptr();
        let t = OwnedTensor::from_array(a.clone()).unwrap();
        assert_eq!(t.view().strides(), &[3, -1]);
        assert_eq!(t.view().try_as_array::<i64, Ix2>().unwrap(), a);
        let _ = ptr;
        let shared = ArcArray::from(arr2(&[[1u8, 2], [3, 4]]).slice_move(s![.., ..]));
        let t = OwnedTensor::from_arc_array(shared.clone()).unwrap();
        assert!(t.is_read_only());
        drop(shared);
        let unique = ArcArray::from(arr2(&[[1u8, 2]]));
        assert!(!OwnedTensor::from_arc_array(unique).unwrap().is_read_only());
    }
}
