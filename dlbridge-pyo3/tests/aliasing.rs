//! One choke point for Python-reachable memory: every public way to reach it
//! from safe Rust gives either an owner whose typed reads and writes refuse
//! (`Error::Aliased`), or a view under a registry borrow. Each test tried to
//! make a `&mut [u8]` and a `&[u8]` of the same bytes live together; the
//! workspace builds this crate with optimisation, where LLVM relies on
//! `noalias` and such a pair reads stale values.

use dlbridge::Error;
use dlbridge_pyo3::capsule::consume_capsule;
use dlbridge_pyo3::import::{import_array_interface, import_buffer};
use dlbridge_pyo3::{
    from_dlpack, from_dlpack_ready, import_any, import_any_ready, register, AnyOwned, ImportOptions, PyTensor, PyTensorMut, Tensor,
    TensorObject,
};
use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;
use pyo3::types::{IntoPyDict, PyByteArray};

fn with_python<R>(f: impl for<'py> FnOnce(Python<'py>) -> PyResult<R>) -> R {
    Python::initialize();
    Python::attach(|py| f(py).unwrap_or_else(|err| panic!("{err}")))
}

/// Reads `r`, writes `w`, reads `r` again: with `w` and `r` over the same
/// bytes, an optimised build may return the first read twice.
#[inline(never)]
fn write_then_reread(w: &mut [u8], r: &[u8]) -> (u8, u8) {
    let before = r[0];
    w[0] = before.wrapping_add(1);
    (before, r[0])
}

/// Every public import of a bytearray, each refusing typed access on its own.
fn every_import<'py>(py: Python<'py>, data: &Bound<'py, PyAny>) -> PyResult<Vec<(&'static str, AnyOwned)>> {
    let module = PyModule::new(py, "dlbridge_aliasing")?;
    register(&module)?;
    let locals = [("data", data.clone()), ("dlbridge", module.into_any())].into_py_dict(py)?;
    let exporter = py.eval(
        c"type('Exporter', (), {'__array_interface__': {'shape': (len(data),), 'typestr': '|u1', 'version': 3, \
           'data': (__import__('ctypes').addressof((__import__('ctypes').c_char * len(data)).from_buffer(data)), False)}, \
           'data': data})()",
        None,
        Some(&locals),
    )?;
    let capsule = py.eval(c"dlbridge.asarray(data).__dlpack__(max_version=(1, 0))", None, Some(&locals))?;
    let reader: PyTensor<'_> = data.extract()?;
    Ok(vec![
        ("import_buffer", import_buffer(data)?),
        ("import_array_interface", import_array_interface(&exporter)?),
        ("import_any", import_any(data, ImportOptions::default())?),
        ("import_any_ready", import_any_ready(data, ImportOptions::default())?.0),
        ("consume_capsule", consume_capsule(&capsule)?),
        ("PyTensor::into_owned", reader.into_owned()?),
    ])
}

#[test]
fn no_public_import_writes_or_reads_without_a_borrow() {
    with_python(|py| {
        let data = PyByteArray::new(py, &[0u8; 16]);
        for (route, mut owned) in every_import(py, data.as_any())? {
            assert!(owned.is_aliased(), "{route}");
            assert_eq!(owned.view().try_as_bytes().err(), Some(Error::Aliased), "{route}");
            assert_eq!(owned.view().try_as_slice::<u8>().err(), Some(Error::Aliased), "{route}");
            assert_eq!(owned.try_view_mut().err(), Some(Error::Aliased), "{route}");
        }
        // Two imports of one bytearray once gave a `&mut [u8]` and a `&[u8]`
        // of the same bytes from safe code; now a writer excludes any reader.
        let first = import_buffer(data.as_any())?;
        let mut writer: PyTensorMut<'_> = data.as_any().extract()?;
        let mut vm = writer.view_mut()?;
        let w: &mut [u8] = vm.try_as_slice_mut().map_err(dlbridge_pyo3::to_py_err)?;
        let read = first.read(py);
        if let Ok(read) = &read {
            let r = read.view().as_slice::<u8>().expect("u8 bytes");
            let (before, after) = write_then_reread(w, r);
            panic!("&mut and & of the same bytes: read {before}, wrote {}, re-read {after}", before.wrapping_add(1));
        }
        assert!(read.err().is_some_and(|err| err.is_instance_of::<PyBufferError>(py)));
        drop(vm);
        drop(writer);
        // And a reader excludes a writer.
        let read = first.read(py)?;
        let err = data.as_any().extract::<PyTensorMut<'_>>().err().expect("read-borrowed");
        assert!(err.is_instance_of::<PyBufferError>(py), "{err}");
        drop(read);
        Ok(())
    })
}

#[test]
fn an_exclusive_borrow_excludes_every_reader_in_the_process() {
    with_python(|py| {
        let module = PyModule::new(py, "dlbridge_aliasing")?;
        register(&module)?;
        let t = Bound::new(py, TensorObject::from(Tensor::from_vec(vec![0u8; 16], &[16])?))?;
        let bytes = PyByteArray::new(py, &[0u8; 16]);
        let mut x: PyTensorMut<'_> = t.as_any().extract()?;
        let mut y: PyTensorMut<'_> = bytes.as_any().extract()?;
        // The review's routes to `&[u8]` of borrowed bytes, each now refused.
        let refused = |result: PyResult<()>, route: &str| match result {
            Err(err) if err.is_instance_of::<PyBufferError>(py) => Ok(()),
            Err(err) => Err(err),
            Ok(()) => panic!("{route} read bytes that a PyTensorMut borrows"),
        };
        let other = from_dlpack(t.as_any(), ImportOptions::default())?;
        assert_eq!(other.view().as_slice::<u8>(), None);
        refused(other.read(py).map(drop), "from_dlpack(...).read()")?;
        refused(from_dlpack_ready(t.as_any(), ImportOptions::default())?.0.read(py).map(drop), "from_dlpack_ready")?;
        assert_eq!(t.get().view().as_slice::<u8>(), None);
        refused(t.get().read(py).map(drop), "Tensor::read")?;
        refused(t.as_any().extract::<PyTensor<'_>>().map(drop), "PyTensor")?;
        refused(import_any(bytes.as_any(), ImportOptions::default())?.read(py).map(drop), "import_any(bytearray).read()")?;
        // With both writers alone, their writes land.
        let mut vx = x.view_mut()?;
        vx.try_as_slice_mut::<u8>().map_err(dlbridge_pyo3::to_py_err)?[0] = 1;
        let mut vy = y.view_mut()?;
        vy.try_as_slice_mut::<u8>().map_err(dlbridge_pyo3::to_py_err)?[0] = 2;
        drop(vx);
        drop(vy);
        drop(x);
        drop(y);
        assert_eq!(t.get().read(py)?.view().as_slice::<u8>().map(|s| s[0]), Some(1));
        assert_eq!(bytes.to_vec()[0], 2);
        Ok(())
    })
}
