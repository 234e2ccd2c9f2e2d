//! What the driver says of a kernel and its module: each parameter's offset
//! and size (`cuFuncGetParamInfo`, CUDA 12.4), checked against the arguments
//! of a launch; and the JIT compiler's log when it refuses PTX.

use core::ffi::{c_uint, c_void};

use super::{check, Api, CuResult, Handle, CUDA_SUCCESS};
use crate::error::Error;

const CUDA_ERROR_INVALID_VALUE: CuResult = 1;
/// `CU_JIT_ERROR_LOG_BUFFER` and `CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES`.
const CU_JIT_ERROR_LOG_BUFFER: c_uint = 5;
const CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES: c_uint = 6;
/// Room for the JIT's error log: a few dozen lines.
const LOG_BYTES: usize = 8192;

/// The kernel's parameters as `(offset, size)` in bytes, in order; `None`
/// where the driver cannot say (before CUDA 12.4, or an error).
pub(super) fn layout(api: &Api, function: Handle) -> Option<Vec<(usize, usize)>> {
    let query = api.func_get_param_info?;
    let mut params = Vec::new();
    loop {
        let (mut offset, mut size) = (0usize, 0usize);
        // SAFETY: a function of the current context, with writable out values.
        match unsafe { query(function, params.len(), &mut offset, &mut size) } {
            CUDA_SUCCESS => params.push((offset, size)),
            // Past the last parameter.
            CUDA_ERROR_INVALID_VALUE => return Some(params),
            _ => return None,
        }
    }
}

/// Refuses arguments whose number or sizes differ from the kernel's
/// parameters (`sizes`, each argument's value's size in bytes).
pub(super) fn check_arguments(layout: &[(usize, usize)], sizes: impl ExactSizeIterator<Item = usize>) -> Result<(), Error> {
    if sizes.len() != layout.len() {
        return Err(Error::KernelArguments {
            reason: format!("the kernel takes {} parameters, and {} arguments were given", layout.len(), sizes.len()),
        });
    }
    for (index, (size, &(_, wanted))) in sizes.zip(layout).enumerate() {
        if size != wanted {
            return Err(Error::KernelArguments {
                reason: format!("parameter {index} takes {wanted} bytes, and its argument is a value of {size} bytes"),
            });
        }
    }
    Ok(())
}

/// Loads PTX text into the current context (`cuModuleLoadDataEx`), asking for
/// the JIT compiler's error log: a refusal with a log is [`Error::PtxRejected`].
///
/// # Safety
/// `image` is NUL-terminated PTX text (checked by the caller), alive for the call.
pub(super) unsafe fn load(api: &Api, image: *const c_void) -> Result<Handle, Error> {
    let mut log = vec![0u8; LOG_BYTES];
    let mut options = [CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES];
    // The size travels in the pointer-sized slot, and the driver writes the
    // bytes it used back there.
    let mut values: [*mut c_void; 2] = [log.as_mut_ptr().cast(), core::ptr::without_provenance_mut(LOG_BYTES)];
    let mut module = core::ptr::null_mut();
    // SAFETY: NUL-terminated PTX (the caller's promise), two options whose
    // values are a writable buffer of LOG_BYTES bytes and its size; a writable
    // out value.
    let code = unsafe { (api.module_load_data_ex)(&mut module, image, 2, options.as_mut_ptr(), values.as_mut_ptr()) };
    if code == CUDA_SUCCESS {
        return Ok(module);
    }
    let used = values[1].addr().min(LOG_BYTES);
    let text = String::from_utf8_lossy(&log[..used]);
    let text = text.trim_end_matches('\0').trim();
    if text.is_empty() {
        return check("cuModuleLoadDataEx", code).map(|()| module);
    }
    Err(Error::PtxRejected { code, log: text.to_owned() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_checked_against_the_layout() {
        let layout = [(0, 8), (8, 8), (16, 8), (24, 4)];
        assert!(check_arguments(&layout, [8, 8, 8, 4].into_iter()).is_ok());
        let err = check_arguments(&layout, [8, 8, 8, 8].into_iter()).unwrap_err().to_string();
        assert!(err.contains("parameter 3 takes 4 bytes, and its argument is a value of 8 bytes"), "{err}");
        let err = check_arguments(&layout, [8, 8, 8].into_iter()).unwrap_err().to_string();
        assert!(err.contains("takes 4 parameters, and 3 arguments were given"), "{err}");
        assert!(check_arguments(&[], core::iter::empty()).is_ok());
    }
}
