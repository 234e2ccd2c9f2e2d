//! Typed reads of a validated view: its bytes, slices of its elements. Each
//! checks that host code may read the memory as Rust values first: memory the
//! CPU reaches, that no other path may write (not aliased), of the right
//! dtype, aligned, holding valid values.

use crate::element::Element;
use crate::error::Error;
use crate::view::TensorView;

impl<'a> TensorView<'a> {
    /// Checks that the elements may be read by the CPU as Rust values: the
    /// memory is CPU-accessible and no other path may write it.
    pub(crate) fn check_host_readable(&self) -> Result<(), Error> {
        if !self.device().is_cpu_accessible() {
            return Err(Error::NotCpuAccessible { device: self.device() });
        }
        if self.is_aliased() {
            return Err(Error::Aliased);
        }
        Ok(())
    }

    /// Checks that the memory is host-readable and holds `T`s, aligned for `T`.
    pub(crate) fn check_typed<T: Element>(&self) -> Result<(), Error> {
        self.check_host_readable()?;
        if self.dtype() != T::DTYPE {
            return Err(Error::DtypeMismatch { expected: T::DTYPE, found: self.dtype() });
        }
        let align = core::mem::align_of::<T>();
        if !self.is_empty() && (self.ptr as usize) % align != 0 {
            return Err(Error::Misaligned { address: self.ptr as usize, align });
        }
        Ok(())
    }

    /// The raw bytes of a C-contiguous, host-readable tensor, in index order.
    /// `None` otherwise.
    pub fn as_bytes(&self) -> Option<&'a [u8]> {
        self.try_as_bytes().ok()
    }

    /// Like [`as_bytes`](Self::as_bytes), with the reason for a refusal.
    pub fn try_as_bytes(&self) -> Result<&'a [u8], Error> {
        self.check_host_readable()?;
        if !self.is_c_contiguous() {
            return Err(Error::NotContiguous);
        }
        if self.is_empty() {
            return Ok(&[]);
        }
        // SAFETY: validation proved ptr+lo..ptr+hi lies in the address space and,
        // by `from_dltensor`'s contract, is readable and unwritten for 'a (the
        // view is not aliased); a C-contiguous layout has lo == 0 and hi == nbytes.
        Ok(unsafe { core::slice::from_raw_parts(self.ptr, self.byte_range().len()) })
    }

    /// The elements as a slice, when the tensor is C-contiguous, host-readable,
    /// of dtype `T::DTYPE`, aligned for `T`, and holds only valid `T` values.
    pub fn as_slice<T: Element>(&self) -> Option<&'a [T]> {
        self.try_as_slice().ok()
    }

    /// Like [`as_slice`](Self::as_slice), with the reason for a refusal.
    pub fn try_as_slice<T: Element>(&self) -> Result<&'a [T], Error> {
        self.check_typed::<T>()?;
        let bytes = self.try_as_bytes()?;
        if !T::bit_patterns_valid(bytes) {
            return Err(Error::InvalidValues { dtype: self.dtype() });
        }
        // SAFETY: every check of `try_as_slice` passed.
        Ok(unsafe { self.as_slice_unchecked() })
    }

    /// [`try_as_slice`](Self::try_as_slice) without its checks, for a view
    /// already checked (a typed extension argument, checked at extraction).
    ///
    /// # Safety
    /// `try_as_slice::<T>()` must succeed on this view (or a clone of it):
    /// C-contiguous, host-readable, not aliased, of `T`'s dtype, aligned, and
    /// holding only valid `T` values.
    pub unsafe fn as_slice_unchecked<T: Element>(&self) -> &'a [T] {
        if self.is_empty() {
            return &[];
        }
        // SAFETY: the caller's promise: numel * size_of::<T>() readable bytes
        // (`Element` ties T's size to the dtype), aligned, valid T values.
        unsafe { core::slice::from_raw_parts(self.ptr.cast::<T>(), self.len()) }
    }
}
