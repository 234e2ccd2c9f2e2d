//! The two managed-tensor structs of the ABI, behind one trait: what differs
//! between the versioned struct and the legacy one (capsule names, version,
//! flags) and the prefix both share.

use core::ptr::NonNull;

use crate::ffi::{DLManagedTensor, DLManagedTensorVersioned, DLPackVersion, DLTensor};

mod sealed {
    pub trait Sealed {}
    impl Sealed for crate::ffi::DLManagedTensor {}
    impl Sealed for crate::ffi::DLManagedTensorVersioned {}
}

/// The two managed-tensor structs of the ABI. Sealed: only
/// [`DLManagedTensorVersioned`] and [`DLManagedTensor`] implement it.
pub trait ManagedAbi: sealed::Sealed + Sized + 'static {
    /// The Python capsule name that carries this struct.
    const CAPSULE_NAME: &'static core::ffi::CStr;
    /// The name a consumer gives the capsule once it owns the struct.
    const USED_CAPSULE_NAME: &'static core::ffi::CStr;
    /// Whether the struct carries a version and flags (false for the legacy one).
    const VERSIONED: bool;

    /// The ABI version, or `None` for the legacy struct.
    fn version(&self) -> Option<DLPackVersion>;
    /// The version, read through a raw pointer: only the stable prefix is
    /// touched, so it is sound for a struct of any major version.
    ///
    /// # Safety
    /// `ptr` must point at a live managed tensor.
    unsafe fn read_version(ptr: NonNull<Self>) -> Option<DLPackVersion>;
    /// The flags; always 0 for the legacy struct.
    fn flags(&self) -> u64;
    /// The flags, for writing; `None` for the legacy struct, which has none.
    fn flags_mut(&mut self) -> Option<&mut u64>;
    /// The tensor. Read only after the version has been checked.
    fn dl_tensor(&self) -> &DLTensor;
    /// Calls the deleter, if there is one.
    ///
    /// # Safety
    /// `ptr` must be an owned managed tensor; it must not be used afterwards.
    unsafe fn delete(ptr: NonNull<Self>);
    /// A struct with these fields; legacy tensors drop `flags`.
    fn assemble(
        dl_tensor: DLTensor,
        manager_ctx: *mut core::ffi::c_void,
        deleter: unsafe extern "C" fn(*mut Self),
        flags: u64,
    ) -> Self;
}

/// The items both ABIs implement alike: the tensor, and a deleter call that
/// reads only the `deleter` field through the raw pointer.
macro_rules! prefix_items {
    () => {
        fn dl_tensor(&self) -> &DLTensor {
            &self.dl_tensor
        }
        unsafe fn delete(ptr: NonNull<Self>) {
            let ptr = ptr.as_ptr();
            // SAFETY: the caller passes an owned tensor; `deleter` is in the
            // stable prefix, read by a place projection whatever the version.
            // The deleter may run Python code (see `thread_exit`).
            unsafe {
                if let Some(deleter) = (*ptr).deleter {
                    crate::thread_exit::parking_on_exit(|| deleter(ptr));
                }
            }
        }
    };
}

impl ManagedAbi for DLManagedTensorVersioned {
    const CAPSULE_NAME: &'static core::ffi::CStr = c"dltensor_versioned";
    const USED_CAPSULE_NAME: &'static core::ffi::CStr = c"used_dltensor_versioned";
    const VERSIONED: bool = true;

    fn version(&self) -> Option<DLPackVersion> {
        Some(self.version)
    }
    fn flags(&self) -> u64 {
        self.flags
    }
    fn flags_mut(&mut self) -> Option<&mut u64> {
        Some(&mut self.flags)
    }
    unsafe fn read_version(ptr: NonNull<Self>) -> Option<DLPackVersion> {
        // SAFETY: a place projection through the raw pointer reads only the
        // version field, which every major version keeps first.
        Some(unsafe { (*ptr.as_ptr()).version })
    }
    prefix_items!();
    fn assemble(
        dl_tensor: DLTensor,
        manager_ctx: *mut core::ffi::c_void,
        deleter: unsafe extern "C" fn(*mut Self),
        flags: u64,
    ) -> Self {
        DLManagedTensorVersioned { version: DLPackVersion::CURRENT, manager_ctx, deleter: Some(deleter), flags, dl_tensor }
    }
}

impl ManagedAbi for DLManagedTensor {
    const CAPSULE_NAME: &'static core::ffi::CStr = c"dltensor";
    const USED_CAPSULE_NAME: &'static core::ffi::CStr = c"used_dltensor";
    const VERSIONED: bool = false;

    fn version(&self) -> Option<DLPackVersion> {
        None
    }
    fn flags(&self) -> u64 {
        0
    }
    fn flags_mut(&mut self) -> Option<&mut u64> {
        None
    }
    unsafe fn read_version(_ptr: NonNull<Self>) -> Option<DLPackVersion> {
        None
    }
    prefix_items!();
    fn assemble(
        dl_tensor: DLTensor,
        manager_ctx: *mut core::ffi::c_void,
        deleter: unsafe extern "C" fn(*mut Self),
        _flags: u64,
    ) -> Self {
        DLManagedTensor { dl_tensor, manager_ctx, deleter: Some(deleter) }
    }
}
