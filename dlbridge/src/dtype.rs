//! Element types: the DLPack `DLDataType` triple and its canonical names.
//! Its validity rules and parsing are in `dtype_rules.rs`; the Rust types that
//! match dtypes are in `element.rs`.
//!
//! [`TABLE`] is the project's only dtype table: the Python layer reads names and
//! buffer-protocol formats from it too.

use core::ffi::CStr;
use core::fmt;

/// A DLPack type code (`DLDataTypeCode`). Any `u8` is representable; unknown
/// codes are rejected by [`DataType::validate`], never by the type system.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct DataTypeCode(pub u8);

impl DataTypeCode {
    /// Signed integer.
    pub const INT: Self = Self(0);
    /// Unsigned integer.
    pub const UINT: Self = Self(1);
    /// IEEE floating point.
    pub const FLOAT: Self = Self(2);
    /// Opaque handle, for testing.
    pub const OPAQUE_HANDLE: Self = Self(3);
    /// bfloat16.
    pub const BFLOAT: Self = Self(4);
    /// Complex: `bits` counts both parts (complex64 has 64).
    pub const COMPLEX: Self = Self(5);
    /// Boolean, one byte per element.
    pub const BOOL: Self = Self(6);
    /// 8-bit float, 3 exponent bits.
    pub const FLOAT8_E3M4: Self = Self(7);
    /// 8-bit float, 4 exponent bits, IEEE-like.
    pub const FLOAT8_E4M3: Self = Self(8);
    /// 8-bit float, 4 exponent bits, bias 11, finite, unsigned zero (Graphcore).
    pub const FLOAT8_E4M3B11FNUZ: Self = Self(9);
    /// 8-bit float, 4 exponent bits, finite (OCP E4M3).
    pub const FLOAT8_E4M3FN: Self = Self(10);
    /// 8-bit float, 4 exponent bits, finite, unsigned zero.
    pub const FLOAT8_E4M3FNUZ: Self = Self(11);
    /// 8-bit float, 5 exponent bits (OCP E5M2).
    pub const FLOAT8_E5M2: Self = Self(12);
    /// 8-bit float, 5 exponent bits, finite, unsigned zero.
    pub const FLOAT8_E5M2FNUZ: Self = Self(13);
    /// 8-bit exponent-only scale (MX E8M0).
    pub const FLOAT8_E8M0FNU: Self = Self(14);
    /// 6-bit float, 2 exponent bits; `bits` must be 6.
    pub const FLOAT6_E2M3FN: Self = Self(15);
    /// 6-bit float, 3 exponent bits; `bits` must be 6.
    pub const FLOAT6_E3M2FN: Self = Self(16);
    /// 4-bit float; `bits` must be 4.
    pub const FLOAT4_E2M1FN: Self = Self(17);

    /// Whether DLPack 1.3 defines this code.
    pub const fn is_known(self) -> bool {
        self.0 <= 17
    }
}

/// An element type (`DLDataType`): a code, the bits of one lane, and the lanes
/// per element (1 for scalars, more for vector types such as `float32x4`).
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct DataType {
    /// The kind of number.
    pub code: DataTypeCode,
    /// Bits of one lane.
    pub bits: u8,
    /// Lanes per element; at least 1.
    pub lanes: u16,
}

/// One row of the dtype table: a canonical name, its type, and the Python
/// `struct` format used by the buffer protocol (`None` where it has none).
#[derive(Clone, Copy, Debug)]
pub struct DTypeEntry {
    /// Canonical name, as NumPy and ml_dtypes spell it.
    pub name: &'static str,
    /// The scalar type (lanes = 1).
    pub dtype: DataType,
    /// PEP 3118 format character(s), where one exists; a C string because the
    /// buffer protocol hands it out as one.
    pub buffer_format: Option<&'static CStr>,
}

const fn entry(name: &'static str, code: DataTypeCode, bits: u8, fmt: Option<&'static CStr>) -> DTypeEntry {
    DTypeEntry { name, dtype: DataType { code, bits, lanes: 1 }, buffer_format: fmt }
}

/// Every named scalar type, in a stable order.
pub const TABLE: &[DTypeEntry] = {
    use DataTypeCode as C;
    &[
        entry("bool", C::BOOL, 8, Some(c"?")),
        entry("int8", C::INT, 8, Some(c"b")),
        entry("int16", C::INT, 16, Some(c"h")),
        entry("int32", C::INT, 32, Some(c"i")),
        entry("int64", C::INT, 64, Some(c"q")),
        entry("uint8", C::UINT, 8, Some(c"B")),
        entry("uint16", C::UINT, 16, Some(c"H")),
        entry("uint32", C::UINT, 32, Some(c"I")),
        entry("uint64", C::UINT, 64, Some(c"Q")),
        entry("float16", C::FLOAT, 16, Some(c"e")),
        entry("float32", C::FLOAT, 32, Some(c"f")),
        entry("float64", C::FLOAT, 64, Some(c"d")),
        entry("bfloat16", C::BFLOAT, 16, None),
        entry("complex32", C::COMPLEX, 32, None),
        entry("complex64", C::COMPLEX, 64, Some(c"Zf")),
        entry("complex128", C::COMPLEX, 128, Some(c"Zd")),
        entry("float8_e3m4", C::FLOAT8_E3M4, 8, None),
        entry("float8_e4m3", C::FLOAT8_E4M3, 8, None),
        entry("float8_e4m3b11fnuz", C::FLOAT8_E4M3B11FNUZ, 8, None),
        entry("float8_e4m3fn", C::FLOAT8_E4M3FN, 8, None),
        entry("float8_e4m3fnuz", C::FLOAT8_E4M3FNUZ, 8, None),
        entry("float8_e5m2", C::FLOAT8_E5M2, 8, None),
        entry("float8_e5m2fnuz", C::FLOAT8_E5M2FNUZ, 8, None),
        entry("float8_e8m0fnu", C::FLOAT8_E8M0FNU, 8, None),
        entry("float6_e2m3fn", C::FLOAT6_E2M3FN, 6, None),
        entry("float6_e3m2fn", C::FLOAT6_E3M2FN, 6, None),
        entry("float4_e2m1fn", C::FLOAT4_E2M1FN, 4, None),
    ]
};

impl DataType {
    /// A type from its three fields.
    pub const fn new(code: DataTypeCode, bits: u8, lanes: u16) -> Self {
        DataType { code, bits, lanes }
    }
    /// `bool`, stored as one byte.
    pub const BOOL: Self = Self::new(DataTypeCode::BOOL, 8, 1);
    /// `int8`.
    pub const INT8: Self = Self::new(DataTypeCode::INT, 8, 1);
    /// `int16`.
    pub const INT16: Self = Self::new(DataTypeCode::INT, 16, 1);
    /// `int32`.
    pub const INT32: Self = Self::new(DataTypeCode::INT, 32, 1);
    /// `int64`.
    pub const INT64: Self = Self::new(DataTypeCode::INT, 64, 1);
    /// `uint8`.
    pub const UINT8: Self = Self::new(DataTypeCode::UINT, 8, 1);
    /// `uint16`.
    pub const UINT16: Self = Self::new(DataTypeCode::UINT, 16, 1);
    /// `uint32`.
    pub const UINT32: Self = Self::new(DataTypeCode::UINT, 32, 1);
    /// `uint64`.
    pub const UINT64: Self = Self::new(DataTypeCode::UINT, 64, 1);
    /// `float16`.
    pub const FLOAT16: Self = Self::new(DataTypeCode::FLOAT, 16, 1);
    /// `float32`.
    pub const FLOAT32: Self = Self::new(DataTypeCode::FLOAT, 32, 1);
    /// `float64`.
    pub const FLOAT64: Self = Self::new(DataTypeCode::FLOAT, 64, 1);
    /// `bfloat16`.
    pub const BFLOAT16: Self = Self::new(DataTypeCode::BFLOAT, 16, 1);
    /// `complex64`: two `float32`.
    pub const COMPLEX64: Self = Self::new(DataTypeCode::COMPLEX, 64, 1);
    /// `complex128`: two `float64`.
    pub const COMPLEX128: Self = Self::new(DataTypeCode::COMPLEX, 128, 1);

    /// The same type with `lanes` lanes.
    pub const fn with_lanes(self, lanes: u16) -> Self {
        DataType { lanes, ..self }
    }

    /// Bits of one element, all lanes together.
    pub const fn element_bits(self) -> u32 {
        self.bits as u32 * self.lanes as u32
    }

    /// Bytes of one element when that is a whole number; `None` for packed
    /// sub-byte types such as `float4_e2m1fn`.
    pub const fn itemsize(self) -> Option<usize> {
        let bits = self.element_bits();
        if bits % 8 == 0 && bits > 0 {
            Some((bits / 8) as usize)
        } else {
            None
        }
    }

    /// Whether elements are smaller than a byte or not byte-aligned, and so are
    /// packed (little bit-endian) unless the producer sets `IS_SUBBYTE_TYPE_PADDED`.
    pub const fn is_sub_byte(self) -> bool {
        self.element_bits() % 8 != 0
    }

    /// Bytes needed for `count` elements, packed or padded; `None` on overflow.
    pub fn storage_bytes(self, count: u64, padded: bool) -> Option<u64> {
        let bits = u64::from(self.element_bits());
        if padded {
            count.checked_mul(bits.div_ceil(8))
        } else {
            Some(count.checked_mul(bits)?.div_ceil(8))
        }
    }

    /// The table row of this scalar type, ignoring lanes.
    pub fn entry(self) -> Option<&'static DTypeEntry> {
        TABLE.iter().find(|e| e.dtype.code == self.code && e.dtype.bits == self.bits)
    }

    /// The canonical name of the scalar type, ignoring lanes (`"float32"`).
    pub fn scalar_name(self) -> Option<&'static str> {
        self.entry().map(|e| e.name)
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use DataTypeCode as C;
        match (self.scalar_name(), self.code) {
            (Some(name), _) => f.write_str(name)?,
            (None, C::INT) => write!(f, "int{}", self.bits)?,
            (None, C::UINT) => write!(f, "uint{}", self.bits)?,
            (None, C::OPAQUE_HANDLE) => write!(f, "handle{}", self.bits)?,
            _ => {
                return write!(f, "dtype(code={}, bits={}, lanes={})", self.code.0, self.bits, self.lanes)
            }
        }
        if self.lanes != 1 {
            write!(f, "x{}", self.lanes)?;
        }
        Ok(())
    }
}

impl fmt::Debug for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_cover_every_code() {
        for (i, a) in TABLE.iter().enumerate() {
            for b in &TABLE[i + 1..] {
                assert_ne!(a.name, b.name);
                assert_ne!(a.dtype, b.dtype);
            }
        }
        for code in 0..=17u8 {
            if code != DataTypeCode::OPAQUE_HANDLE.0 {
                assert!(TABLE.iter().any(|e| e.dtype.code.0 == code), "code {code}");
            }
        }
    }

    #[test]
    fn sizes_of_packed_types() {
        let fp4 = DataType::new(DataTypeCode::FLOAT4_E2M1FN, 4, 1);
        assert_eq!(fp4.itemsize(), None);
        assert!(fp4.is_sub_byte());
        assert_eq!(fp4.storage_bytes(3, false), Some(2));
        assert_eq!(fp4.storage_bytes(3, true), Some(3));
        let fp6 = DataType::new(DataTypeCode::FLOAT6_E2M3FN, 6, 1);
        assert_eq!(fp6.storage_bytes(4, false), Some(3));
        assert_eq!(DataType::FLOAT64.storage_bytes(u64::MAX, false), None);
    }

    #[test]
    fn buffer_formats() {
        assert_eq!(DataType::from_buffer_format("<f"), Some(DataType::FLOAT32));
        assert_eq!(DataType::from_buffer_format("Zd"), Some(DataType::COMPLEX128));
        assert_eq!(DataType::from_buffer_format("?"), Some(DataType::BOOL));
        assert_eq!(DataType::from_buffer_format("l"), Some(DataType::INT64));
        assert_eq!(DataType::from_buffer_format(">f"), None);
        assert_eq!(DataType::from_buffer_format("O"), None);
        assert_eq!(DataType::FLOAT32.buffer_format(), Some(c"f"));
    }

}
