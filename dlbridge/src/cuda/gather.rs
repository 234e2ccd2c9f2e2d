//! Copies of a strided view's elements alone, planned without the driver.
//!
//! A thin view of a big tensor (`x[:, :1]` of 50000 x 50000) spans a byte
//! extent far larger than its elements; copying that extent costs its size in
//! memory and time. Instead the elements are gathered, as rows of contiguous
//! bytes (2-D copies), into a compact buffer: axes of extent 1 and broadcast
//! axes (stride 0) are left out, reversed axes are read forwards, and the
//! others are ordered by stride, outermost first. The buffer holds one place
//! per index of the axes kept.

/// One 2-D copy: `height` rows of `width` bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Rows {
    /// Offset of the first row in the source, in bytes from element 0.
    pub(crate) src: isize,
    /// Offset of the first row in the compact buffer, in bytes.
    pub(crate) dst: usize,
    pub(crate) width: usize,
    pub(crate) height: usize,
    pub(crate) src_pitch: usize,
    pub(crate) dst_pitch: usize,
}

/// A planned gather.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Gather {
    pub(crate) copies: Vec<Rows>,
    /// Bytes of the compact buffer.
    pub(crate) len: usize,
    /// Each axis's stride in the compact buffer, in elements (0 for broadcast axes).
    pub(crate) strides: Vec<i64>,
    /// Element 0's offset in the compact buffer, in elements.
    pub(crate) first: usize,
    /// Whether every index has an element of its own there (no broadcast axis).
    pub(crate) distinct: bool,
}

/// The largest pitch a 2-D copy takes (`CU_DEVICE_ATTRIBUTE_MAX_PITCH` of current GPUs).
pub(crate) const MAX_PITCH: usize = i32::MAX as usize;

/// Plans the gather of a non-empty view of `shape` and element `strides`, of
/// `itemsize`-byte elements, in at most `max_copies` 2-D copies; `None` when
/// it would take more, or for an empty view.
pub(crate) fn plan(shape: &[i64], strides: &[i64], itemsize: usize, max_copies: usize) -> Option<Gather> {
    if shape.contains(&0) || itemsize == 0 {
        return None;
    }
    // (axis, extent, |stride|) of the axes kept, outermost (largest stride) first.
    let mut kept: Vec<(usize, usize, usize)> = (0..shape.len())
        .filter(|&a| shape[a] > 1 && strides[a] != 0)
        .map(|a| (a, shape[a] as usize, strides[a].unsigned_abs() as usize))
        .collect();
    kept.sort_by_key(|&(_, _, stride)| core::cmp::Reverse(stride));
    // Element 0 of the gather: the lowest element (reversed axes at their end).
    let base: isize = (0..shape.len()).filter(|&a| strides[a] < 0 && shape[a] > 1).map(|a| (shape[a] - 1) as isize * strides[a] as isize).sum();
    let n = kept.len();
    let mut compact = vec![1usize; n];
    for k in (0..n.saturating_sub(1)).rev() {
        compact[k] = compact[k + 1].checked_mul(kept[k + 1].1)?;
    }
    let elements = kept.first().map_or(Some(1), |&(_, extent, _)| compact[0].checked_mul(extent))?;
    // The innermost run of contiguous elements: the rows' width.
    let (mut run, mut outer) = (1usize, n);
    if n > 0 && kept[n - 1].2 == 1 {
        run = kept[n - 1].1;
        outer = n - 1;
        while outer > 0 && kept[outer - 1].2 == run {
            run = run.checked_mul(kept[outer - 1].1)?;
            outer -= 1;
        }
    }
    let width = run.checked_mul(itemsize)?;
    // The innermost of the other axes gives the rows, unless its pitch cannot
    // (rows that overlap, or a pitch over the limit): then each row is a copy.
    let by_rows = outer > 0 && {
        let pitch = kept[outer - 1].2.saturating_mul(itemsize);
        pitch >= width && pitch <= MAX_PITCH && width <= MAX_PITCH
    };
    let looped = if by_rows { outer - 1 } else { outer };
    let count = kept[..looped].iter().try_fold(1usize, |acc, &(_, extent, _)| acc.checked_mul(extent))?;
    if count > max_copies {
        return None;
    }
    let (height, src_pitch, dst_pitch) = if by_rows {
        (kept[outer - 1].1, kept[outer - 1].2 * itemsize, compact[outer - 1] * itemsize)
    } else {
        (1, width, width)
    };
    let mut copies = Vec::with_capacity(count);
    let mut index = vec![0usize; looped];
    for _ in 0..count {
        let src: isize = base + (0..looped).map(|k| (index[k] * kept[k].2) as isize).sum::<isize>();
        let dst: usize = (0..looped).map(|k| index[k] * compact[k]).sum();
        copies.push(Rows { src: src * itemsize as isize, dst: dst * itemsize, width, height, src_pitch, dst_pitch });
        for k in (0..looped).rev() {
            index[k] += 1;
            if index[k] < kept[k].1 {
                break;
            }
            index[k] = 0;
        }
    }
    let mut out_strides = vec![0i64; shape.len()];
    let mut first = 0usize;
    for (k, &(axis, extent, _)) in kept.iter().enumerate() {
        out_strides[axis] = if strides[axis] < 0 { -(compact[k] as i64) } else { compact[k] as i64 };
        if strides[axis] < 0 {
            first += (extent - 1) * compact[k];
        }
    }
    // An axis of extent 1 takes the stride a row-major layout would give it.
    let mut inner = 1i64;
    for a in (0..shape.len()).rev() {
        if shape[a] == 1 {
            out_strides[a] = inner;
        }
        inner = inner.saturating_mul(shape[a].max(1));
    }
    let distinct = (0..shape.len()).all(|a| shape[a] <= 1 || strides[a] != 0);
    Some(Gather { copies, len: elements.checked_mul(itemsize)?, strides: out_strides, first, distinct })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes a plan gathers from `source` (element 0 at `zero`), as the driver would copy them.
    fn run(g: &Gather, source: &[u8], zero: usize) -> Vec<u8> {
        let mut out = vec![0u8; g.len];
        for c in &g.copies {
            for row in 0..c.height {
                let s = (zero as isize + c.src) as usize + row * c.src_pitch;
                let d = c.dst + row * c.dst_pitch;
                out[d..d + c.width].copy_from_slice(&source[s..s + c.width]);
            }
        }
        out
    }

    /// The element a view of `shape`/`strides` (element 0 at `zero`) holds at `index`.
    fn at(source: &[u8], zero: usize, strides: &[i64], index: &[usize]) -> u8 {
        source[(zero as i64 + index.iter().zip(strides).map(|(&i, &s)| i as i64 * s).sum::<i64>()) as usize]
    }

    fn check_every_index(shape: &[i64], strides: &[i64], zero: usize) -> Gather {
        let source: Vec<u8> = (0..=255u8).cycle().take(4096).collect();
        let g = plan(shape, strides, 1, 1 << 20).expect("a plan");
        let out = run(&g, &source, zero);
        let total: usize = shape.iter().map(|&d| d as usize).product();
        for flat in 0..total {
            let mut index = vec![0usize; shape.len()];
            let mut rest = flat;
            for a in (0..shape.len()).rev() {
                index[a] = rest % shape[a] as usize;
                rest /= shape[a] as usize;
            }
            let place = g.first as i64 + index.iter().zip(&g.strides).map(|(&i, &s)| i as i64 * s).sum::<i64>();
            assert_eq!(out[place as usize], at(&source, zero, strides, &index), "{shape:?} {strides:?} at {index:?}");
        }
        g
    }

    #[test]
    fn a_thin_column_is_one_copy_of_its_elements() {
        // x[:, :1] of a 1000 x 1000: one 2-D copy of 1000 one-element rows.
        let g = plan(&[1000, 1], &[1000, 1], 4, 16).unwrap();
        assert_eq!(g.copies, vec![Rows { src: 0, dst: 0, width: 4, height: 1000, src_pitch: 4000, dst_pitch: 4 }]);
        assert_eq!((g.len, g.strides.clone(), g.first, g.distinct), (4000, vec![1, 1], 0, true));
        // x[:, :3]: rows of three elements.
        let g = plan(&[1000, 3], &[1000, 1], 4, 16).unwrap();
        assert_eq!((g.copies.len(), g.copies[0].width, g.copies[0].height, g.len), (1, 12, 1000, 12_000));
    }

    #[test]
    fn layouts_gather_every_element_to_its_place() {
        check_every_index(&[4, 3], &[10, 2], 0);
        check_every_index(&[4, 3], &[-10, 1], 30); // reversed rows
        check_every_index(&[3, 4], &[1, 10], 0); // a transposed thin view
        check_every_index(&[2, 3, 4], &[100, 1, 20], 0);
        check_every_index(&[2, 3, 4], &[-200, 30, -2], 206);
        check_every_index(&[5], &[-7], 28);
        check_every_index(&[3, 3], &[1, 1], 0); // overlapping rows: one copy per row
        check_every_index(&[1, 1], &[0, 0], 5);
    }

    #[test]
    fn a_broadcast_is_gathered_once_and_said_so() {
        let g = check_every_index(&[4, 3], &[0, 1], 0);
        assert_eq!((g.len, g.strides.clone(), g.distinct), (3, vec![0, 1], false));
    }

    #[test]
    fn too_many_copies_or_nothing_to_copy() {
        assert_eq!(plan(&[100, 100, 1], &[1000, 10, 1], 4, 99), None);
        assert!(plan(&[100, 100, 1], &[1000, 10, 1], 4, 100).is_some());
        assert_eq!(plan(&[0, 5], &[5, 1], 4, 10), None);
    }

    #[test]
    fn a_pitch_over_the_limit_is_copied_row_by_row() {
        let g = plan(&[3, 2], &[1 << 30, 1], 4, 10).unwrap();
        assert_eq!(g.copies.len(), 3);
        assert!(g.copies.iter().all(|c| c.height == 1 && c.width == 8));
    }
}
