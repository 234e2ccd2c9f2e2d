//! Builds the table as a free-threaded interpreter's extension does: with its mutex.
fn main() {
    println!("cargo:rustc-check-cfg=cfg(Py_GIL_DISABLED)");
    println!("cargo:rustc-cfg=Py_GIL_DISABLED");
}
