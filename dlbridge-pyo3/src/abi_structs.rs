//! Structs that another build of this crate reads or writes: the borrow
//! registry's and the package's tables, and the structs passed through them.
//!
//! Their rule: fields are only appended, and each struct crosses with its
//! size, so a callee reads or writes no more than the caller has (missing
//! fields read as zero, their default); any other change is a new ABI major.
//! Tests beside each struct (`borrows/registry.rs`, `tensor/package.rs`) pin
//! every size and offset per major, so that a change without a new major fails (review S5: `Described` lost a field under the
//! same major, and an extension read 4,000 bytes of a 2,000-byte tensor).

/// Writes the first `size` bytes of `value` (all of it, if `size` is larger) to `out`.
///
/// # Safety
/// `out` is aligned for `T` and writable for `size` bytes; `T` is plain data
/// (no padding read matters to the caller beyond the fields it knows).
#[inline(always)] // the whole struct, the common case, is one store
pub(crate) unsafe fn write_prefix<T: Copy>(value: &T, out: *mut T, size: usize) {
    if size >= core::mem::size_of::<T>() {
        // SAFETY: forwarded from the caller; the caller's struct holds all of `T`.
        return unsafe { out.write(*value) };
    }
    // SAFETY: forwarded from the caller; fewer than `T`'s bytes are written.
    unsafe { core::ptr::copy_nonoverlapping(core::ptr::from_ref(value).cast::<u8>(), out.cast::<u8>(), size) }
}

/// Reads a `T` of which the caller has the first `size` bytes; the rest are zero.
///
/// # Safety
/// `from` is aligned for `T` and readable for `size` bytes; zero bytes are a
/// valid `T` (plain data: integers and raw pointers).
#[inline(always)]
pub(crate) unsafe fn read_prefix<T: Copy>(from: *const T, size: usize) -> T {
    if size >= core::mem::size_of::<T>() {
        // SAFETY: forwarded from the caller; the caller's struct holds all of `T`.
        return unsafe { from.read() };
    }
    let mut value = core::mem::MaybeUninit::<T>::zeroed();
    let size = size.min(core::mem::size_of::<T>());
    // SAFETY: forwarded from the caller; no more than `T`'s bytes are written.
    unsafe {
        core::ptr::copy_nonoverlapping(from.cast::<u8>(), value.as_mut_ptr().cast::<u8>(), size);
        value.assume_init()
    }
}
