//! Compiles the C side against the real `dlpack.h`.
//!
//! The header comes from `$DLPACK_INCLUDE_DIR`, or else from the `apache-tvm-ffi`
//! wheel in the Python that `./dev` set up. A missing header is a build error,
//! never a silent skip: the layout check must be able to fail.
use std::path::PathBuf;
use std::process::Command;

fn header_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("DLPACK_INCLUDE_DIR") {
        return dir.into();
    }
    let home = std::env::var("HOME").unwrap_or_default();
    let cache = std::env::var("DLBRIDGE_CACHE").unwrap_or(format!("{home}/.cache/dlbridge"));
    let pythons = [format!("{cache}/venv/bin/python"), "python3".to_owned()];
    let script = "import importlib.util,os; s=importlib.util.find_spec('tvm_ffi'); print(os.path.join(os.path.dirname(s.origin),'include'))";
    for python in pythons {
        if let Ok(out) = Command::new(&python).args(["-c", script]).output() {
            let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
            if out.status.success() && dir.join("dlpack/dlpack.h").is_file() {
                return dir;
            }
        }
    }
    panic!(
        "dlpack.h not found: set DLPACK_INCLUDE_DIR, or run `./dev venv` to install apache-tvm-ffi, whose wheel ships it"
    );
}

fn main() {
    let include = header_dir();
    println!("cargo:rerun-if-env-changed=DLPACK_INCLUDE_DIR");
    println!("cargo:rerun-if-changed=c/layout.c");
    println!("cargo:rerun-if-changed=c/roundtrip.c");
    println!("cargo:rerun-if-changed={}", include.join("dlpack/dlpack.h").display());
    println!("cargo:rustc-env=DLPACK_HEADER={}", include.join("dlpack/dlpack.h").display());
    cc::Build::new()
        .include(&include)
        .file("c/layout.c")
        .file("c/roundtrip.c")
        .warnings(true)
        .extra_warnings(true)
        .compile("dlbridge_c_side");
}
