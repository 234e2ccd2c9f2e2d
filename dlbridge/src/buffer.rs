//! The memory this crate allocates for tensors: 64-byte aligned, huge pages
//! for large buffers, always initialised before anyone sees it.

use core::alloc::Layout;
use core::ptr::NonNull;

use crate::error::Error;
use crate::ffi::DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED;
use crate::managed_abi::ManagedAbi;
use crate::owned::Owned;
use crate::{export, DataType, Device};

/// Alignment of every buffer this crate allocates; JAX copies data that is not
/// 64-byte aligned, and AVX-512 loads like it too.
pub const ALIGNMENT: usize = 64;

/// A heap buffer aligned to [`ALIGNMENT`]. Its bytes are always initialised
/// before anyone can see them.
pub struct AlignedBuffer {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the buffer is a uniquely owned heap allocation, like a Vec<u8>.
unsafe impl Send for AlignedBuffer {}
// SAFETY: shared access only reads.
unsafe impl Sync for AlignedBuffer {}

/// Buffers from this size up (glibc mmaps them afresh each time) are aligned to
/// 2 MiB and advised to use huge pages,
/// as NumPy does: a fresh 64 MiB buffer otherwise costs 16k page faults.
const HUGE_PAGE_THRESHOLD: usize = 32 << 20;
const HUGE_PAGE: usize = 2 << 20;

impl AlignedBuffer {
    // Cannot fire: `alloc` refuses lengths that could overflow before calling this.
    #[allow(clippy::expect_used)]
    fn layout(len: usize) -> Layout {
        let align = if len >= HUGE_PAGE_THRESHOLD { HUGE_PAGE } else { ALIGNMENT };
        // Cannot fail for len <= isize::MAX - HUGE_PAGE, which `alloc` checks first.
        Layout::from_size_align(len.max(1), align).expect("aligned layout")
    }

    /// Asks the kernel to back a large buffer with huge pages; only a hint.
    fn advise_huge_pages(ptr: NonNull<u8>, len: usize) {
        #[cfg(all(target_os = "linux", not(miri)))]
        if len >= HUGE_PAGE_THRESHOLD {
            // SAFETY: the range is one live allocation of ours; MADV_HUGEPAGE only
            // changes how the kernel backs it, never its contents.
            unsafe { libc::madvise(ptr.as_ptr().cast(), len, libc::MADV_HUGEPAGE) };
        }
        let _ = (ptr, len);
    }

    /// `len` bytes whose contents are undefined.
    ///
    /// # Safety
    /// Every byte must be written through [`base`](Self::base) before the
    /// buffer is read ([`as_slice`](Self::as_slice)) or exported.
    pub(crate) unsafe fn uninit(len: usize) -> Result<Self, Error> {
        Self::alloc(len, false)
    }

    fn alloc(len: usize, zeroed: bool) -> Result<Self, Error> {
        if len > isize::MAX as usize - HUGE_PAGE {
            return Err(Error::AllocationFailed { bytes: len });
        }
        let layout = Self::layout(len);
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { if zeroed { std::alloc::alloc_zeroed(layout) } else { std::alloc::alloc(layout) } };
        let ptr = NonNull::new(raw).ok_or(Error::AllocationFailed { bytes: len })?;
        Self::advise_huge_pages(ptr, len);
        Ok(AlignedBuffer { ptr, len })
    }

    /// The first byte, for writing.
    pub(crate) fn base(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// A zeroed buffer of `len` bytes.
    pub fn zeroed(len: usize) -> Result<Self, Error> {
        Self::alloc(len, true)
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `len` initialised bytes owned by self.
        unsafe { core::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `len` initialised bytes owned uniquely by self.
        unsafe { core::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Exports the buffer as a writable tensor of `dtype` and `shape`, row-major.
    pub fn into_tensor<M: ManagedAbi>(self, dtype: DataType, shape: &[i64]) -> Result<Owned<M>, Error> {
        self.into_tensor_padded(dtype, shape, false)
    }

    /// As [`into_tensor`](Self::into_tensor); `padded` stores a sub-byte dtype
    /// one element per byte and sets `IS_SUBBYTE_TYPE_PADDED`, which only a
    /// versioned tensor can carry.
    pub(crate) fn into_tensor_padded<M: ManagedAbi>(mut self, dtype: DataType, shape: &[i64], padded: bool) -> Result<Owned<M>, Error> {
        let padded = padded && dtype.is_sub_byte();
        if padded && !M::VERSIONED {
            return Err(Error::UnsupportedDtype { dtype, operation: "a legacy tensor, which cannot flag padding," });
        }
        let numel = crate::layout::element_count(shape)?;
        let needed = dtype
            .storage_bytes(numel as u64, padded)
            .ok_or_else(|| Error::SizeOverflow { shape: shape.to_vec() })?;
        if needed > self.len as u64 {
            return Err(Error::OutOfBounds { lowest: 0, highest: numel as i64 - 1, len: self.len });
        }
        let data = self.as_mut_slice().as_mut_ptr().cast();
        let layout = export::RawLayout { dtype, device: Device::CPU, shape, strides: None, byte_offset: 0 };
        let flags = if padded { DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED } else { 0 };
        // SAFETY: a row-major layout of `numel` elements needs `needed` bytes,
        // which the buffer holds; the buffer is the owner, and its heap memory
        // does not move with it.
        unsafe { export::export_raw(self, data, layout, flags) }
    }
}

impl Drop for AlignedBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated by `alloc` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.len)) }
    }
}

/// A zero-filled, writable, row-major CPU tensor of `dtype` and `shape`, in
/// 64-byte aligned memory ([`ALIGNMENT`]). The ABI is a type parameter: name it.
///
/// ```
/// use dlbridge::{zeros, DataType, OwnedTensor, ALIGNMENT};
///
/// let mut t: OwnedTensor = zeros(DataType::FLOAT64, &[2, 2])?;
/// assert_eq!(t.view().as_slice::<f64>(), Some(&[0.0; 4][..]));
/// assert_eq!(t.view().as_ptr() as usize % ALIGNMENT, 0);
/// t.try_view_mut()?.try_as_slice_mut::<f64>()?[3] = 1.5;
/// assert_eq!(t.view().as_slice::<f64>().map(|s| s[3]), Some(1.5));
/// # Ok::<(), dlbridge::Error>(())
/// ```
pub fn zeros<M: ManagedAbi>(dtype: DataType, shape: &[i64]) -> Result<Owned<M>, Error> {
    AlignedBuffer::zeroed(packed_bytes(dtype, shape)?)?.into_tensor(dtype, shape)
}

/// The bytes a packed row-major tensor of `dtype` and `shape` needs: an error
/// for an invalid dtype, a negative shape or a size that overflows `usize`.
pub(crate) fn packed_bytes(dtype: DataType, shape: &[i64]) -> Result<usize, Error> {
    dtype.validate()?;
    let numel = crate::layout::element_count(shape)?;
    dtype
        .storage_bytes(numel as u64, false)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(|| Error::SizeOverflow { shape: shape.to_vec() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::OwnedTensor;

    #[test]
    fn zeros_are_zero_and_aligned() {
        let z: OwnedTensor = zeros(DataType::FLOAT64, &[3, 5]).unwrap();
        assert_eq!(z.view().as_slice::<f64>().unwrap(), &[0.0; 15]);
        assert_eq!(z.view().as_ptr() as usize % ALIGNMENT, 0);
        let fp4 = DataType::new(crate::DataTypeCode::FLOAT4_E2M1FN, 4, 1);
        let z: OwnedTensor = zeros(fp4, &[3]).unwrap();
        assert_eq!(z.view().nbytes(), 2);
    }
}
