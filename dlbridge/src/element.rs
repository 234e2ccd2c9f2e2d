//! [`Element`]: the Rust types whose values are elements of a DLPack dtype,
//! which typed slices and ndarray views of a tensor may use.

use crate::dtype::DataType;

/// A Rust type whose values are elements of one DLPack [`DataType`].
///
/// # Safety
/// `size_of::<Self>() * 8` must equal `DTYPE.element_bits()`, `align_of::<Self>()`
/// must not exceed `size_of::<Self>()`, and every byte pattern for which
/// [`Element::bit_patterns_valid`] returns true must be a valid value of `Self`.
pub unsafe trait Element: Copy + Send + Sync + 'static {
    /// The DLPack type of `Self`.
    const DTYPE: DataType;

    /// Whether `bytes` (a whole number of elements) holds only valid values of
    /// `Self`. True for types where every bit pattern is valid.
    fn bit_patterns_valid(bytes: &[u8]) -> bool {
        let _ = bytes;
        true
    }
}

macro_rules! element {
    ($($t:ty => $dtype:expr),* $(,)?) => {$(
        // SAFETY: a plain number type of exactly `bits` bits; every pattern is valid.
        unsafe impl Element for $t {
            const DTYPE: DataType = $dtype;
        }
    )*};
}

element! {
    i8 => DataType::INT8, i16 => DataType::INT16, i32 => DataType::INT32, i64 => DataType::INT64,
    u8 => DataType::UINT8, u16 => DataType::UINT16, u32 => DataType::UINT32, u64 => DataType::UINT64,
    f32 => DataType::FLOAT32, f64 => DataType::FLOAT64,
}

// SAFETY: `bool` is one byte; only 0 and 1 are valid, which `bit_patterns_valid` checks.
unsafe impl Element for bool {
    const DTYPE: DataType = DataType::BOOL;
    fn bit_patterns_valid(bytes: &[u8]) -> bool {
        bytes.iter().all(|&b| b <= 1)
    }
}

#[cfg(feature = "half")]
element! { half::f16 => DataType::FLOAT16, half::bf16 => DataType::BFLOAT16 }

#[cfg(feature = "complex")]
element! {
    num_complex::Complex<f32> => DataType::COMPLEX64,
    num_complex::Complex<f64> => DataType::COMPLEX128,
}

#[cfg(feature = "float8")]
element! {
    float8::F8E4M3 => DataType::new(crate::DataTypeCode::FLOAT8_E4M3FN, 8, 1),
    float8::F8E5M2 => DataType::new(crate::DataTypeCode::FLOAT8_E5M2, 8, 1),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bool_rejects_bytes_other_than_0_and_1() {
        assert!(bool::bit_patterns_valid(&[0, 1, 1]));
        assert!(!bool::bit_patterns_valid(&[0, 2]));
    }
}
