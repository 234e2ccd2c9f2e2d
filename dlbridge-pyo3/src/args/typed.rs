//! What a typed argument gives without a further check: its elements as a
//! slice (C-contiguous) or an `ndarray` view (any layout), in host memory;
//! its device pointer, device and ready stream, in CUDA memory. Everything
//! these rely on was checked at extraction (dtype, rank, device, layout,
//! alignment, `bool` values) and cannot change: the view is the argument's
//! own, and its bytes are borrowed in the registry while it lives.

use dlbridge::{DataType, Element};

use super::kinds::{CContiguous, Cpu, Cuda, Dtype, LayoutKind, Rank};
use super::{PyTensor, PyTensorMut};

impl<'py, T: Element, D: Rank> PyTensor<'py, T, D, Cpu, CContiguous> {
    /// The elements, in order.
    pub fn as_slice(&self) -> &[T] {
        // SAFETY: extraction checked what `try_as_slice` checks: C-contiguous,
        // host memory, dtype, alignment and values; the view is unaliased under
        // the argument's shared borrow.
        unsafe { self.view().as_slice_unchecked() }
    }
}

impl<'py, T: Element, D: Rank> PyTensorMut<'py, T, D, Cpu, CContiguous> {
    /// The elements, in order, to read.
    pub fn as_slice(&self) -> &[T] {
        // SAFETY: as for `PyTensor::as_slice`, under the exclusive borrow.
        unsafe { self.view().as_slice_unchecked() }
    }

    /// The elements, in order, to write: seen in the caller's own object.
    /// A slice read before cannot be kept across it:
    ///
    /// ```compile_fail,E0502
    /// use dlbridge_pyo3::{AnyRank, CContiguous, Cpu, PyTensorMut};
    ///
    /// fn alias(x: &mut PyTensorMut<'_, f32, AnyRank, Cpu, CContiguous>) {
    ///     let shared: &[f32] = x.as_slice();
    ///     let unique: &mut [f32] = x.as_slice_mut();
    ///     unique[0] = 9.0;
    ///     println!("{}", shared[0]);
    /// }
    /// ```
    pub fn as_slice_mut(&mut self) -> &mut [T] {
        // SAFETY: as for `as_slice`; the writable view is the only path to the
        // bytes while `&mut self` is borrowed.
        unsafe { self.writable_in_place().as_slice_mut_unchecked() }
    }
}

#[cfg(feature = "ndarray")]
mod arrays {
    use ndarray::{ArrayView, ArrayViewMut, Dimension, IxDyn};

    use super::*;
    use crate::args::kinds::{AnyRank, LayoutKind};

    impl<'py, T: Element, D: Dimension, L: LayoutKind> PyTensor<'py, T, D, Cpu, L> {
        /// The elements as an `ndarray` view of rank `D`, in any layout.
        pub fn as_array(&self) -> ArrayView<'_, T, D> {
            // SAFETY: extraction checked what `try_as_array` checks: host memory,
            // dtype, rank, alignment and values; unaliased under the borrow.
            unsafe { self.view().as_array_unchecked() }
        }
    }

    impl<'py, T: Element, L: LayoutKind> PyTensor<'py, T, AnyRank, Cpu, L> {
        /// The elements as an `ndarray` view of any rank.
        pub fn as_array_dyn(&self) -> ArrayView<'_, T, IxDyn> {
            // SAFETY: as for `as_array`; any rank is an `IxDyn` rank.
            unsafe { self.view().as_array_unchecked() }
        }
    }

    impl<'py, T: Element, D: Dimension, L: LayoutKind> PyTensorMut<'py, T, D, Cpu, L> {
        /// The elements as an `ndarray` view of rank `D`, to read.
        pub fn as_array(&self) -> ArrayView<'_, T, D> {
            // SAFETY: as for `PyTensor::as_array`, under the exclusive borrow.
            unsafe { self.view().as_array_unchecked() }
        }

        /// The elements as a mutable `ndarray` view of rank `D`: writes are seen
        /// in the caller's own object.
        pub fn as_array_mut(&mut self) -> ArrayViewMut<'_, T, D> {
            // SAFETY: as for `as_array`; the writable view is the only path to
            // the bytes while `&mut self` is borrowed.
            unsafe { self.writable_in_place().as_array_mut_unchecked() }
        }
    }

    impl<'py, T: Element, L: LayoutKind> PyTensorMut<'py, T, AnyRank, Cpu, L> {
        /// The elements as a mutable `ndarray` view of any rank.
        pub fn as_array_mut_dyn(&mut self) -> ArrayViewMut<'_, T, IxDyn> {
            // SAFETY: as for `as_array_mut`.
            unsafe { self.writable_in_place().as_array_mut_unchecked() }
        }
    }
}

/// What a kernel needs of a CUDA argument.
impl<'py, T: Dtype, D: Rank, L: LayoutKind> PyTensor<'py, T, D, Cuda, L> {
    /// The device address of element 0 (a `CUdeviceptr`), valid while the
    /// argument lives; launch on [`ready_stream`](Self::ready_stream).
    pub fn device_ptr(&self) -> u64 {
        self.view().as_ptr() as u64
    }

    /// The CUDA device the memory is on.
    pub fn device_id(&self) -> i32 {
        self.view().device().device_id
    }

    /// The element type (for an argument typed [`AnyDtype`](super::AnyDtype)).
    pub fn dtype(&self) -> DataType {
        self.view().dtype()
    }
}

impl<'py, T: Dtype, D: Rank, L: LayoutKind> PyTensorMut<'py, T, D, Cuda, L> {
    /// The device address of element 0, for kernels that write it; launch on
    /// [`ready_stream`](Self::ready_stream).
    pub fn device_ptr_mut(&mut self) -> u64 {
        self.view().as_ptr() as u64
    }

    /// The CUDA device the memory is on.
    pub fn device_id(&self) -> i32 {
        self.view().device().device_id
    }
}
