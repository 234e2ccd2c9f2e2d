//! Reading PTX text as a CUDA 13.0 driver's JIT would: its ISA version, its
//! `.entry` kernels and their parameter types, and the log of a failure.

use crate::kernels::{Param, KNOWN};
use crate::CuResult;

pub(crate) const INVALID_PTX: CuResult = 218;
pub(crate) const UNSUPPORTED_PTX_VERSION: CuResult = 222;
/// The newest PTX ISA a CUDA 13.0 driver (the lent GPU machines' 580) loads.
pub(crate) const NEWEST_ISA: (u32, u32) = (9, 0);

/// `.version X.Y` of PTX text.
fn isa_version(ptx: &str) -> Option<(u32, u32)> {
    let line = ptx.lines().map(str::trim).find(|l| l.starts_with(".version"))?;
    let (major, minor) = line.strip_prefix(".version")?.trim().split_once('.')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// Why a compilation failed: the code, and what the JIT's error log says.
pub(crate) type JitError = (CuResult, String);

pub(crate) fn invalid(why: &str) -> JitError {
    (INVALID_PTX, format!("fake ptxas, line 1; error   : {why}"))
}

/// The `.entry` kernels of PTX text with their parameter types, or INVALID_PTX.
fn entries(ptx: &str) -> Result<Vec<(String, Vec<Param>)>, JitError> {
    if !ptx.lines().any(|l| l.trim_start().starts_with(".target")) {
        return Err(invalid("Missing .target directive"));
    }
    let mut out = Vec::new();
    let mut rest = ptx;
    while let Some(at) = rest.find(".entry ") {
        rest = &rest[at + ".entry ".len()..];
        let open = rest.find('(').ok_or_else(|| invalid("an .entry without parameters"))?;
        let close = rest.find(')').ok_or_else(|| invalid("an .entry's parameters are not closed"))?;
        let name = rest[..open].trim();
        if name.is_empty() || close < open {
            return Err(invalid("an .entry without a name"));
        }
        let params = rest[open + 1..close]
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(|p| p.split_whitespace().nth(1).map(Param::parse).ok_or_else(|| invalid("a .param without a type")))
            .collect::<Result<Vec<_>, _>>()?;
        out.push((name.to_owned(), params));
        rest = &rest[close..];
    }
    Ok(out)
}

/// Compiles PTX text: its entries, or the code and log of the failure.
pub(crate) fn compile(text: &str) -> Result<Vec<(String, Vec<Param>)>, JitError> {
    let version = isa_version(text).ok_or_else(|| invalid("Missing .version directive"))?;
    if version > NEWEST_ISA {
        let message = format!("fake ptxas, line 1; fatal   : Unsupported .version {}.{}; current version is '{}.{}'", version.0, version.1, NEWEST_ISA.0, NEWEST_ISA.1);
        return Err((UNSUPPORTED_PTX_VERSION, message));
    }
    let entries = entries(text)?;
    for (name, params) in &entries {
        if KNOWN.iter().any(|k| k.name == name && k.params != params.as_slice()) {
            return Err(invalid(&format!("the parameters of {name} differ from the fake's model of it")));
        }
    }
    Ok(entries)
}


#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_and_versions_of_ptx() {
        let ptx = ".version 7.0\n.target sm_75\n.visible .entry k(\n\t.param .u64 k_param_0,\n\t.param .f32 k_param_1\n)\n{ ret; }\n\
                   .visible .entry none()\n{ ret; }\n";
        assert_eq!(isa_version(ptx), Some((7, 0)));
        assert_eq!(entries(ptx).map_err(|e| e.0), Ok(vec![("k".to_owned(), vec![Param::U64, Param::F32]), ("none".to_owned(), vec![])]));
        assert_eq!(entries(".version 7.0\n").map_err(|e| e.0), Err(INVALID_PTX), "no .target");
        assert!(compile(".version 9.9\n.target sm_90\n").unwrap_err().1.contains("Unsupported .version 9.9"));
        let shipped = include_str!("../../../examples/cuda_kernel/kernels/scale.ptx");
        assert!(isa_version(shipped).is_some_and(|v| v <= NEWEST_ISA));
        assert_eq!(entries(shipped).map_err(|e| e.0), Ok(vec![("scale_f32".to_owned(), KNOWN[0].params.to_vec())]));
    }
}
