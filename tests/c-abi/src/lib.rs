//! The C side of dlbridge's ABI tests, compiled against the real `dlpack.h` by
//! `build.rs`. The tests live in `tests/`.

use dlbridge::ffi::DLManagedTensorVersioned;

/// One row of the C layout table: a name such as `"DLTensor.ndim"` and a value.
#[repr(C)]
pub struct LayoutRow {
    /// What was measured, NUL-terminated.
    pub name: *const core::ffi::c_char,
    /// `sizeof`, `_Alignof`, `offsetof` or a constant's value.
    pub value: u64,
}

extern "C" {
    /// Every layout fact and constant the header defines.
    pub static dlb_layout_rows: [LayoutRow; 0];
    /// The number of rows in `dlb_layout_rows`.
    pub static dlb_layout_len: usize;
    /// A C-produced float32 tensor holding 0, 1, 2, ...
    pub fn dlb_c_make_tensor(rows: i64, cols: i64, transposed: i32) -> *mut DLManagedTensorVersioned;
    /// Sums a tensor through its strides and calls its deleter.
    pub fn dlb_c_consume_sum(tensor: *mut DLManagedTensorVersioned) -> f64;
    /// How many C-produced tensors have been deleted.
    pub fn dlb_c_deleted_count() -> i32;
}

/// The path of the header the C side was compiled against.
pub const HEADER: &str = env!("DLPACK_HEADER");
