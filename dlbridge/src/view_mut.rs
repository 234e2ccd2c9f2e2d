//! [`TensorViewMut`]: a validated view to write through, lending reads only for
//! as long as it is borrowed.

use core::ffi::c_void;
use core::marker::PhantomData;

use crate::element::Element;
use crate::error::Error;
use crate::ffi::DLTensor;
use crate::view::TensorView;

/// A validated view through which the elements may be written.
///
/// It exists only for tensors that are not read-only and whose elements do not
/// overlap. Reading goes through [`view`](Self::view), a shared reborrow: every
/// borrow it hands out ends before the next write, as with ndarray's
/// `ArrayViewMut::view`. A shared slice cannot outlive a later mutable one:
///
/// ```compile_fail,E0502
/// # let mut t = dlbridge::OwnedTensor::from_vec(vec![1.0f32; 4], &[4]).unwrap();
/// let mut vm = t.try_view_mut().unwrap();
/// let shared: &[f32] = vm.view().as_slice().unwrap();
/// let unique: &mut [f32] = vm.as_slice_mut().unwrap();
/// unique[0] = 9.0;
/// println!("{}", shared[0]);
/// ```
///
/// Nor does a mutable view lend out reads of its own that outlive it:
///
/// ```compile_fail,E0599
/// # let mut t = dlbridge::OwnedTensor::from_vec(vec![1.0f32; 4], &[4]).unwrap();
/// let mut vm = t.try_view_mut().unwrap();
/// let shared: &[f32] = vm.as_slice().unwrap();
/// let unique: &mut [f32] = vm.as_slice_mut().unwrap();
/// unique[0] = 9.0;
/// println!("{}", shared[0]);
/// ```
#[derive(Debug)]
pub struct TensorViewMut<'a> {
    view: TensorView<'a>,
    _data: PhantomData<&'a mut [u8]>,
}

impl<'a> TensorViewMut<'a> {
    /// Validates `tensor` for writing.
    ///
    /// # Safety
    /// As [`TensorView::from_dltensor`], and the bytes reached must also be
    /// writable, and not accessed through any other path, for `'a`.
    pub unsafe fn from_dltensor(tensor: &mut DLTensor, padded: bool) -> Result<Self, Error> {
        let tensor: &DLTensor = tensor;
        // SAFETY: forwarded from the caller.
        let view = unsafe { TensorView::from_dltensor(tensor, padded)? };
        Self::from_view(view)
    }

    /// Upgrades a validated view to a writable one; refused for elements that
    /// overlap. Typed reads of the result work even if `view` was aliased.
    ///
    /// # Safety
    /// The bytes the view reaches must be writable, and not accessed through
    /// any other path, for `'a`.
    pub unsafe fn from_view_unchecked(view: TensorView<'a>) -> Result<Self, Error> {
        // The caller proves exclusive access, so no other path writes either.
        Self::from_view(view.unaliased())
    }

    /// [`from_view_unchecked`](Self::from_view_unchecked) without the overlap
    /// check, for a view already checked.
    ///
    /// # Safety
    /// As [`from_view_unchecked`](Self::from_view_unchecked), and no two
    /// indices may reach the same element ([`TensorView::is_non_overlapping`]).
    pub unsafe fn new_unchecked(view: TensorView<'a>) -> Self {
        TensorViewMut { view: view.unaliased(), _data: PhantomData }
    }

    /// Upgrades a view the caller is entitled to write through.
    pub(crate) fn from_view(view: TensorView<'a>) -> Result<Self, Error> {
        if !view.is_non_overlapping() {
            return Err(Error::OverlappingMemory);
        }
        Ok(TensorViewMut { view, _data: PhantomData })
    }

    /// A read-only view for as long as `self` is borrowed: shape, strides,
    /// dtype, and shared slices that end before the next write.
    pub fn view(&self) -> &TensorView<'_> {
        &self.view
    }

    /// Gives up writing: a read-only view for the rest of `'a`.
    pub fn into_view(self) -> TensorView<'a> {
        self.view
    }

    /// Address of element 0, for writing.
    pub fn as_mut_ptr(&mut self) -> *mut c_void {
        self.view.ptr.cast_mut().cast()
    }

    /// The elements as a mutable slice; the conditions of
    /// [`TensorView::as_slice`] apply.
    pub fn as_slice_mut<T: Element>(&mut self) -> Option<&mut [T]> {
        self.try_as_slice_mut().ok()
    }

    /// Like [`as_slice_mut`](Self::as_slice_mut), with the reason for a refusal.
    pub fn try_as_slice_mut<T: Element>(&mut self) -> Result<&mut [T], Error> {
        self.view.try_as_slice::<T>()?;
        // SAFETY: every check just passed.
        Ok(unsafe { self.as_slice_mut_unchecked() })
    }

    /// [`try_as_slice_mut`](Self::try_as_slice_mut) without its checks.
    ///
    /// # Safety
    /// As [`TensorView::as_slice_unchecked`].
    pub unsafe fn as_slice_mut_unchecked<T: Element>(&mut self) -> &mut [T] {
        // SAFETY: forwarded from the caller; the slice borrows `self` mutably,
        // so it is the only path to the bytes while it lives.
        unsafe { slice_mut_of(&self.view) }
    }

    /// A mutable view for as long as `self` is borrowed mutably.
    pub fn reborrow(&mut self) -> TensorViewMut<'_> {
        TensorViewMut { view: self.view.clone(), _data: PhantomData }
    }

    /// Gives up the view for its elements as a mutable slice for the rest of
    /// `'a`, without the checks of [`try_as_slice_mut`](Self::try_as_slice_mut).
    ///
    /// # Safety
    /// As [`TensorView::as_slice_unchecked`].
    pub unsafe fn into_slice_mut_unchecked<T: Element>(self) -> &'a mut [T] {
        // SAFETY: forwarded from the caller; `self` is given up: the only borrow.
        unsafe { slice_mut_of(&self.view) }
    }
}

/// The elements of a writable view as a mutable slice, for `'b`.
///
/// # Safety
/// As [`TensorView::as_slice_unchecked`] (layout, type, alignment, values);
/// `view` belongs to a [`TensorViewMut`] (writable, unaliased memory) of which
/// the result is the only path to the bytes for `'b`, and those bytes stay
/// valid for `'b`.
unsafe fn slice_mut_of<'b, T: Element>(view: &TensorView<'_>) -> &'b mut [T] {
    let len = view.len();
    if len == 0 {
        return &mut [];
    }
    // SAFETY: per the caller.
    unsafe { core::slice::from_raw_parts_mut(view.ptr.cast_mut().cast::<T>(), len) }
}
