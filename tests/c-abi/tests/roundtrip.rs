//! Tensors crossing the C boundary both ways, with deleter counts.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use dlbridge::OwnedTensor;
use dlbridge_c_abi_tests::{dlb_c_consume_sum, dlb_c_deleted_count, dlb_c_make_tensor};

/// The C deleter counter is global: run these tests one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

#[test]
fn c_produces_rust_consumes() {
    let _guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let before = unsafe { dlb_c_deleted_count() };
    // SAFETY: the C function returns an owned, well-formed tensor.
    let t = unsafe { OwnedTensor::from_raw(dlb_c_make_tensor(2, 3, 0)) }.unwrap();
    assert_eq!(t.view().shape(), &[2, 3]);
    assert_eq!(t.view().as_slice::<f32>().unwrap(), &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    drop(t);
    // SAFETY: plain counter read.
    assert_eq!(unsafe { dlb_c_deleted_count() }, before + 1);

    // Column-major from C: not a slice, but a correct contiguous copy.
    // SAFETY: as above.
    let t = unsafe { OwnedTensor::from_raw(dlb_c_make_tensor(2, 3, 1)) }.unwrap();
    assert!(t.view().as_slice::<f32>().is_none() && t.view().is_f_contiguous());
    let c: OwnedTensor = dlbridge::to_contiguous(t.view()).unwrap();
    assert_eq!(c.view().as_slice::<f32>().unwrap(), &[0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    drop(t);
    // SAFETY: plain counter read.
    assert_eq!(unsafe { dlb_c_deleted_count() }, before + 2);
}

#[test]
fn rust_produces_c_consumes() {
    let _guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    static DROPS: AtomicUsize = AtomicUsize::new(0);
    struct Owner(Vec<f32>);
    impl Drop for Owner {
        fn drop(&mut self) {
            DROPS.fetch_add(1, Ordering::SeqCst);
        }
    }
    impl std::ops::Deref for Owner {
        type Target = [f32];
        fn deref(&self) -> &[f32] {
            &self.0
        }
    }
    impl std::ops::DerefMut for Owner {
        fn deref_mut(&mut self) -> &mut [f32] {
            &mut self.0
        }
    }
    let data: Vec<f32> = (1..=6).map(|v| v as f32).collect();
    // Reversed columns: C must follow the negative stride.
    let t = OwnedTensor::from_owner_mut(Owner(data), &[2, 3], Some(&[3, -1])).unwrap();
    // SAFETY: C takes ownership and calls the deleter exactly once.
    let sum = unsafe { dlb_c_consume_sum(t.into_raw()) };
    assert_eq!(sum, 21.0);
    assert_eq!(DROPS.load(Ordering::SeqCst), 1, "C's call to the deleter dropped the owner once");
}
