//! The kernels the fake can run, by their PTX entry name: their parameters
//! and what they do, in Rust, on the host memory that stands in for a device's.

/// A kernel parameter's PTX type, by its size.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Param {
    U64,
    F32,
    Other(usize),
}

impl Param {
    pub(crate) fn parse(ty: &str) -> Param {
        match ty {
            ".u64" | ".s64" | ".b64" => Param::U64,
            ".f32" => Param::F32,
            ".u32" | ".s32" | ".b32" => Param::Other(4),
            ".f64" => Param::Other(8),
            ".u16" | ".s16" | ".b16" | ".f16" => Param::Other(2),
            _ => Param::Other(1),
        }
    }

    pub(crate) fn size(self) -> usize {
        match self {
            Param::U64 => 8,
            Param::F32 => 4,
            Param::Other(n) => n,
        }
    }
}

/// A kernel the fake can run: its entry name, parameters, and what it does.
pub(crate) struct Known {
    pub(crate) name: &'static str,
    pub(crate) params: &'static [Param],
    /// The bytes it reads and writes, from its parameters: `(address, len)`.
    pub(crate) touches: fn(&[u8]) -> Vec<(usize, usize)>,
    /// Runs the whole grid, from its parameters and the grid's total x threads.
    pub(crate) run: fn(&[u8], u64),
}

fn u64_at(params: &[u8], index: usize) -> u64 {
    u64::from_ne_bytes(params[index * 8..index * 8 + 8].try_into().unwrap_or_default())
}

fn f32_at(params: &[u8], offset: usize) -> f32 {
    f32::from_ne_bytes(params[offset..offset + 4].try_into().unwrap_or_default())
}

/// examples/cuda_kernel's `scale_f32(const float* x, float* out, u64 n, float factor)`:
/// `out[i] = x[i] * factor` for `i < n`, by a grid-stride loop over `threads`.
fn scale_f32_touches(p: &[u8]) -> Vec<(usize, usize)> {
    let n = u64_at(p, 2) as usize;
    vec![(u64_at(p, 0) as usize, n.saturating_mul(4)), (u64_at(p, 1) as usize, n.saturating_mul(4))]
}

fn scale_f32_run(p: &[u8], threads: u64) {
    let (x, out, n, factor) = (u64_at(p, 0) as *const f32, u64_at(p, 1) as *mut f32, u64_at(p, 2), f32_at(p, 24));
    for thread in 0..threads {
        let mut i = thread;
        while i < n {
            // SAFETY: checked at the launch to be memory of the device (see `touches`),
            // which stays allocated until the work has run.
            unsafe { out.add(i as usize).write_unaligned(x.add(i as usize).read_unaligned() * factor) };
            i += threads;
        }
    }
}

pub(crate) const KNOWN: &[Known] = &[Known {
    name: "scale_f32",
    params: &[Param::U64, Param::U64, Param::U64, Param::F32],
    touches: scale_f32_touches,
    run: scale_f32_run,
}];

