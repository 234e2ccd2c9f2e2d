//! Shapes and strides kept without allocating on the hot paths: [`Dims`],
//! a view's own copy, and [`Small`], a short list of values.

/// A tensor's shape and strides, owned: inline up to 4 axes (the common
/// ranks, kept small because views are moved by value), boxed beyond.
#[derive(Clone, Debug)]
pub(crate) enum Dims {
    /// Shape in `values[..ndim]`, strides in `values[4..4 + ndim]`.
    Inline { ndim: u8, values: [i64; 8] },
    /// Shape, then strides: `2 * ndim` values.
    Heap(Box<[i64]>),
}

impl Dims {
    /// `ndim` axes, all zero.
    pub(crate) fn zeros(ndim: usize) -> Self {
        if ndim <= 4 {
            Dims::Inline { ndim: ndim as u8, values: [0; 8] }
        } else {
            Dims::Heap(vec![0; 2 * ndim].into_boxed_slice())
        }
    }

    /// Copies of `shape` and `strides` (same length).
    pub(crate) fn from_slices(shape: &[i64], strides: &[i64]) -> Self {
        let mut dims = Dims::zeros(shape.len());
        let (s, t) = dims.split_mut();
        s.copy_from_slice(shape);
        t.copy_from_slice(strides);
        dims
    }

    /// Shape and strides, for filling.
    pub(crate) fn split_mut(&mut self) -> (&mut [i64], &mut [i64]) {
        match self {
            Dims::Inline { ndim, values } => {
                let n = usize::from(*ndim);
                let (shape, strides) = values.split_at_mut(4);
                (&mut shape[..n], &mut strides[..n])
            }
            Dims::Heap(values) => {
                let n = values.len() / 2;
                values.split_at_mut(n)
            }
        }
    }

    /// Extent of each axis.
    #[inline]
    pub(crate) fn shape(&self) -> &[i64] {
        match self {
            Dims::Inline { ndim, values } => &values[..usize::from(*ndim)],
            Dims::Heap(values) => &values[..values.len() / 2],
        }
    }

    /// Stride of each axis.
    #[inline]
    pub(crate) fn strides(&self) -> &[i64] {
        match self {
            Dims::Inline { ndim, values } => &values[4..4 + usize::from(*ndim)],
            Dims::Heap(values) => &values[values.len() / 2..],
        }
    }
}

/// Up to 8 values on the stack (every common rank), more on the heap: shapes
/// and strides built on hot paths without allocating.
#[derive(Clone, Debug)]
pub enum Small<T: Copy + Default> {
    /// Up to 8 values, and how many.
    Inline([T; 8], usize),
    /// More than 8.
    Heap(Vec<T>),
}

impl<T: Copy + Default> Default for Small<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Copy + Default> Small<T> {
    /// `make(i)` for `i` in `0..n`, stopping at the first error.
    pub fn try_from_fn<E>(n: usize, mut make: impl FnMut(usize) -> Result<T, E>) -> Result<Self, E> {
        if n <= 8 {
            let mut values = [T::default(); 8];
            for (i, slot) in values[..n].iter_mut().enumerate() {
                *slot = make(i)?;
            }
            Ok(Small::Inline(values, n))
        } else {
            (0..n).map(make).collect::<Result<_, E>>().map(Small::Heap)
        }
    }

    /// `make(i)` for `i` in `0..n`.
    pub fn from_fn(n: usize, mut make: impl FnMut(usize) -> T) -> Self {
        match Self::try_from_fn(n, |i| Ok::<_, core::convert::Infallible>(make(i))) {
            Ok(small) => small,
            Err(never) => match never {},
        }
    }

    /// No values.
    pub fn new() -> Self {
        Small::Inline([T::default(); 8], 0)
    }

    /// A copy of `values`.
    pub fn from_slice(values: &[T]) -> Self {
        Self::from_fn(values.len(), |i| values[i])
    }

    /// Appends a value, moving to the heap past 8.
    pub fn push(&mut self, value: T) {
        match self {
            Small::Inline(values, len) if *len < 8 => {
                values[*len] = value;
                *len += 1;
            }
            Small::Inline(values, len) => {
                let mut heap = values[..*len].to_vec();
                heap.push(value);
                *self = Small::Heap(heap);
            }
            Small::Heap(values) => values.push(value),
        }
    }

    /// The values.
    pub fn as_slice(&self) -> &[T] {
        match self {
            Small::Inline(values, len) => &values[..*len],
            Small::Heap(values) => values,
        }
    }

    /// The values, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        match self {
            Small::Inline(values, len) => &mut values[..*len],
            Small::Heap(values) => values,
        }
    }

    /// The values in a `Vec`.
    pub fn to_vec(&self) -> Vec<T> {
        self.as_slice().to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_values_stay_inline() {
        assert!(matches!(Small::from_fn(8, |i| i as i64), Small::Inline(_, 8)));
        assert_eq!(Small::from_fn(9, |i| i as i64).as_slice(), &[0, 1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(Small::<i64>::try_from_fn(3, |i| if i == 2 { Err(i) } else { Ok(0) }).err(), Some(2));
    }
}
