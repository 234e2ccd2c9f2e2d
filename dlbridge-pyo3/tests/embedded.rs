//! The PyO3 layer from Rust, with an embedded interpreter: the argument types,
//! the writability rule and the capsule lifecycle, with no third-party library.

use dlbridge::DataType;
use dlbridge_pyo3::{from_dlpack, register, AnyOwned, ImportOptions, PyTensor, PyTensorMut, Tensor, TensorObject, Writability};
use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;
use pyo3::types::{IntoPyDict, PyByteArray, PyBytes};

fn with_python<R>(f: impl for<'py> FnOnce(Python<'py>) -> PyResult<R>) -> R {
    Python::initialize();
    Python::attach(|py| f(py).unwrap_or_else(|err| panic!("{err}")))
}

#[test]
fn writable_argument_writes_into_a_bytearray() {
    with_python(|py| {
        let data = PyByteArray::new(py, &[1, 2, 3]);
        let mut arg: PyTensorMut<'_> = data.as_any().extract()?;
        assert_eq!(arg.view().dtype(), DataType::UINT8);
        arg.view_mut()?.try_as_slice_mut::<u8>().map_err(dlbridge_pyo3::to_py_err)?[0] = 9;
        drop(arg);
        assert_eq!(data.to_vec(), vec![9, 2, 3]);
        Ok(())
    })
}

#[test]
fn writable_argument_refuses_bytes_and_aliases() {
    with_python(|py| {
        let bytes = PyBytes::new(py, b"abcd");
        let err = bytes.as_any().extract::<PyTensorMut<'_>>().err().expect("bytes are immutable");
        assert!(err.is_instance_of::<PyBufferError>(py), "{err}");
        let data = PyByteArray::new(py, &[0; 8]);
        let reader: PyTensor<'_> = data.as_any().extract()?;
        let err = data.as_any().extract::<PyTensorMut<'_>>().err().expect("already borrowed to read");
        assert!(err.to_string().contains("already borrowed as read"), "{err}");
        drop(reader);
        let _writer: PyTensorMut<'_> = data.as_any().extract()?;
        Ok(())
    })
}

#[test]
fn tensor_exports_and_reimports_through_a_capsule() {
    with_python(|py| {
        let module = PyModule::new(py, "dlbridge_embedded")?;
        register(&module)?;
        let t = Bound::new(py, TensorObject::from(Tensor::from_vec(vec![1i32, 2, 3, 4, 5, 6], &[2, 3])?))?;
        let capsule = t.call_method("__dlpack__", (), Some(&[("max_version", (1, 3))].into_py_dict(py)?))?;
        let owned = from_dlpack(&capsule, ImportOptions::default())?;
        assert!(matches!(owned, AnyOwned::Versioned(_)));
        assert_eq!(owned.view().as_slice::<i32>(), None, "reachable from Python: read under a borrow");
        assert_eq!(owned.read(py)?.view().as_slice::<i32>(), Some(&[1, 2, 3, 4, 5, 6][..]));
        assert_eq!(owned.view().as_ptr(), t.get().view().as_ptr(), "zero-copy");
        assert!(from_dlpack(&capsule, ImportOptions::default()).is_err(), "a capsule is consumed once");
        // A legacy export re-imported has unknown writability, relayed as read-only.
        let legacy = t.call_method0("__dlpack__")?;
        let relayed = Tensor::new(from_dlpack(&legacy, ImportOptions::default())?);
        assert_eq!(relayed.writability(), Writability::Unknown);
        assert!(relayed.readonly());
        Ok(())
    })
}

#[test]
fn imports_from_python_cannot_be_written_without_an_exclusive_borrow() {
    with_python(|py| {
        let data = PyByteArray::new(py, &[0; 4]);
        let mut first = dlbridge_pyo3::import_any(data.as_any(), Default::default())?;
        let mut second = dlbridge_pyo3::import_any(data.as_any(), Default::default())?;
        assert!(matches!(first.try_view_mut(), Err(dlbridge::Error::Aliased)));
        assert!(matches!(second.try_view_mut(), Err(dlbridge::Error::Aliased)));
        let reader: PyTensor<'_> = data.as_any().extract()?;
        assert!(matches!(reader.into_owned()?.try_view_mut(), Err(dlbridge::Error::Aliased)));
        Ok(())
    })
}

/// A stream value for tensors no driver ever sees (host memory labelled CUDA).
fn stream(value: i64) -> dlbridge::streams::Stream {
    // SAFETY: handed to a driver only where none is present (checked by the tests).
    unsafe { dlbridge::streams::Stream::from_raw(value) }
}

/// A dlbridge `Tensor` over host memory labelled `cuda:0`: carried, never read.
fn cuda_labelled_tensor() -> PyResult<Tensor> {
    let data = vec![0f32; 4];
    let ptr = data.as_ptr().cast_mut().cast();
    let layout = dlbridge::export::RawLayout { dtype: DataType::FLOAT32, device: dlbridge::Device::cuda(0), shape: &[4], strides: None, byte_offset: 0 };
    // SAFETY: the Vec owns the bytes for as long as the tensor lives (moving it keeps its heap buffer).
    let owned: dlbridge::OwnedTensor = unsafe { dlbridge::export::export_raw(data, ptr, layout, 0) }.map_err(dlbridge_pyo3::to_py_err)?;
    Ok(Tensor::new(owned))
}

#[test]
fn an_extension_extracts_a_tensor_on_its_own_stream() {
    with_python(|py| {
        let module = PyModule::new(py, "dlbridge_embedded")?;
        register(&module)?;
        let locals = [("inner", Bound::new(py, TensorObject::from(cuda_labelled_tensor()?))?.into_any())].into_py_dict(py)?;
        py.run(
            c"class Producer:\n    def __init__(self, inner):\n        self.inner, self.streams = inner, []\n    def __dlpack_device__(self):\n        return (2, 0)\n    def __dlpack__(self, stream=None, **kw):\n        self.streams.append(stream)\n        return self.inner.__dlpack__(stream=-1, max_version=(1, 3))\np = Producer(inner)\n",
            None,
            Some(&locals),
        )?;
        let p = locals.get_item("p")?.expect("p");
        let x = <PyTensor>::extract_on_stream(&p, stream(7))?;
        assert_eq!(x.ready_stream(), Some(7), "the producer ordered its work before stream 7");
        drop(x);
        let x: PyTensor<'_> = p.extract()?;
        assert_eq!(x.ready_stream(), Some(1), "by default, the legacy default stream");
        drop(x);
        let y = <PyTensorMut>::extract_on_stream(&p, stream(9))?;
        assert_eq!(y.ready_stream(), Some(9));
        drop(y);
        let streams: Vec<i64> = p.getattr("streams")?.extract()?;
        assert_eq!(streams, vec![7, 1, 9]);

        // Our own Tensor is borrowed directly, ready on the legacy stream unless
        // another is asked for, which must then wait for it.
        let legacy = Some(dlbridge::streams::Stream::CUDA_LEGACY);
        let ours = Bound::new(py, TensorObject::from(cuda_labelled_tensor()?.with_ready_stream(legacy)?))?;
        assert_eq!(ours.extract::<PyTensor<'_>>()?.ready_stream(), Some(1));
        assert_eq!(<PyTensor>::extract_on_stream(ours.as_any(), stream(1))?.ready_stream(), Some(1));
        assert_eq!(<PyTensor>::extract_on_stream(ours.as_any(), dlbridge::streams::Stream::NO_SYNC)?.ready_stream(), None);
        if dlbridge::cuda::driver_available().is_err() {
            let err = <PyTensor>::extract_on_stream(ours.as_any(), stream(7)).err().expect("an event needs the driver");
            assert!(err.to_string().contains("CUDA is not available"), "{err}");
            // No other handle is kept: work pending on it is kept as an event, which needs the driver.
            let err = cuda_labelled_tensor()?.with_ready_stream(Some(stream(5))).err().expect("an event needs the driver");
            assert!(err.to_string().contains("CUDA is not available"), "{err}");
        }
        let inner = locals.get_item("inner")?.expect("inner");
        assert_eq!(<PyTensor>::extract_on_stream(&inner, stream(7))?.ready_stream(), None, "nothing to wait for");
        // An idle tensor lent without a stream: the legacy one, which it keeps as its data's stream
        // from then on, so that its later exports wait for what the extension queues there.
        assert_eq!(inner.extract::<PyTensor<'_>>()?.ready_stream(), Some(1), "the legacy stream, kept");
        assert_eq!(inner.extract::<PyTensor<'_>>()?.ready_stream(), Some(1));

        // CPU memory has no streams.
        let bytes = PyByteArray::new(py, &[1, 2]);
        let err = <PyTensor>::extract_on_stream(bytes.as_any(), stream(7)).err().expect("no streams on the CPU");
        assert!(err.is_instance_of::<pyo3::exceptions::PyValueError>(py), "{err}");
        assert_eq!(bytes.as_any().extract::<PyTensor<'_>>()?.ready_stream(), None);
        Ok(())
    })
}

/// A typed argument refuses elements it cannot read as its type: bytes that
/// are no `bool` (contiguous, and strided, which is checked element by
/// element) and misaligned `f32`s, with a TypeError naming the argument's type.
#[test]
fn typed_arguments_refuse_invalid_bools_and_misaligned_elements() {
    with_python(|py| {
        let locals = [("data", PyBytes::new(py, &[0, 1, 2, 0]))].into_py_dict(py)?;
        let cast = |expr: &str| py.eval(&std::ffi::CString::new(expr).unwrap(), None, Some(&locals));
        let refusal = |obj: &Bound<'_, PyAny>| obj.extract::<PyTensor<'_, bool>>().err().map(|e| e.to_string());

        let valid: PyTensor<'_, bool> = cast("memoryview(data).cast('?')[:2]")?.extract()?;
        assert_eq!(valid.view().len(), 2);
        drop(valid);
        for expr in ["memoryview(data).cast('?')", "memoryview(data).cast('?')[::2]"] {
            let message = refusal(&cast(expr)?).unwrap_or_else(|| panic!("{expr}: a byte 2 is no bool"));
            assert!(message.starts_with("TypeError: expected a bool tensor"), "{expr}: {message}");
        }
        let strided_valid = cast("memoryview(data).cast('?')[::3]")?; // bytes 0 and 0
        assert!(refusal(&strided_valid).is_none());

        let misaligned = py.eval(c"memoryview(bytearray(20))[1:17].cast('f')", None, None)?;
        let message = misaligned.extract::<PyTensor<'_, f32>>().err().expect("misaligned f32").to_string();
        assert!(message.starts_with("TypeError: expected a float32 tensor"), "{message}");
        Ok(())
    })
}
