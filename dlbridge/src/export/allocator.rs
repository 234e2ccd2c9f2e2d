//! Where an export's one block comes from: the global allocator, or one that a
//! binding prefers (a Python extension uses Python's own, as NumPy does).

use core::alloc::Layout;

/// Allocates and frees the block behind an export (the managed struct, its
/// owner, shape and strides). Allocation happens on the exporting thread;
/// freeing happens in the deleter, on whatever thread the consumer calls it.
///
/// # Safety
/// `allocate` returns NULL or a fresh block, valid for `layout` (size and
/// alignment) and used by nothing else, that stays allocated and untouched
/// until `release` is called for it. `release` has no `self`: the type alone
/// must be able to free a block from any of its values. Called on any thread,
/// it runs `drop_owner` at most once, with the block's bytes as they were, and
/// only then frees the block (it may leak both, as a binding must once its
/// runtime is gone). It must not unwind: it runs inside a C deleter.
pub unsafe trait BlockAllocator {
    /// A block for `layout`, or NULL when none can be had (or `layout` is zero-sized).
    fn allocate(&self, layout: Layout) -> *mut u8;

    /// Runs `drop_owner`, then frees `block`.
    ///
    /// # Safety
    /// `block` came from `allocate` of this type with `layout`, and is not used afterwards.
    unsafe fn release(block: *mut u8, layout: Layout, drop_owner: impl FnOnce());
}

/// The global allocator (`std::alloc`): exports made with no other choice.
#[derive(Clone, Copy, Debug, Default)]
pub struct GlobalBlocks;

// SAFETY: std::alloc's contract is this trait's.
unsafe impl BlockAllocator for GlobalBlocks {
    fn allocate(&self, layout: Layout) -> *mut u8 {
        if layout.size() == 0 {
            return core::ptr::null_mut();
        }
        // SAFETY: not zero-sized.
        unsafe { std::alloc::alloc(layout) }
    }

    unsafe fn release(block: *mut u8, layout: Layout, drop_owner: impl FnOnce()) {
        drop_owner();
        // SAFETY: from `allocate` with this layout, per the caller.
        unsafe { std::alloc::dealloc(block, layout) };
    }
}
