//! Fuzzes the parsers of other protocols' foreign input: NumPy typestrs, PEP 3118
//! buffer formats, dtype names, and the array-interface fields (shape and byte
//! strides turned into element strides, then exported over a buffer). None may
//! panic, and what they accept must round-trip.
#![no_main]

use dlbridge::layout::element_strides_from_bytes;
use dlbridge::{DataType, OwnedTensor};
use libfuzzer_sys::fuzz_target;

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fuzz_target!(|input: &[u8]| {
    let (head, rest) = input.split_at(input.len().min(12));
    let s = text(head);
    if let Ok(dtype) = DataType::from_typestr(&s) {
        assert_eq!(DataType::from_typestr(&dtype.typestr().expect("accepted typestrs have one")), Ok(dtype));
    }
    if let Some(dtype) = DataType::from_buffer_format(&s) {
        assert!(dtype.buffer_format().is_some());
    }
    if let Ok(dtype) = s.parse::<DataType>() {
        assert_eq!(dtype.to_string().parse::<DataType>(), Ok(dtype));
    }
    // Array-interface fields: up to 4 axes of (extent, byte stride), an itemsize.
    let values: Vec<i64> = rest.chunks_exact(8).take(9).map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect();
    let Some((&itemsize, pairs)) = values.split_first() else { return };
    let itemsize = (itemsize.unsigned_abs() % 17) as usize;
    let ndim = pairs.len() / 2;
    let shape: Vec<i64> = pairs[..ndim].iter().map(|d| d % 9).collect();
    let byte_strides: Vec<i64> = pairs[ndim..2 * ndim].to_vec();
    if let Ok(strides) = element_strides_from_bytes(&byte_strides, &shape, itemsize) {
        // Whatever the strides, an export over a small buffer is either in bounds or refused.
        if let Ok(t) = OwnedTensor::from_owner(vec![0u8; 64], &shape, Some(&strides)) {
            let range = t.view().byte_range();
            assert!(range.end - range.start <= 64);
        }
    }
});
