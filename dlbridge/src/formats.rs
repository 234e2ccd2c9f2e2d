//! The dtype spellings of other protocols: PEP 3118 buffer formats and NumPy
//! typestrs (`__array_interface__`, `__cuda_array_interface__`). Both parsers
//! take foreign input and are fuzzed.

use crate::dtype::{DataType, DataTypeCode, TABLE};
use crate::error::Error;
use core::ffi::CStr;

const NATIVE_ORDER: u8 = if cfg!(target_endian = "little") { b'<' } else { b'>' };

impl DataType {
    /// The PEP 3118 format of one element, for single-lane types that have one.
    pub fn buffer_format(self) -> Option<&'static CStr> {
        if self.lanes != 1 {
            return None;
        }
        self.entry().and_then(|e| e.buffer_format)
    }

    /// Parses a PEP 3118 format string of one scalar element, such as `"<f"` or
    /// `"Zd"`. Byte-order prefixes must name native order.
    pub fn from_buffer_format(format: &str) -> Option<Self> {
        let body = match format.as_bytes().first() {
            Some(b'@' | b'=') => &format[1..],
            Some(b'<') if cfg!(target_endian = "little") => &format[1..],
            Some(b'>' | b'!') if cfg!(target_endian = "big") => &format[1..],
            Some(b'<' | b'>' | b'!') => return None,
            _ => format,
        };
        // Platform-sized C types, for native-order formats.
        let body = match body {
            "l" => if core::mem::size_of::<core::ffi::c_long>() == 8 { "q" } else { "i" },
            "L" => if core::mem::size_of::<core::ffi::c_long>() == 8 { "Q" } else { "I" },
            "n" => if cfg!(target_pointer_width = "64") { "q" } else { "i" },
            "N" => if cfg!(target_pointer_width = "64") { "Q" } else { "I" },
            "c" => "B",
            other => other,
        };
        TABLE.iter().find(|e| e.buffer_format.is_some_and(|f| f.to_bytes() == body.as_bytes())).map(|e| e.dtype)
    }

    /// Parses a NumPy typestr (`"<f4"`, `"|b1"`, `"<c16"`): byte order, kind and
    /// size in bytes. Only native (or irrelevant, `|`) byte order is accepted.
    pub fn from_typestr(typestr: &str) -> Result<Self, Error> {
        let bad = |reason: &'static str| Error::UnsupportedFormat { format: typestr.to_owned(), reason };
        let bytes = typestr.as_bytes();
        if bytes.len() < 3 || !bytes.is_ascii() {
            return Err(bad("expected <byteorder><kind><size>"));
        }
        if !(bytes[0] == b'|' || bytes[0] == b'=' || bytes[0] == NATIVE_ORDER) {
            return Err(bad("DLPack only supports native byte order"));
        }
        let size: u8 = typestr[2..].parse().map_err(|_| bad("bad item size"))?;
        let code = match bytes[1] {
            b'b' if size == 1 => DataTypeCode::BOOL,
            b'i' => DataTypeCode::INT,
            b'u' => DataTypeCode::UINT,
            b'f' => DataTypeCode::FLOAT,
            b'c' => DataTypeCode::COMPLEX,
            _ => return Err(bad("this kind has no DLPack dtype")),
        };
        let dtype = DataType::new(code, size.checked_mul(8).ok_or_else(|| bad("item size too large"))?, 1);
        dtype.validate().map_err(|_| bad("no DLPack dtype has this kind and size"))?;
        Ok(dtype)
    }

    /// The NumPy typestr of a single-lane dtype whose kind NumPy has.
    pub fn typestr(self) -> Option<String> {
        let kind = match self.code {
            DataTypeCode::BOOL => 'b',
            DataTypeCode::INT => 'i',
            DataTypeCode::UINT => 'u',
            DataTypeCode::FLOAT => 'f',
            DataTypeCode::COMPLEX => 'c',
            _ => return None,
        };
        let size = self.itemsize().filter(|_| self.lanes == 1)?;
        let order = if size == 1 { '|' } else { NATIVE_ORDER as char };
        Some(format!("{order}{kind}{size}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typestrs_round_trip() {
        for dtype in [DataType::BOOL, DataType::INT8, DataType::UINT64, DataType::FLOAT16, DataType::FLOAT64, DataType::COMPLEX128] {
            let s = dtype.typestr().unwrap();
            assert_eq!(DataType::from_typestr(&s), Ok(dtype), "{s}");
        }
        for bad in ["", "<f", "<x4", ">f4x", "<f3", "<b2", "<f999", "<fé", "\u{0}f4"] {
            assert!(DataType::from_typestr(bad).is_err(), "{bad}");
        }
        assert_eq!(DataType::BFLOAT16.typestr(), None);
    }

    #[test]
    fn buffer_formats() {
        assert_eq!(DataType::from_buffer_format("<f"), Some(DataType::FLOAT32));
        assert_eq!(DataType::from_buffer_format("Zd"), Some(DataType::COMPLEX128));
        assert_eq!(DataType::from_buffer_format("é"), None);
    }
}
