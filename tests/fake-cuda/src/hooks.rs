//! The functions tests call (ctypes) for memory, the log, contexts and slow
//! calls; `timeline.rs` and `capture.rs` have those for streams and capture.

use crate::*;

/// Declares `[start, start + len)` to be memory of `device` (`kind` 0:
/// device memory, 1: pinned host memory, 2: managed memory), as a producer's
/// memory would be. A `device` of -2 is pinned memory of device 0.
#[no_mangle]
pub extern "C" fn fake_cuda_register_kind(start: usize, len: usize, device: i64, kind: i32) {
    let place = match (device, kind) {
        (PINNED, _) => Place::Pinned(0),
        (d, 1) => Place::Pinned(d),
        (d, 2) => Place::Managed(d),
        (d, _) => Place::Device(d),
    };
    with_state(|s| s.memory.insert(start, (len, place)));
}

/// [`fake_cuda_register_kind`] for device memory.
#[no_mangle]
pub extern "C" fn fake_cuda_register(start: usize, len: usize, device: i64) {
    fake_cuda_register_kind(start, len, device, 0);
}

/// Completes all work, then forgets every range registered with
/// [`fake_cuda_register`] (their memory may go away after this).
#[no_mangle]
pub extern "C" fn fake_cuda_forget_registered() {
    timeline::run_everything();
    with_state(|s| {
        let owned = &s.owned;
        s.memory.retain(|start, _| owned.contains_key(start));
    });
}

/// Makes `cuPointerGetAttribute` need a current context, or not.
#[no_mangle]
pub extern "C" fn fake_cuda_set_strict_pointer_queries(strict: bool) {
    with_state(|s| s.strict_pointer_queries = strict);
}

/// Makes every blocking call (synchronisations, synchronous copies, pinned
/// allocation, frees) take `ms` milliseconds.
#[no_mangle]
pub extern "C" fn fake_cuda_set_sync_delay_ms(ms: u64) {
    with_state(|s| s.sync_delay_ms = ms);
}

/// Makes `cuModuleUnload` take `ms` milliseconds more (the real one waits
/// for the device's work that uses the module), to widen the window in which
/// another thread runs while one unloads.
#[no_mangle]
pub extern "C" fn fake_cuda_set_unload_delay_ms(ms: u64) {
    with_state(|s| s.unload_delay_ms = ms);
}

/// How many rows the log holds.
#[no_mangle]
pub extern "C" fn fake_cuda_log_len() -> usize {
    with_state(|s| s.log.len())
}

/// Copies log row `index` into `out` (four values); false past the end.
///
/// # Safety
/// `out` has room for four values.
#[no_mangle]
pub unsafe extern "C" fn fake_cuda_log_row(index: usize, out: *mut i64) -> bool {
    with_state(|s| match s.log.get(index) {
        Some(row) => {
            // SAFETY: the caller's buffer of four.
            unsafe { std::ptr::copy_nonoverlapping(row.as_ptr(), out, 4) };
            true
        }
        None => false,
    })
}

/// Empties the log.
#[no_mangle]
pub extern "C" fn fake_cuda_clear_log() {
    with_state(|s| s.log.clear());
}

/// Events created and not destroyed.
#[no_mangle]
pub extern "C" fn fake_cuda_live_events() -> usize {
    with_state(|s| s.events.len())
}

/// Allocations (device and pinned) not freed.
#[no_mangle]
pub extern "C" fn fake_cuda_live_allocations() -> usize {
    with_state(|s| s.owned.len())
}

/// How many contexts this thread has pushed and not popped.
#[no_mangle]
pub extern "C" fn fake_cuda_context_depth() -> usize {
    CONTEXTS.with(|c| c.borrow().len())
}

/// How many times `device`'s primary context is retained and not released.
#[no_mangle]
pub extern "C" fn fake_cuda_primary_retains(device: i64) -> u32 {
    with_state(|s| s.contexts.get(device as usize).map_or(0, |c| c.retains))
}

/// What `cuDevicePrimaryCtxReset` does, from another library: destroys the
/// device's streams, events and allocations; handles given out before now
/// fail with CUDA_ERROR_CONTEXT_IS_DESTROYED.
#[no_mangle]
pub extern "C" fn fake_cuda_primary_reset(device: i64) {
    timeline::run_everything();
    let doomed: Vec<(usize, usize)> = with_state(|s| {
        let Some(context) = s.contexts.get_mut(device as usize) else { return Vec::new() };
        context.generation += 1;
        s.events.retain(|_, e| e.device != device);
        crate::modules::forget_device(s, device);
        s.queues.retain(|key, _| key.device != device);
        for handle in s.handles.values_mut() {
            if handle.is_some_and(|key| key.device == device) {
                *handle = None;
            }
        }
        let doomed: Vec<(usize, usize)> = s
            .owned
            .iter()
            .filter(|(start, _)| s.memory.get(start).is_some_and(|m| m.1.device() == device && !matches!(m.1, Place::Pinned(_))))
            .map(|(&start, &(size, _))| (start, size))
            .collect();
        for (start, _) in &doomed {
            s.owned.remove(start);
            s.memory.remove(start);
        }
        doomed
    });
    blocks::dealloc(&doomed);
}

/// The current bytes at `address` (no work is completed): what a GPU's memory
/// holds now, stale or not.
///
/// # Safety
/// `[address, address + len)` and `out` are readable and writable host memory.
#[no_mangle]
pub unsafe extern "C" fn fake_cuda_peek(address: usize, len: usize, out: *mut u8) {
    // SAFETY: the caller's promise.
    unsafe { std::ptr::copy(address as *const u8, out, len) };
}
