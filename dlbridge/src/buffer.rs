//! The memory this crate allocates for tensors: 64-byte aligned, always
//! initialised before anyone sees it, and never touched when it need not be.
//!
//! Large buffers are anonymous mappings, as glibc's `calloc` gives NumPy: the
//! kernel hands out zeroed pages lazily, so allocating is O(1) in the size and
//! a 4 GiB tensor takes resident memory only as it is written. From 4 MiB they
//! are aligned to 2 MiB (by mapping 2 MiB more and trimming) and advised to use
//! huge pages before the first touch, when the advice still counts. Small
//! buffers come from the Rust allocator.

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

/// A buffer aligned to [`ALIGNMENT`]. Its bytes are always initialised
/// before anyone can see them.
pub struct AlignedBuffer {
    ptr: NonNull<u8>,
    len: usize,
    /// Where the memory came from, to give it back there.
    source: Source,
}

#[derive(Clone, Copy)]
enum Source {
    /// The Rust allocator, with this layout.
    Heap(Layout),
    /// An anonymous mapping of this many bytes from `ptr`.
    #[cfg(all(target_os = "linux", not(miri)))]
    Mapped(usize),
}

// SAFETY: the buffer is uniquely owned memory, like a Vec<u8>.
unsafe impl Send for AlignedBuffer {}
// SAFETY: shared access only reads.
unsafe impl Sync for AlignedBuffer {}

/// Buffers from this size up are mapped afresh, zeroed lazily by the kernel
/// (glibc's own threshold for fresh mappings starts at 128 KiB).
const MAPPED_THRESHOLD: usize = 1 << 20;
/// Buffers from this size up are aligned to 2 MiB and advised to use huge
/// pages, as NumPy advises from 4 MiB: a fresh 64 MiB buffer otherwise costs
/// 16k page faults.
const HUGE_PAGE_THRESHOLD: usize = 4 << 20;
const HUGE_PAGE: usize = 2 << 20;

impl AlignedBuffer {
    /// `len` bytes whose contents are undefined.
    ///
    /// # Safety
    /// Every byte must be written through [`base`](Self::base) before the
    /// buffer is read ([`as_slice`](Self::as_slice)) or exported.
    pub(crate) unsafe fn uninit(len: usize) -> Result<Self, Error> {
        Self::alloc(len, false)
    }

    /// A zeroed buffer of `len` bytes: O(1) in the size for large buffers,
    /// whose pages the kernel zeroes when they are first touched.
    pub fn zeroed(len: usize) -> Result<Self, Error> {
        Self::alloc(len, true)
    }

    fn alloc(len: usize, zeroed: bool) -> Result<Self, Error> {
        if len > isize::MAX as usize - HUGE_PAGE {
            return Err(Error::AllocationFailed { bytes: len });
        }
        #[cfg(all(target_os = "linux", not(miri)))]
        if len >= MAPPED_THRESHOLD {
            return Self::map(len);
        }
        let layout = Layout::from_size_align(len.max(1), ALIGNMENT).map_err(|_| Error::AllocationFailed { bytes: len })?;
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { if zeroed { std::alloc::alloc_zeroed(layout) } else { std::alloc::alloc(layout) } };
        let ptr = NonNull::new(raw).ok_or(Error::AllocationFailed { bytes: len })?;
        Ok(AlignedBuffer { ptr, len, source: Source::Heap(layout) })
    }

    /// A fresh anonymous mapping of `len` bytes, zero until written; from
    /// [`HUGE_PAGE_THRESHOLD`] up, 2 MiB aligned and advised to use huge pages.
    #[cfg(all(target_os = "linux", not(miri)))]
    fn map(len: usize) -> Result<Self, Error> {
        let align = if len >= HUGE_PAGE_THRESHOLD { HUGE_PAGE } else { 1 };
        let kept = len.next_multiple_of(page_size());
        // Room to slide the start up to the next 2 MiB boundary.
        let mapped = kept + if align > 1 { align } else { 0 };
        // SAFETY: a new private anonymous mapping; the kernel picks the address.
        let raw = unsafe {
            libc::mmap(core::ptr::null_mut(), mapped, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
        };
        if raw == libc::MAP_FAILED {
            return Err(Error::AllocationFailed { bytes: len });
        }
        let start = raw as usize;
        let aligned = start.next_multiple_of(align);
        let head = aligned - start;
        let tail = mapped - head - kept;
        // SAFETY: page-aligned parts of our own new mapping that nothing uses:
        // before the aligned start, and after the pages kept.
        unsafe {
            if head > 0 {
                libc::munmap(raw, head);
            }
            if tail > 0 {
                libc::munmap((aligned + kept) as *mut libc::c_void, tail);
            }
        }
        // SAFETY: inside our mapping, which starts at a non-NULL address.
        let ptr = unsafe { NonNull::new_unchecked(aligned as *mut u8) };
        if align == HUGE_PAGE {
            // SAFETY: the range is our own mapping; MADV_HUGEPAGE only changes how
            // the kernel backs it, never its contents. Only a hint.
            unsafe { libc::madvise(ptr.as_ptr().cast(), kept, libc::MADV_HUGEPAGE) };
        }
        Ok(AlignedBuffer { ptr, len, source: Source::Mapped(kept) })
    }

    /// A buffer holding a copy of `bytes`, written once (never zeroed first).
    pub fn copy_of(bytes: &[u8]) -> Result<Self, Error> {
        // SAFETY: every byte is written just below, before anyone sees the buffer.
        let buffer = unsafe { Self::uninit(bytes.len()) }?;
        // SAFETY: a fresh buffer of `bytes.len()` bytes, apart from `bytes`.
        unsafe { core::ptr::copy_nonoverlapping(bytes.as_ptr(), buffer.base(), bytes.len()) };
        Ok(buffer)
    }

    /// The first byte, for writing.
    pub(crate) fn base(&self) -> *mut u8 {
        self.ptr.as_ptr()
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
        match self.source {
            // SAFETY: allocated by `alloc` with this layout.
            Source::Heap(layout) => unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) },
            // SAFETY: our own mapping of this many bytes, unmapped once.
            #[cfg(all(target_os = "linux", not(miri)))]
            Source::Mapped(bytes) => unsafe {
                libc::munmap(self.ptr.as_ptr().cast(), bytes);
            },
        }
    }
}

/// The kernel's page size.
#[cfg(all(target_os = "linux", not(miri)))]
fn page_size() -> usize {
    // SAFETY: sysconf may be called at any time.
    usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096).max(1)
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

    /// This process's resident memory, in bytes (Linux).
    #[cfg(all(target_os = "linux", not(miri)))]
    fn resident() -> usize {
        let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
        statm.split_whitespace().nth(1).unwrap().parse::<usize>().unwrap() * page_size()
    }

    #[test]
    #[cfg(all(target_os = "linux", not(miri)))]
    fn large_buffers_take_memory_only_as_they_are_written() {
        let before = resident();
        let mut big = AlignedBuffer::zeroed(4 << 30).unwrap();
        let grown = resident().saturating_sub(before);
        assert!(grown < 64 << 20, "4 GiB of zeros took {grown} resident bytes at once");
        assert_eq!(big.ptr.as_ptr() as usize % HUGE_PAGE, 0);
        let bytes = big.as_mut_slice();
        bytes[0] = 1;
        bytes[(4 << 30) - 1] = 2;
        assert_eq!((bytes[0], bytes[1 << 30], bytes[(4 << 30) - 1]), (1, 0, 2));
        let small = AlignedBuffer::copy_of(&[7; 100]).unwrap();
        assert_eq!((small.as_slice(), small.ptr.as_ptr() as usize % ALIGNMENT), (&[7; 100][..], 0));
        let mid = AlignedBuffer::copy_of(&vec![3; 3 << 20]).unwrap();
        assert!(mid.as_slice().iter().all(|&b| b == 3) && mid.ptr.as_ptr() as usize % ALIGNMENT == 0);
    }

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
