//! What a typed argument asks of a tensor, in its type: the element type, the
//! rank, the device and the layout, each with an "any" that asks nothing.
//!
//! ```text
//! PyTensor<'py, f32, Ix2, Cpu, CContiguous>   // a float32 2-d C-contiguous CPU tensor
//! PyTensorMut<'py, f32>                        // any float32 tensor, to write
//! PyTensor<'py>                                // anything (AnyDtype, AnyRank, AnyDevice, AnyLayout)
//! ```
//!
//! A mismatch is a TypeError at extraction, which PyO3 reports against the
//! argument, naming what was expected and what came.

use dlbridge::{DataType, Device, DeviceType, Element, Error, TensorView};

mod sealed {
    pub trait Sealed {}
}

/// The element type a typed argument asks for: any [`Element`] (`f32`,
/// `i64`, `half::bf16`, ...), or [`AnyDtype`].
pub trait Dtype: sealed::Sealed {
    /// The dtype asked for; `None` for any.
    const DTYPE: Option<DataType>;

    /// Checks that `view`'s elements (of this dtype) can be read as this type:
    /// aligned and, in host memory, valid values (a `bool` byte is 0 or 1).
    /// `view` is readable: taken under a registry borrow.
    fn check_elements(view: &TensorView<'_>) -> Result<(), Error>;
}

/// Any dtype: the tensor is not read through a Rust type.
#[derive(Debug)]
pub enum AnyDtype {}

impl sealed::Sealed for AnyDtype {}
impl Dtype for AnyDtype {
    const DTYPE: Option<DataType> = None;
    fn check_elements(_: &TensorView<'_>) -> Result<(), Error> {
        Ok(())
    }
}

impl<T: Element> sealed::Sealed for T {}
impl<T: Element> Dtype for T {
    const DTYPE: Option<DataType> = Some(T::DTYPE);
    #[inline(always)]
    fn check_elements(view: &TensorView<'_>) -> Result<(), Error> {
        let align = core::mem::align_of::<T>();
        if view.is_empty() {
            return Ok(());
        }
        if view.as_ptr() as usize % align != 0 {
            return Err(Error::Misaligned { address: view.as_ptr() as usize, align });
        }
        if T::DTYPE != DataType::BOOL || !view.device().is_cpu_accessible() {
            return Ok(());
        }
        check_bools::<T>(view)
    }
}

/// Whether every byte of a host-readable `bool` view is a valid `bool`.
#[inline(never)]
fn check_bools<T: Element>(view: &TensorView<'_>) -> Result<(), Error> {
    let valid = match view.try_as_bytes() {
        Ok(bytes) => T::bit_patterns_valid(bytes),
        // Strided: one byte per element, read at each index.
        Err(_) => every_byte(view, |b| T::bit_patterns_valid(&[b])),
    };
    if valid { Ok(()) } else { Err(Error::InvalidValues { dtype: T::DTYPE }) }
}

/// Whether `ok` holds for the first byte of every element of a strided,
/// host-readable view (as for one-byte dtypes).
fn every_byte(view: &TensorView<'_>, ok: impl Fn(u8) -> bool) -> bool {
    let (shape, strides) = (view.shape(), view.strides());
    let mut index = vec![0i64; shape.len()];
    let base = view.as_ptr().cast::<u8>();
    for _ in 0..view.len() {
        let offset: i64 = index.iter().zip(strides).map(|(i, s)| i * s).sum();
        // SAFETY: an index within the shape reaches an element of the validated
        // layout, which is readable host memory (the caller's view).
        if !ok(unsafe { base.offset(offset as isize).read() }) {
            return false;
        }
        for axis in (0..shape.len()).rev() {
            index[axis] += 1;
            if index[axis] < shape[axis] {
                break;
            }
            index[axis] = 0;
        }
    }
    true
}

/// The rank a typed argument asks for: an `ndarray` dimension (`Ix1`, `Ix2`,
/// ..., `IxDyn` for any) with the `ndarray` feature, or [`AnyRank`].
pub trait Rank {
    /// The number of axes asked for; `None` for any.
    const NDIM: Option<usize>;
}

/// Any rank.
#[derive(Debug)]
pub enum AnyRank {}

impl Rank for AnyRank {
    const NDIM: Option<usize> = None;
}

#[cfg(feature = "ndarray")]
impl<D: ndarray::Dimension> Rank for D {
    const NDIM: Option<usize> = D::NDIM;
}

/// Where a typed argument's memory must live.
pub trait DeviceKind: sealed::Sealed {
    /// What the error message calls it; empty for any.
    const NAME: &'static str;
    /// Whether memory on `device` qualifies.
    fn accepts(device: Device) -> bool;
}

/// Any device.
#[derive(Debug)]
pub enum AnyDevice {}
/// Memory the CPU can read (CPU, CUDA pinned and managed memory): the
/// argument's data is then host-readable, as slices and `ndarray` views.
#[derive(Debug)]
pub enum Cpu {}
/// CUDA device or managed memory: the argument gives a device pointer, its
/// device and the stream its data is ready on, for kernels.
#[derive(Debug)]
pub enum Cuda {}

impl sealed::Sealed for AnyDevice {}
impl sealed::Sealed for Cpu {}
impl sealed::Sealed for Cuda {}

impl DeviceKind for AnyDevice {
    const NAME: &'static str = "";
    fn accepts(_: Device) -> bool {
        true
    }
}

impl DeviceKind for Cpu {
    const NAME: &'static str = "CPU";
    fn accepts(device: Device) -> bool {
        device.is_cpu_accessible()
    }
}

impl DeviceKind for Cuda {
    const NAME: &'static str = "CUDA";
    fn accepts(device: Device) -> bool {
        matches!(device.device_type, DeviceType::CUDA | DeviceType::CUDA_MANAGED)
    }
}

/// The memory layout a typed argument asks for.
pub trait LayoutKind: sealed::Sealed {
    /// What the error message calls it; empty for any.
    const NAME: &'static str;
    /// Whether `view` is laid out so.
    fn accepts(view: &TensorView<'_>) -> bool;
}

/// Any layout: strided, negative or zero strides included.
#[derive(Debug)]
pub enum AnyLayout {}
/// Row-major with no gaps: the argument also gives a plain slice.
#[derive(Debug)]
pub enum CContiguous {}
/// Column-major with no gaps.
#[derive(Debug)]
pub enum FContiguous {}

impl sealed::Sealed for AnyLayout {}
impl sealed::Sealed for CContiguous {}
impl sealed::Sealed for FContiguous {}

impl LayoutKind for AnyLayout {
    const NAME: &'static str = "";
    fn accepts(_: &TensorView<'_>) -> bool {
        true
    }
}

impl LayoutKind for CContiguous {
    const NAME: &'static str = "C-contiguous";
    fn accepts(view: &TensorView<'_>) -> bool {
        view.is_c_contiguous()
    }
}

impl LayoutKind for FContiguous {
    const NAME: &'static str = "F-contiguous";
    fn accepts(view: &TensorView<'_>) -> bool {
        view.is_f_contiguous()
    }
}

/// The tensor a typed argument asks for, in words: "a float32 2-d
/// C-contiguous CPU tensor".
pub(crate) fn expected<T: Dtype, D: Rank, Dev: DeviceKind, L: LayoutKind>() -> String {
    let rank = D::NDIM.map(|n| format!("{n}-d"));
    let dtype = T::DTYPE.map(|d| d.to_string());
    let words: Vec<&str> = [dtype.as_deref(), rank.as_deref(), Some(L::NAME), Some(Dev::NAME)]
        .into_iter()
        .flatten()
        .filter(|w| !w.is_empty())
        .collect();
    crate::convert::with_article(format!("{} tensor", words.join(" ")).trim_start())
}

/// Why `view` is not what the argument asks for, or `None` when it is.
#[inline(always)]
pub(crate) fn mismatch<T: Dtype, D: Rank, Dev: DeviceKind, L: LayoutKind>(view: &TensorView<'_>) -> Option<&'static str> {
    if T::DTYPE.is_some_and(|d| d != view.dtype()) {
        return Some("dtype");
    }
    if D::NDIM.is_some_and(|n| n != view.ndim()) {
        return Some("rank");
    }
    if !Dev::accepts(view.device()) {
        return Some("device");
    }
    if !L::accepts(view) {
        return Some("layout");
    }
    None
}
