//! One POSIX shared-memory segment mapped into this process: made or opened
//! in `/dev/shm` (as glibc's `shm_open` does), mapped without keeping a file
//! descriptor, unmapped when the last tensor over it goes.

use std::fs::{File, OpenOptions};
use std::io::{self, ErrorKind};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::ptr::NonNull;

use pyo3::exceptions::{PyFileNotFoundError, PyMemoryError, PyOSError, PyValueError};
use pyo3::PyResult;

/// Where Linux keeps POSIX shared memory.
pub(crate) const SHM_DIR: &str = "/dev/shm";

/// A segment's mapping; its bytes live as long as this does.
#[derive(Debug)]
pub(crate) struct Segment {
    pub(crate) name: String,
    /// The bytes tensors use (the mapping holds at least one).
    pub(crate) size: usize,
    base: NonNull<u8>,
    mapped: usize,
    /// The process that made it, which alone unlinks it.
    pub(crate) creator: Option<u32>,
}

// SAFETY: a mapping is plain memory, valid until `Drop` unmaps it; tensors over
// it read and write it under the rules of every tensor (borrows, writability).
unsafe impl Send for Segment {}
// SAFETY: as above; `&Segment` gives only the address.
unsafe impl Sync for Segment {}

impl Segment {
    /// The first byte.
    pub(crate) fn base(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    /// A new segment of `size` bytes, its space reserved, zero-filled. `name`
    /// is called until a free name comes; the file is unlinked again if
    /// anything after its creation fails.
    pub(crate) fn create(size: usize, mut name: impl FnMut() -> String) -> PyResult<Segment> {
        check_size(size)?;
        let (name, file) = loop {
            let name = name();
            let opened = OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).custom_flags(libc::O_NOFOLLOW).open(path(&name));
            match opened {
                Ok(file) => break (name, file),
                Err(err) if err.kind() == ErrorKind::AlreadyExists => continue,
                Err(err) => return Err(os_error(&err, "cannot make a shared-memory segment")),
            }
        };
        let made = reserve(&file, size.max(1)).and_then(|()| map(&file, size.max(1)));
        match made {
            Ok(base) => Ok(Segment { name, size, base, mapped: size.max(1), creator: Some(std::process::id()) }),
            Err(err) => {
                let _ = std::fs::remove_file(path(&name));
                Err(err)
            }
        }
    }

    /// The segment `name`, made by another process (or this one), mapped anew.
    pub(crate) fn open(name: &str, size: usize) -> PyResult<Segment> {
        let file = OpenOptions::new().read(true).write(true).custom_flags(libc::O_NOFOLLOW).open(path(name)).map_err(|err| {
            if err.kind() == ErrorKind::NotFound {
                PyFileNotFoundError::new_err(format!(
                    "shared tensor segment {name:?} no longer exists: the process that created it freed its tensor (or exited) \
                     before this process unpickled the handle"
                ))
            } else {
                os_error(&err, "cannot open a shared-memory segment")
            }
        })?;
        let actual = file.metadata().map_err(|err| os_error(&err, "cannot read a shared-memory segment's size"))?.size();
        if actual < size.max(1) as u64 {
            return Err(PyValueError::new_err(format!("malformed dlbridge shared-memory handle: segment {name:?} holds {actual} bytes, not {size}")));
        }
        let base = map(&file, size.max(1))?;
        Ok(Segment { name: name.to_owned(), size, base, mapped: size.max(1), creator: None })
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: our own mapping of `mapped` bytes, unmapped once; no tensor is
        // left over it (each holds the segment).
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.mapped) };
    }
}

/// The segment's file.
pub(crate) fn path(name: &str) -> String {
    format!("{SHM_DIR}/{name}")
}

/// Removes the segment's name (mappings stay valid); true if it was there.
pub(crate) fn unlink(name: &str) -> bool {
    std::fs::remove_file(path(name)).is_ok()
}

fn os_error(err: &io::Error, what: &str) -> pyo3::PyErr {
    match err.raw_os_error() {
        Some(libc::ENOMEM | libc::ENOSPC) => PyMemoryError::new_err(format!("{what}: {err}")),
        Some(code) => PyOSError::new_err((code, format!("{what}: {err}"))),
        None => PyOSError::new_err(format!("{what}: {err}")),
    }
}

/// Test hook: skip the free-space check, so that the reservation alone must refuse.
#[cfg(feature = "testing")]
pub(crate) static SKIP_FREE_SPACE_CHECK: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);

/// Refuses sizes that cannot fit before anything is made.
fn check_size(size: usize) -> PyResult<()> {
    if size > isize::MAX as usize {
        return Err(PyMemoryError::new_err(format!("a shared tensor of {size} bytes does not fit in this process's address space")));
    }
    #[cfg(feature = "testing")]
    if SKIP_FREE_SPACE_CHECK.load(core::sync::atomic::Ordering::Relaxed) {
        return Ok(());
    }
    let dir = c"/dev/shm";
    // SAFETY: statvfs fills the struct for a NUL-terminated path.
    let mut stat: libc::statvfs = unsafe { core::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::statvfs(dir.as_ptr(), &mut stat) } == 0 {
        let free = u128::from(stat.f_bavail) * u128::from(stat.f_frsize);
        if size as u128 > free {
            return Err(PyMemoryError::new_err(format!("a shared tensor of {size} bytes does not fit in {SHM_DIR}, which has {free} bytes free")));
        }
    }
    Ok(())
}

/// Gives the segment its pages now, as torch does: without them a write past
/// the free space of `/dev/shm` is a SIGBUS, not a MemoryError.
fn reserve(file: &File, size: usize) -> PyResult<()> {
    let len = libc::off_t::try_from(size).map_err(|_| PyMemoryError::new_err(format!("cannot reserve {size} bytes of shared memory")))?;
    // SAFETY: a descriptor we own, a non-negative range.
    match unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len) } {
        0 => Ok(()),
        libc::ENOSPC | libc::EFBIG | libc::ENOMEM => Err(PyMemoryError::new_err(format!("cannot reserve {size} bytes of shared memory: no space left"))),
        // A file system that cannot reserve: a sparse segment.
        libc::EOPNOTSUPP | libc::EINVAL => file.set_len(size as u64).map_err(|err| os_error(&err, "cannot size a shared-memory segment")),
        code => Err(os_error(&io::Error::from_raw_os_error(code), "cannot reserve shared memory")),
    }
}

/// Maps `size` bytes of the file, shared and writable; the file may be closed after.
fn map(file: &File, size: usize) -> PyResult<NonNull<u8>> {
    // SAFETY: a new shared mapping of an open file; the kernel picks the address.
    let address = unsafe { libc::mmap(core::ptr::null_mut(), size, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, file.as_raw_fd(), 0) };
    if address == libc::MAP_FAILED {
        return Err(os_error(&io::Error::last_os_error(), &format!("cannot map {size} bytes of shared memory")));
    }
    NonNull::new(address.cast()).ok_or_else(|| PyOSError::new_err("mmap gave address 0"))
}
