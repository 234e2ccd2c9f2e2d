//! Shape and stride arithmetic, in one place: row-major strides, element
//! counts, the extent a layout reaches, and strides in bytes versus elements.
//! Every function checks its arithmetic; none reads memory.

pub use crate::dims::Small;
use crate::dtype::DataType;
use crate::error::Error;

/// Most dimensions a tensor may have; NumPy allows the same 64.
pub const MAX_NDIM: usize = 64;

/// Hands `put(axis, stride)` the row-major strides of `shape`, last axis first,
/// saturating on overflow. Returns false if they overflowed, which only an
/// empty tensor can do (every partial product of a non-empty one is at most its
/// element count); such strides are never used.
pub fn row_major_strides_into(shape: &[i64], mut put: impl FnMut(usize, i64)) -> bool {
    let (mut acc, mut exact) = (1i64, true);
    for (axis, &dim) in shape.iter().enumerate().rev() {
        put(axis, acc);
        let next = acc.checked_mul(dim.max(1));
        exact &= next.is_some();
        acc = next.unwrap_or(i64::MAX);
    }
    exact
}

/// The element count of `shape`, checked against `i64` and `usize`.
pub fn element_count(shape: &[i64]) -> Result<usize, Error> {
    let mut n: i64 = 1;
    for (axis, &size) in shape.iter().enumerate() {
        if size < 0 {
            return Err(Error::NegativeDimension { axis, size });
        }
        n = n.checked_mul(size).ok_or_else(|| Error::SizeOverflow { shape: shape.to_vec() })?;
    }
    usize::try_from(n).map_err(|_| Error::SizeOverflow { shape: shape.to_vec() })
}

/// Lowest and highest element index reached by a non-empty layout, relative to
/// element 0. `None` on overflow (no such tensor fits in memory anyway).
pub fn element_extent(shape: &[i64], strides: &[i64]) -> Option<(i64, i64)> {
    let (mut lo, mut hi) = (0i64, 0i64);
    for (&dim, &stride) in shape.iter().zip(strides) {
        let reach = (dim - 1).checked_mul(stride)?;
        if reach < 0 {
            lo = lo.checked_add(reach)?;
        } else {
            hi = hi.checked_add(reach)?;
        }
    }
    Some((lo, hi))
}

/// Byte range `lo..hi` that elements `lo_elem..=hi_elem` occupy, relative to
/// element 0, for elements of `bits` bits, packed or padded to whole bytes.
pub(crate) fn byte_extent(lo_elem: i64, hi_elem: i64, dtype: DataType, padded: bool) -> Option<(i64, i64)> {
    let bits = i64::from(dtype.element_bits());
    if padded || bits % 8 == 0 {
        let size = (bits + 7) / 8;
        Some((lo_elem.checked_mul(size)?, hi_elem.checked_add(1)?.checked_mul(size)?))
    } else {
        let lo = lo_elem.checked_mul(bits)?.div_euclid(8);
        let hi = hi_elem.checked_add(1)?.checked_mul(bits)?.checked_add(7)?.div_euclid(8);
        Some((lo, hi))
    }
}

/// Where a layout sits in a slice: the index of element 0, the element count,
/// and the element extent `lo..=hi` relative to element 0.
pub(crate) struct Placement {
    pub(crate) first: usize,
    pub(crate) numel: usize,
    pub(crate) lo: i64,
    pub(crate) hi: i64,
}

/// The extent of a layout: the element count and `lo..=hi` relative to element 0.
pub(crate) fn extent_of(shape: &[i64], strides: Option<&[i64]>) -> Result<Placement, Error> {
    if shape.len() > MAX_NDIM {
        return Err(Error::NdimOutOfRange { ndim: shape.len() as i64, max: MAX_NDIM });
    }
    let numel = element_count(shape)?;
    if numel == 0 {
        return Ok(Placement { first: 0, numel, lo: 0, hi: 0 });
    }
    let (lo, hi) = match strides {
        None => (0, numel as i64 - 1),
        Some(strides) => {
            if strides.len() != shape.len() {
                return Err(Error::StridesLength { expected: shape.len(), found: strides.len() });
            }
            element_extent(shape, strides)
                .ok_or_else(|| Error::ExtentOverflow { shape: shape.to_vec(), strides: strides.to_vec(), byte_offset: 0 })?
        }
    };
    Ok(Placement { first: 0, numel, lo, hi })
}

/// Checks that a layout's extent stays inside a buffer of `len` elements, and
/// places element 0 so that the lowest element reached is index 0.
pub(crate) fn place_in_buffer(place: &mut Placement, len: usize) -> Result<(), Error> {
    if place.numel == 0 {
        return Ok(());
    }
    // `first + hi` is the highest index reached: it must be below `len`.
    let first = place.lo.checked_neg().unwrap_or(i64::MAX);
    if first.checked_add(place.hi).filter(|&h| (h as u64) < len as u64).is_none() {
        return Err(Error::OutOfBounds { lowest: 0, highest: first.saturating_add(place.hi), len });
    }
    place.first = first as usize;
    Ok(())
}

/// Strides in elements from strides in bytes, as the buffer protocol and the
/// array interfaces give them. A stride that is not a whole number of elements
/// is refused, unless its axis has at most one element (where it is never used).
pub fn element_strides_from_bytes(byte_strides: &[i64], shape: &[i64], itemsize: usize) -> Result<Vec<i64>, Error> {
    if byte_strides.len() != shape.len() {
        return Err(Error::StridesLength { expected: shape.len(), found: byte_strides.len() });
    }
    byte_strides.iter().zip(shape).enumerate().map(|(axis, (&s, &d))| element_stride(axis, s, d, itemsize)).collect()
}

/// One stride in elements from one in bytes; see [`element_strides_from_bytes`].
pub fn element_stride(axis: usize, byte_stride: i64, dim: i64, itemsize: usize) -> Result<i64, Error> {
    let size = i64::try_from(itemsize.max(1)).unwrap_or(i64::MAX);
    // A mask and a shift for the usual power-of-two sizes: a division costs tens of cycles.
    let pow2 = size.count_ones() == 1;
    let (whole, elements) = if pow2 { (byte_stride & (size - 1) == 0, byte_stride >> size.trailing_zeros()) } else { (byte_stride % size == 0, byte_stride / size) };
    if !whole {
        return if dim > 1 { Err(Error::StrideNotWhole { axis, byte_stride, itemsize }) } else { Ok(0) };
    }
    Ok(elements)
}

/// Strides in bytes from strides in elements, saturating (only an extent
/// already validated is converted, so saturation never happens in practice).
pub fn byte_strides(strides: &[i64], itemsize: usize) -> impl ExactSizeIterator<Item = i64> + '_ {
    let size = i64::try_from(itemsize).unwrap_or(i64::MAX);
    strides.iter().map(move |&s| s.saturating_mul(size))
}

/// Whether `axes` (extent, stride), innermost first, are dense: each stride
/// is the product of the extents inside it (axes of extent 1 skipped).
pub(crate) fn is_contiguous<'s>(axes: impl Iterator<Item = (&'s i64, &'s i64)>, numel: usize) -> bool {
    if numel <= 1 {
        return true;
    }
    let mut expected = 1i64;
    for (&dim, &stride) in axes {
        if dim != 1 {
            if stride != expected {
                return false;
            }
            expected = expected.saturating_mul(dim);
        }
    }
    true
}

/// Whether no two indices of a non-empty layout reach the same element: sorted
/// by stride, each axis must step past everything the smaller ones cover.
#[inline(always)]
pub(crate) fn is_non_overlapping(shape: &[i64], strides: &[i64]) -> bool {
    // Row-major contiguous, the common case: nothing to sort.
    let mut expected = 1i64;
    let contiguous = shape.iter().zip(strides).rev().filter(|(&d, _)| d > 1).all(|(&d, &s)| {
        let matches = s == expected;
        expected = expected.saturating_mul(d);
        matches
    });
    contiguous || strided_is_non_overlapping(shape, strides)
}

/// [`is_non_overlapping`] for any layout: the axes sorted by stride.
#[inline(never)]
fn strided_is_non_overlapping(shape: &[i64], strides: &[i64]) -> bool {
    let mut axes: Small<(u128, u128)> = Small::new();
    for (&d, &s) in shape.iter().zip(strides) {
        if d > 1 {
            axes.push((u128::from(s.unsigned_abs()), d as u128));
        }
    }
    axes.as_mut_slice().sort_unstable();
    let mut span = 1u128; // elements covered by the axes seen so far
    for &(stride, dim) in axes.as_slice() {
        if stride < span {
            return false;
        }
        span += stride * (dim - 1);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every layout of up to three axes of size 0..=3 and strides -4..=4 with
    /// two elements or more, against an oracle that enumerates the offsets;
    /// and row-major layouts are always found free of overlap.
    #[test]
    fn non_overlap_matches_enumeration() {
        let values = |n, range: core::ops::RangeInclusive<i64>| {
            (0..n).fold(vec![vec![]], |all: Vec<Vec<i64>>, _| {
                all.into_iter().flat_map(|v| range.clone().map(move |x| [v.clone(), vec![x]].concat())).collect()
            })
        };
        for shape in values(3, 1..=3) {
            let strides = [shape[1] * shape[2], shape[2], 1];
            assert!(is_non_overlapping(&shape, &strides), "{shape:?} {strides:?}");
        }
        // Smaller under Miri, which runs this thousands of times slower.
        let (axes, size, stride) = if cfg!(miri) { (2, 2, 2) } else { (3, 3, 4) };
        for ndim in 0..=axes {
            for shape in values(ndim, 0..=size) {
                for strides in values(ndim, -stride..=stride) {
                    let mut offsets = vec![0i64];
                    for (&d, &s) in shape.iter().zip(&strides) {
                        offsets = offsets.iter().flat_map(|&o| (0..d).map(move |i| o + i * s)).collect();
                    }
                    if offsets.len() <= 1 {
                        continue; // callers answer for empty and one-element tensors
                    }
                    let distinct = offsets.len() == offsets.iter().collect::<std::collections::HashSet<_>>().len();
                    // Sufficient, not exact: a "yes" must be right (writes rely on it).
                    if is_non_overlapping(&shape, &strides) {
                        assert!(distinct, "{shape:?} {strides:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn byte_and_element_strides() {
        assert_eq!(element_strides_from_bytes(&[12, 4], &[2, 3], 4), Ok(vec![3, 1]));
        assert_eq!(element_strides_from_bytes(&[-8], &[2], 4), Ok(vec![-2]));
        assert!(matches!(element_strides_from_bytes(&[6], &[2], 4), Err(Error::StrideNotWhole { axis: 0, byte_stride: 6, itemsize: 4 })));
        assert_eq!(element_strides_from_bytes(&[6], &[1], 4), Ok(vec![0]), "unused stride");
        assert_eq!(element_strides_from_bytes(&[-24, 12, 7], &[2, 2, 1], 12), Ok(vec![-2, 1, 0]), "no power of two");
        assert!(matches!(element_strides_from_bytes(&[4], &[2, 3], 4), Err(Error::StridesLength { .. })));
        assert_eq!(byte_strides(&[3, -1], 8).collect::<Vec<_>>(), vec![24, -8]);
    }

    #[test]
    fn extents() {
        assert_eq!(element_extent(&[2, 3], &[-3, 1]), Some((-3, 2)));
        assert_eq!(element_count(&[2, 0, 5]), Ok(0));
        assert!(element_count(&[i64::MAX, 2]).is_err());
        assert_eq!(byte_extent(0, 2, DataType::FLOAT32, false), Some((0, 12)));
    }
}
