//! Known memory: the fake's own allocations and the ranges tests register;
//! frees, and blocks handed out again. A freed block is never given back to
//! the host allocator while the process runs: it waits in `freed` for the next
//! allocation of its kind that fits, as a driver's pool reuses memory, so work
//! that still runs on it after the free writes its new owner's bytes (what a
//! reader sees on a GPU), and [`State::execute`] counts each such use.

use crate::*;

/// Host memory standing in for a block: 256-byte aligned, as the driver's.
fn layout(size: usize) -> Option<std::alloc::Layout> {
    std::alloc::Layout::from_size_align(size, 256).ok()
}

impl State {
    /// The known range holding all of `[start, start + len)`, if any.
    pub(crate) fn range_in(&self, start: usize, len: usize) -> Option<(usize, Place)> {
        let end = start.checked_add(len)?;
        self.memory
            .iter()
            .find(|(&base, &(size, _))| start >= base && base.checked_add(size).is_some_and(|limit| end <= limit))
            .map(|(&base, &(_, place))| (base, place))
    }

    /// Whether `[start, start + len)` overlaps a freed block not handed out again.
    pub(crate) fn touches_freed(&self, start: usize, len: usize) -> bool {
        len > 0 && self.freed.iter().any(|(&base, &(size, _))| start < base.saturating_add(size) && base < start.saturating_add(len))
    }

    /// A freed block of `place` that holds `size` bytes: the smallest, lowest first.
    fn reusable(&self, size: usize, place: Place) -> Option<(usize, usize)> {
        self.freed
            .iter()
            .filter(|(_, &(block, p))| p == place && block >= size)
            .map(|(&start, &(block, _))| (block, start))
            .min()
            .map(|(block, start)| (start, block))
    }

    /// Takes an allocation of `kind` away from the live ones: its layout size
    /// and place, or INVALID_VALUE for anything that is not one.
    fn take_owned(&mut self, ptr: usize, allocated: Kind) -> Result<(usize, Place), CuResult> {
        match self.owned.get(&ptr) {
            Some(&(size, k)) if k == allocated => {
                self.owned.remove(&ptr);
                let place = self.memory.get(&ptr).map_or(Place::Device(-1), |m| m.1);
                Ok((size, place))
            }
            _ => Err(INVALID_VALUE),
        }
    }

    /// The block is free from now on: unknown to copies, ready for reuse.
    pub(crate) fn release(&mut self, ptr: usize, size: usize, place: Place) {
        self.memory.remove(&ptr);
        self.freed.insert(ptr, (size, place));
    }
}

/// The known range holding all of `[start, start + len)`, if any.
pub(crate) fn range_of(start: usize, len: usize) -> Option<(usize, Place)> {
    with_state(|s| s.range_in(start, len))
}

/// The place of the known range `start` falls in (even if a length would run past it).
pub(crate) fn place_of(start: usize) -> Option<Place> {
    with_state(|s| s.memory.iter().find(|(&base, &(size, _))| start >= base && start - base < size).map(|(_, &(_, p))| p))
}

/// A block of `len` bytes of `place`, zeroed: a freed one that fits, else a
/// new one; OUT_OF_MEMORY past the place's capacity.
pub(crate) fn allocate(len: usize, place: Place, kind: Kind) -> Result<usize, CuResult> {
    let size = len.max(1);
    // Managed memory is freed like device memory, and so is pool memory.
    let freed_as = match kind {
        Kind::AllocManaged | Kind::AllocAsync => Kind::Alloc,
        other => other,
    };
    let ptr = with_state(|s| {
        let in_use: usize = s.owned.iter().filter(|(start, _)| s.memory.get(start).is_some_and(|m| m.1 == place)).map(|(_, (n, _))| n).sum();
        if size > CAPACITY.saturating_sub(in_use) {
            return Err(OUT_OF_MEMORY);
        }
        let (ptr, block) = match s.reusable(size, place) {
            Some((start, block)) => {
                s.freed.remove(&start);
                // SAFETY: a block of `block` bytes that `allocate` made and no one uses now.
                unsafe { std::ptr::write_bytes(start as *mut u8, 0, block) };
                (start, block)
            }
            None => {
                let layout = layout(size).ok_or(OUT_OF_MEMORY)?;
                // SAFETY: a non-zero size.
                let ptr = unsafe { std::alloc::alloc_zeroed(layout) } as usize;
                if ptr == 0 {
                    return Err(OUT_OF_MEMORY);
                }
                (ptr, size)
            }
        };
        s.memory.insert(ptr, (size, place));
        s.owned.insert(ptr, (block, freed_as));
        Ok(ptr)
    })?;
    // A pool allocation logs its stream instead of its address (`cuMemAllocAsync`).
    if kind != Kind::AllocAsync {
        log(kind, ptr as i64, len as i64);
    }
    Ok(ptr)
}

/// Frees an allocation of `allocated` kind now, whatever work is still queued
/// on it; anything else is INVALID_VALUE.
pub(crate) fn free_now(ptr: usize, allocated: Kind, kind: Kind) -> Result<(), CuResult> {
    with_state(|s| {
        let (size, place) = s.take_owned(ptr, allocated)?;
        s.release(ptr, size, place);
        Ok::<(), CuResult>(())
    })?;
    log(kind, ptr as i64, 0);
    Ok(())
}

/// Takes an allocation of `allocated` kind away from the live ones, for a
/// free that a stream carries out later: its layout size and place.
pub(crate) fn free_later(ptr: usize, allocated: Kind) -> Result<(usize, Place), CuResult> {
    with_state(|s| s.take_owned(ptr, allocated))
}

/// Frees every block a context reset destroyed: `(start, layout size)` of each.
pub(crate) fn dealloc(blocks: &[(usize, usize)]) {
    for &(start, size) in blocks {
        if let Some(layout) = layout(size) {
            // SAFETY: allocated by `allocate` with this size and alignment, and
            // forgotten by the caller (no longer owned, known or freed).
            unsafe { std::alloc::dealloc(start as *mut u8, layout) };
        }
    }
}

/// Checks a copy of `len` bytes: the source must be known memory when
/// `check_src`, the destination when `check_dst`; a host destination that is
/// known memory (pinned) must hold all of it too.
pub(crate) fn check_copy(dst: usize, src: usize, len: usize, check_src: bool, check_dst: bool) -> Result<(), CuResult> {
    let dst_ok = if check_dst || place_of(dst).is_some() { range_of(dst, len).is_some() } else { true };
    if (check_src && range_of(src, len).is_none()) || !dst_ok {
        return Err(INVALID_VALUE);
    }
    Ok(())
}

// --- test hooks ------------------------------------------------------------------------------

/// How many ops ran on a freed block (before it was handed out again): each
/// is a use after free that a driver would not report.
#[no_mangle]
pub extern "C" fn fake_cuda_uses_after_free() -> usize {
    with_state(|s| s.uses_after_free)
}

/// Makes devices report memory pools (the default) or not, as older drivers,
/// some virtualised GPUs and Windows in WDDM mode do not.
#[no_mangle]
pub extern "C" fn fake_cuda_set_memory_pools(supported: bool) {
    with_state(|s| s.pools = supported);
}
