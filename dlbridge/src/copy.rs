//! Contiguous copies of any CPU-reachable view, into 64-byte aligned memory.
//!
//! Contiguous sources are one `memcpy`. Strided sources are first simplified
//! (axes of extent 1 dropped, axes that are contiguous with each other merged);
//! rows whose elements are adjacent are copied with `memcpy`, and the rest goes
//! through tiles of the two innermost axes so that both the reads and the
//! writes stay in cache (transposes are the common case).

use crate::buffer::AlignedBuffer;
use crate::error::Error;
use crate::managed_abi::ManagedAbi;
use crate::owned::Owned;
use crate::view::TensorView;

/// An owned, C-contiguous copy of `view`, with IS_COPIED set on versioned
/// tensors. A padded sub-byte view stays padded (and says so). Refused for
/// memory the CPU cannot reach and for an aliased view ([`Error::Aliased`]).
///
/// The result's ABI is a type parameter: name it where the compiler cannot
/// infer it.
///
/// ```
/// use dlbridge::{to_contiguous, OwnedTensor};
///
/// // A transposed view of a row-major 2x3 tensor...
/// let t = OwnedTensor::from_owner_mut(vec![0i32, 1, 2, 3, 4, 5], &[3, 2], Some(&[1, 3]))?;
/// // ...copied into fresh row-major memory.
/// let c: OwnedTensor = to_contiguous(t.view())?;
/// assert_eq!(c.view().as_slice::<i32>(), Some(&[0, 3, 1, 4, 2, 5][..]));
/// assert!(c.is_copied());
/// # Ok::<(), dlbridge::Error>(())
/// ```
///
/// Packed sub-byte dtypes are copied only when the source is already
/// contiguous; a strided packed layout is refused.
pub fn to_contiguous<M: ManagedAbi>(view: &TensorView<'_>) -> Result<Owned<M>, Error> {
    view.check_host_readable()?;
    let padded = view.is_subbyte_padded() && view.dtype().is_sub_byte();
    if padded && !M::VERSIONED {
        return Err(Error::UnsupportedDtype { dtype: view.dtype(), operation: "a legacy tensor, which cannot flag padding," });
    }
    let nbytes = view.nbytes();
    // SAFETY: both branches below write every one of its bytes before the
    // buffer is exported.
    let buffer = unsafe { AlignedBuffer::uninit(nbytes) }?;
    let dst = buffer.base();
    if let Some(src) = view.as_bytes() {
        // SAFETY: a contiguous view's bytes are exactly `nbytes` long; the buffer
        // is a fresh allocation of that size. A contiguous copy is a strided
        // copy of one row of bytes, so large ones are split across threads too.
        unsafe { parallel_strided_copy(src.as_ptr(), dst, &[nbytes], &[1], 1) };
    } else {
        // Padded sub-byte elements take one whole byte each.
        let element_bytes = if padded { view.dtype().element_bits().div_ceil(8) as usize } else { 0 };
        let Some(itemsize) = view.dtype().itemsize().or(Some(element_bytes).filter(|&b| b > 0)) else {
            return Err(Error::UnsupportedDtype { dtype: view.dtype(), operation: "a strided copy of packed sub-byte data" });
        };
        let shape: Vec<usize> = view.shape().iter().map(|&d| d as usize).collect();
        let strides: Vec<isize> = view.strides().iter().map(|&s| s as isize * itemsize as isize).collect();
        // SAFETY: the view was validated: every byte its layout reaches from
        // `as_ptr` is readable, and the buffer holds `nbytes` = numel * itemsize.
        unsafe {
            parallel_strided_copy(view.as_ptr().cast(), dst, &shape, &strides, itemsize);
        }
    }
    let mut tensor: Owned<M> = buffer.into_tensor_padded(view.dtype(), view.shape(), padded)?;
    tensor.mark_copied();
    Ok(tensor)
}

/// Drops axes of extent 1 and merges axes that are contiguous with each other.
// Cannot fire: the two vectors grow together, and `last_mut` follows a `last` that was Some.
#[allow(clippy::expect_used)]
fn simplify(shape: &[usize], strides: &[isize]) -> (Vec<usize>, Vec<isize>) {
    let mut out_shape: Vec<usize> = Vec::with_capacity(shape.len());
    let mut out_strides: Vec<isize> = Vec::with_capacity(shape.len());
    for (&d, &s) in shape.iter().zip(strides) {
        if d == 1 {
            continue;
        }
        if let (Some(last_d), Some(&last_s)) = (out_shape.last_mut(), out_strides.last()) {
            if last_s == s * d as isize {
                *last_d *= d;
                *out_strides.last_mut().expect("same length") = s;
                continue;
            }
        }
        out_shape.push(d);
        out_strides.push(s);
    }
    (out_shape, out_strides)
}

/// Copies the elements of a strided source, in row-major index order, to `dst`.
///
/// Copies of at least this many bytes are split across threads: below it, the
/// threads cost more than the copy (and fresh pages are faulted in by one core).
const PARALLEL_THRESHOLD: usize = 8 << 20;

/// [`strided_copy`], split along the first axis across up to 8 scoped threads
/// when the copy is large (each thread writes its own rows; first-touch page
/// faults of the fresh destination are spread too).
///
/// # Safety
/// As [`strided_copy`].
unsafe fn parallel_strided_copy(src: *const u8, dst: *mut u8, shape: &[usize], strides: &[isize], itemsize: usize) {
    let (shape, strides) = simplify(shape, strides);
    let total = shape.iter().product::<usize>() * itemsize;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(8);
    if total < PARALLEL_THRESHOLD || threads < 2 || shape.is_empty() || cfg!(miri) {
        // SAFETY: forwarded from the caller.
        return unsafe { strided_copy(src, dst, &shape, &strides, itemsize) };
    }
    // Split the outermost axis (or, for one contiguous run, the bytes themselves).
    let (outer, outer_stride, inner_shape, inner_strides) = (shape[0], strides[0], &shape[1..], &strides[1..]);
    let row_bytes = inner_shape.iter().product::<usize>() * itemsize;
    let chunk = outer.div_ceil(threads);
    // Raw pointers are not Send: each thread gets the two base pointers in a
    // wrapper that is (they keep their provenance).
    #[derive(Clone, Copy)]
    struct Bases(*const u8, *mut u8);
    // SAFETY: the threads touch disjoint parts of `dst` and only read `src`,
    // and the scope ends before the caller's buffers can go away.
    unsafe impl Send for Bases {}
    impl Bases {
        // Taking the whole value makes a closure capture all of it (Send),
        // not its two pointer fields (which are not).
        fn get(self) -> (*const u8, *mut u8) {
            (self.0, self.1)
        }
    }
    let bases = Bases(src, dst);
    std::thread::scope(|scope| {
        for first in (0..outer).step_by(chunk.max(1)) {
            let rows = chunk.min(outer - first);
            scope.spawn(move || {
                let (src, dst) = bases.get();
                let mut part_shape = Vec::with_capacity(inner_shape.len() + 1);
                part_shape.push(rows);
                part_shape.extend_from_slice(inner_shape);
                let mut part_strides = Vec::with_capacity(inner_strides.len() + 1);
                part_strides.push(outer_stride);
                part_strides.extend_from_slice(inner_strides);
                // SAFETY: rows `first..first + rows` of the caller's layout, read
                // from their strided offset and written to their own dense,
                // disjoint part of `dst`; the caller's guarantees cover both.
                unsafe {
                    let part_src = src.wrapping_offset(first as isize * outer_stride);
                    let part_dst = dst.wrapping_add(first * row_bytes);
                    strided_copy(part_src, part_dst, &part_shape, &part_strides, itemsize);
                }
            });
        }
    });
}

/// # Safety
/// Every element the layout reaches from `src` must be readable, `dst` must be
/// writable for `prod(shape) * itemsize` bytes, and the two must not overlap.
unsafe fn strided_copy(src: *const u8, dst: *mut u8, shape: &[usize], strides: &[isize], itemsize: usize) {
    let (shape, strides) = simplify(shape, strides);
    if shape.contains(&0) {
        return;
    }
    // SAFETY: forwarded from the caller; the loops visit each index of `shape`
    // once, reading at its strided offset and writing densely.
    unsafe {
        match (shape.len(), strides.last()) {
            (0, _) => core::ptr::copy_nonoverlapping(src, dst, itemsize),
            (_, Some(&s)) if s == itemsize as isize => {
                let row = shape[shape.len() - 1];
                let outer = &shape[..shape.len() - 1];
                for_each_index(outer, &strides[..strides.len() - 1], |offset, k| {
                    core::ptr::copy_nonoverlapping(src.offset(offset), dst.add(k * row * itemsize), row * itemsize);
                });
            }
            (1, _) => match itemsize {
                1 => copy_column::<1>(src, dst, shape[0], strides[0]),
                2 => copy_column::<2>(src, dst, shape[0], strides[0]),
                4 => copy_column::<4>(src, dst, shape[0], strides[0]),
                8 => copy_column::<8>(src, dst, shape[0], strides[0]),
                16 => copy_column::<16>(src, dst, shape[0], strides[0]),
                _ => {
                    for i in 0..shape[0] {
                        core::ptr::copy_nonoverlapping(src.offset(i as isize * strides[0]), dst.add(i * itemsize), itemsize);
                    }
                }
            },
            (n, _) => {
                let (rows, cols) = (shape[n - 2], shape[n - 1]);
                let (rs, cs) = (strides[n - 2], strides[n - 1]);
                let plane = rows * cols * itemsize;
                for_each_index(&shape[..n - 2], &strides[..n - 2], |offset, k| {
                    let (s, d) = (src.offset(offset), dst.add(k * plane));
                    match itemsize {
                        1 => copy_tiled::<1>(s, d, rows, cols, rs, cs),
                        2 => copy_tiled::<2>(s, d, rows, cols, rs, cs),
                        4 => copy_tiled::<4>(s, d, rows, cols, rs, cs),
                        8 => copy_tiled::<8>(s, d, rows, cols, rs, cs),
                        16 => copy_tiled::<16>(s, d, rows, cols, rs, cs),
                        _ => copy_tiled_dyn(s, d, rows, cols, rs, cs, itemsize),
                    }
                });
            }
        }
    }
}

/// Calls `f(byte_offset, linear_index)` for every index of `shape`, in row-major order.
fn for_each_index(shape: &[usize], strides: &[isize], mut f: impl FnMut(isize, usize)) {
    let total: usize = shape.iter().product();
    let mut index = vec![0usize; shape.len()];
    let mut offset = 0isize;
    for k in 0..total {
        f(offset, k);
        for axis in (0..shape.len()).rev() {
            index[axis] += 1;
            offset += strides[axis];
            if index[axis] < shape[axis] {
                break;
            }
            offset -= strides[axis] * shape[axis] as isize;
            index[axis] = 0;
        }
    }
}

unsafe fn copy_column<const N: usize>(src: *const u8, dst: *mut u8, n: usize, stride: isize) {
    let dst = dst.cast::<[u8; N]>();
    for i in 0..n {
        // SAFETY: forwarded from `strided_copy`; unaligned access is explicit.
        unsafe { dst.add(i).write_unaligned(src.offset(i as isize * stride).cast::<[u8; N]>().read_unaligned()) };
    }
}

const TILE: usize = 32;

unsafe fn copy_tiled<const N: usize>(src: *const u8, dst: *mut u8, rows: usize, cols: usize, rs: isize, cs: isize) {
    let dst = dst.cast::<[u8; N]>();
    for r0 in (0..rows).step_by(TILE) {
        for c0 in (0..cols).step_by(TILE) {
            for r in r0..(r0 + TILE).min(rows) {
                for c in c0..(c0 + TILE).min(cols) {
                    // SAFETY: forwarded from `strided_copy`.
                    unsafe {
                        let v = src.offset(r as isize * rs + c as isize * cs).cast::<[u8; N]>().read_unaligned();
                        dst.add(r * cols + c).write_unaligned(v);
                    }
                }
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
unsafe fn copy_tiled_dyn(src: *const u8, dst: *mut u8, rows: usize, cols: usize, rs: isize, cs: isize, size: usize) {
    for r in 0..rows {
        for c in 0..cols {
            // SAFETY: forwarded from `strided_copy`.
            unsafe {
                core::ptr::copy_nonoverlapping(src.offset(r as isize * rs + c as isize * cs), dst.add((r * cols + c) * size), size);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::DLTensor;
    use crate::{DataType, Device};
    use crate::OwnedTensor;

    fn view_of<'a>(t: &'a DLTensor) -> TensorView<'a> {
        // SAFETY: the tests build `t` over live vectors.
        unsafe { TensorView::from_dltensor(t, false) }.unwrap()
    }

    fn dl(data: &mut [i32], shape: &mut [i64], strides: &mut [i64], first: usize) -> DLTensor {
        DLTensor {
            data: data.as_mut_ptr().cast(),
            device: Device::CPU,
            ndim: shape.len() as i32,
            dtype: DataType::INT32,
            shape: shape.as_mut_ptr(),
            strides: strides.as_mut_ptr(),
            byte_offset: (first * 4) as u64,
        }
    }

    #[test]
    fn transpose_and_reverse() {
        let mut data: Vec<i32> = (0..6).collect();
        // A (3, 2) transpose of a row-major (2, 3).
        let (mut shape, mut strides) = ([3i64, 2], [1i64, 3]);
        let t = dl(&mut data, &mut shape, &mut strides, 0);
        let c: OwnedTensor = to_contiguous(&view_of(&t)).unwrap();
        assert_eq!(c.view().as_slice::<i32>().unwrap(), &[0, 3, 1, 4, 2, 5]);
        assert!(c.is_copied());
        assert_eq!(c.view().as_ptr() as usize % crate::ALIGNMENT, 0);
        // Reversed rows.
        let (mut shape, mut strides) = ([2i64, 3], [-3i64, 1]);
        let t = dl(&mut data, &mut shape, &mut strides, 3);
        let c: OwnedTensor = to_contiguous(&view_of(&t)).unwrap();
        assert_eq!(c.view().as_slice::<i32>().unwrap(), &[3, 4, 5, 0, 1, 2]);
    }

    #[test]
    fn broadcast_and_scalar() {
        let mut data = vec![5i32];
        let (mut shape, mut strides) = ([2i64, 3], [0i64, 0]);
        let t = dl(&mut data, &mut shape, &mut strides, 0);
        let c: OwnedTensor = to_contiguous(&view_of(&t)).unwrap();
        assert_eq!(c.view().as_slice::<i32>().unwrap(), &[5; 6]);
    }

    #[test]
    #[cfg_attr(miri, ignore = "a 9 MiB copy; the threaded path is not taken under Miri anyway")]
    fn large_copies_split_across_threads_are_exact() {
        let n: i32 = (9 << 20) / 4 + 3;
        let data: Vec<i32> = (0..n).collect();
        let t = OwnedTensor::from_vec(data.clone(), &[i64::from(n)]).unwrap();
        let c: OwnedTensor = to_contiguous(t.view()).unwrap();
        assert_eq!(c.view().as_slice::<i32>().unwrap(), &data[..]);
        // Transposed, so the strided path splits rows.
        let (rows, cols) = (1031i64, 2311i64);
        let t = OwnedTensor::from_owner_mut((0..(rows * cols) as i32).collect::<Vec<_>>(), &[cols, rows], Some(&[1, cols])).unwrap();
        let c: OwnedTensor = to_contiguous(t.view()).unwrap();
        let got = c.view().as_slice::<i32>().unwrap();
        assert!((0..cols).all(|j| (0..rows).all(|i| got[(j * rows + i) as usize] == (i * cols + j) as i32)));
    }

    #[test]
    fn simplify_merges_contiguous_axes() {
        assert_eq!(simplify(&[2, 1, 3, 4], &[48, 7, 16, 4]), (vec![24], vec![4]));
        assert_eq!(simplify(&[2, 3], &[4, 8]), (vec![2, 3], vec![4, 8]));
    }
}
