//! Which dtypes the header allows, and dtypes by name: the rules that can
//! refuse a [`DataType`], apart from the values themselves (`dtype.rs`).

use core::str::FromStr;

use crate::dtype::{DataType, DataTypeCode, TABLE};
use crate::error::Error;

impl DataType {
    /// Checks the header's rules: a known code, bits that fit the code (bool 8,
    /// float8 8, float6 6, float4 4, bfloat 16, ...), and at least one lane.
    pub fn validate(self) -> Result<(), Error> {
        use DataTypeCode as C;
        if self.lanes == 0 {
            return Err(Error::ZeroLanes { dtype: self });
        }
        let bits = self.bits;
        let expected: &'static str = match self.code {
            C::INT | C::UINT => {
                if bits >= 1 && (bits <= 8 || matches!(bits, 16 | 32 | 64)) {
                    return Ok(());
                }
                "1 to 8, 16, 32 or 64"
            }
            C::FLOAT => {
                if matches!(bits, 16 | 32 | 64) {
                    return Ok(());
                }
                "16, 32 or 64"
            }
            C::OPAQUE_HANDLE => {
                if bits >= 1 {
                    return Ok(());
                }
                "at least 1"
            }
            C::BFLOAT => {
                if bits == 16 {
                    return Ok(());
                }
                "16"
            }
            C::COMPLEX => {
                if matches!(bits, 32 | 64 | 128) {
                    return Ok(());
                }
                "32, 64 or 128"
            }
            C::BOOL => {
                if bits == 8 {
                    return Ok(());
                }
                "8"
            }
            c if (7..=14).contains(&c.0) => {
                if bits == 8 {
                    return Ok(());
                }
                "8"
            }
            C::FLOAT6_E2M3FN | C::FLOAT6_E3M2FN => {
                if bits == 6 {
                    return Ok(());
                }
                "6"
            }
            C::FLOAT4_E2M1FN => {
                if bits == 4 {
                    return Ok(());
                }
                "4"
            }
            code => return Err(Error::UnknownDtypeCode { code: code.0 }),
        };
        Err(Error::InvalidDtypeBits { dtype: self, expected })
    }
}

impl FromStr for DataType {
    type Err = Error;

    /// Parses a canonical name, `intN`/`uintN`/`handleN`, and an optional
    /// `xL` lanes suffix (`"float32x4"`).
    fn from_str(s: &str) -> Result<Self, Error> {
        let dtype = match parse_scalar(s) {
            Some(scalar) => scalar,
            None => s
                .rsplit_once('x')
                .and_then(|(base, lanes)| {
                    let lanes = lanes.parse::<u16>().ok().filter(|_| lanes.bytes().all(|b| b.is_ascii_digit()))?;
                    Some(parse_scalar(base)?.with_lanes(lanes))
                })
                .ok_or_else(|| Error::UnknownDtypeName { name: s.to_owned() })?,
        };
        dtype.validate()?;
        Ok(dtype)
    }
}

/// A canonical name, or `intN` / `uintN` / `handleN`, as a single-lane type.
fn parse_scalar(name: &str) -> Option<DataType> {
    if let Some(e) = TABLE.iter().find(|e| e.name == name) {
        return Some(e.dtype);
    }
    let generic = [("uint", DataTypeCode::UINT), ("int", DataTypeCode::INT), ("handle", DataTypeCode::OPAQUE_HANDLE)];
    generic.iter().find_map(|(prefix, code)| {
        let bits = name.strip_prefix(prefix)?;
        bits.bytes().all(|b| b.is_ascii_digit()).then_some(())?;
        Some(DataType::new(*code, bits.parse().ok()?, 1))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_table_name_round_trips_and_is_valid() {
        for e in TABLE {
            assert_eq!(e.dtype.to_string(), e.name);
            assert_eq!(e.name.parse::<DataType>().unwrap(), e.dtype);
            e.dtype.validate().unwrap();
        }
    }

    #[test]
    fn lanes_suffix() {
        let t: DataType = "float32x4".parse().unwrap();
        assert_eq!(t, DataType::FLOAT32.with_lanes(4));
        assert_eq!(t.to_string(), "float32x4");
        assert_eq!(t.itemsize(), Some(16));
        assert_eq!("int4".parse::<DataType>().unwrap(), DataType::new(DataTypeCode::INT, 4, 1));
        assert!("float32x0".parse::<DataType>().is_err());
        assert!("float33".parse::<DataType>().is_err());
        assert!("complex".parse::<DataType>().is_err());
    }

    #[test]
    fn header_bit_rules() {
        let bad = [
            (DataTypeCode::BOOL, 1),
            (DataTypeCode::FLOAT4_E2M1FN, 8),
            (DataTypeCode::FLOAT6_E2M3FN, 8),
            (DataTypeCode::FLOAT6_E3M2FN, 4),
            (DataTypeCode::FLOAT8_E5M2, 16),
            (DataTypeCode::BFLOAT, 32),
            (DataTypeCode::FLOAT, 8),
            (DataTypeCode::INT, 0),
        ];
        for (code, bits) in bad {
            let t = DataType::new(code, bits, 1);
            assert!(matches!(t.validate(), Err(Error::InvalidDtypeBits { .. })), "{t:?}");
        }
        assert!(matches!(DataType::new(DataTypeCode(18), 8, 1).validate(), Err(Error::UnknownDtypeCode { code: 18 })));
        assert!(matches!(DataType::FLOAT32.with_lanes(0).validate(), Err(Error::ZeroLanes { .. })));
        // torch's two-fp4-per-byte encoding is accepted as a 2-lane fp4.
        DataType::new(DataTypeCode::FLOAT4_E2M1FN, 4, 2).validate().unwrap();
    }
}
