//! Arbitrary DLTensor metadata over a real 4 KiB buffer. Whatever the validator
//! accepts must reach only bytes inside the range it reports; when that range
//! lies inside the buffer, every element is read (through a slice, an ndarray
//! view and a contiguous copy), so AddressSanitizer catches any byte outside.
#![no_main]

use dlbridge::ffi::DLTensor;
use dlbridge::{DataType, DataTypeCode, Device, OwnedTensor, TensorView};
use libfuzzer_sys::fuzz_target;

const BUFFER: usize = 4096;

fn take<const N: usize>(data: &mut &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    let n = N.min(data.len());
    out[..n].copy_from_slice(&data[..n]);
    *data = &data[n..];
    out
}

fuzz_target!(|input: &[u8]| {
    let mut input = input;
    let header = take::<8>(&mut input);
    let ndim = i32::from(header[0] as i8 % 9);
    let dtype = DataType::new(DataTypeCode(header[1] % 20), header[2], u16::from(header[3] % 5));
    let offset = u64::from(u16::from_le_bytes([header[4], header[5]]));
    let null_strides = header[6] & 1 == 1;
    let padded = header[6] & 2 == 2;
    let mut shape = [0i64; 8];
    let mut strides = [0i64; 8];
    for i in 0..8 {
        let v = take::<2>(&mut input);
        shape[i] = i64::from(v[0] as i8 % 9);
        strides[i] = i64::from(v[1] as i8);
    }
    let buffer = vec![0u8; BUFFER];
    let tensor = DLTensor {
        data: buffer.as_ptr().cast_mut().cast(),
        device: Device::CPU,
        ndim,
        dtype,
        shape: shape.as_mut_ptr(),
        strides: if null_strides { core::ptr::null_mut() } else { strides.as_mut_ptr() },
        byte_offset: offset,
    };
    // SAFETY: shape and strides hold 8 entries; data is only read below when the
    // validated byte range lies inside `buffer`.
    let Ok(view) = (unsafe { TensorView::from_dltensor(&tensor, padded) }) else { return };
    let range = view.byte_range();
    let start = buffer.as_ptr() as usize;
    if range.is_empty() || range.start < start || range.end > start + BUFFER {
        return;
    }
    if let Some(bytes) = view.as_bytes() {
        assert!(bytes.as_ptr() as usize >= range.start && bytes.as_ptr() as usize + bytes.len() <= range.end);
        std::hint::black_box(bytes.iter().map(|&b| u64::from(b)).sum::<u64>());
    }
    if dtype == DataType::UINT8 {
        if let Ok(array) = view.try_as_array::<u8, ndarray::IxDyn>() {
            std::hint::black_box(array.iter().map(|&b| u64::from(b)).sum::<u64>());
        }
    }
    if let Ok(copy) = dlbridge::to_contiguous::<dlbridge::ffi::DLManagedTensorVersioned>(&view) {
        let copy: OwnedTensor = copy;
        assert_eq!(copy.view().len(), view.len());
    }
});
