//! The shim's own host pages for memory the device maps (the results ring): a host that resets
//! its device or tears its runtime down frees what the vendor runtime allocated, while the
//! poller and the exit drain read the ring without a vendor call. Pages the shim mapped and only
//! registered with the runtime stay readable whatever the runtime does (cuda.rs, hip/mod.rs).

use super::DeviceError;
use std::ffi::c_void;
use std::ptr::NonNull;

/// A private anonymous mapping, page-aligned (as `cuMemHostRegister` and `hipHostRegister`
/// want) and zero-filled: the pages of a mapped host allocation.
pub(crate) struct HostPages {
    ptr: NonNull<u8>,
    len: usize,
}

impl HostPages {
    /// `bytes` rounded up to whole pages; None if that overflows.
    pub(crate) fn rounded(bytes: usize) -> Option<usize> {
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096).max(4096);
        bytes.div_ceil(page).checked_mul(page)
    }

    pub(crate) fn new(bytes: usize) -> Result<HostPages, DeviceError> {
        let len = Self::rounded(bytes).filter(|&len| len > 0).ok_or_else(|| {
            DeviceError::Unsupported(format!("cannot map {bytes} bytes for mapped host memory"))
        })?;
        // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(DeviceError::Unsupported(format!(
                "mmap of {len} bytes for mapped host memory failed: {}",
                std::io::Error::last_os_error()
            )));
        }
        let ptr = NonNull::new(p.cast::<u8>())
            .ok_or_else(|| DeviceError::Unsupported("mmap gave address 0 for mapped host memory".into()))?;
        Ok(HostPages { ptr, len })
    }

    pub(crate) fn as_ptr(&self) -> *mut c_void {
        self.ptr.as_ptr().cast()
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Hands the mapping over to a [`MappedHost`], whose owner unmaps it with [`Self::unmap`].
    pub(crate) fn into_raw(self) -> *mut u8 {
        let p = self.ptr.as_ptr();
        std::mem::forget(self);
        p
    }

    /// Gives up the mapping without unmapping it (HIP may still hold it registered).
    pub(crate) fn leak(self) {
        std::mem::forget(self);
    }

    /// # Safety
    /// `ptr` came from [`HostPages::into_raw`] of a mapping made for `bytes` bytes, and nothing
    /// uses it afterwards.
    pub(crate) unsafe fn unmap(ptr: *mut u8, bytes: usize) {
        if let Some(len) = Self::rounded(bytes) {
            // SAFETY: per this function's contract; the length rounds as in `new`.
            unsafe { libc::munmap(ptr.cast(), len) };
        }
    }
}

impl Drop for HostPages {
    fn drop(&mut self) {
        // SAFETY: the mapping is ours and not handed over (into_raw and leak forget self).
        unsafe { libc::munmap(self.as_ptr(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page() -> usize {
        // SAFETY: sysconf has no preconditions.
        usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap().max(4096)
    }

    /// Whether any page of [ptr, ptr + len) is mapped (mincore fails with ENOMEM on a hole).
    fn mapped(ptr: *mut u8, len: usize) -> bool {
        let mut residency = vec![0u8; len.div_ceil(page())];
        // SAFETY: mincore only inspects the page tables and writes one byte per page.
        unsafe { libc::mincore(ptr.cast(), len, residency.as_mut_ptr()) == 0 }
    }

    #[test]
    fn ring_pages_are_whole_zeroed_page_aligned_mappings() {
        let page = page();
        for bytes in [1usize, page - 1, page, page + 1, 3 * page + 5] {
            let pages = HostPages::new(bytes).unwrap();
            assert_eq!(pages.len(), bytes.div_ceil(page) * page, "{bytes}");
            assert_eq!(pages.as_ptr() as usize % page, 0, "{bytes}");
            // SAFETY: the mapping is `len` bytes, readable and writable, and ours alone.
            let view = unsafe { std::slice::from_raw_parts_mut(pages.as_ptr().cast::<u8>(), pages.len()) };
            assert!(view.iter().all(|&b| b == 0), "{bytes}: anonymous pages start zeroed");
            view[pages.len() - 1] = 7;
            let len = pages.len();
            let raw = pages.into_raw();
            assert!(mapped(raw, len));
            // SAFETY: made for `bytes` bytes just above, unused afterwards.
            unsafe { HostPages::unmap(raw, bytes) };
        }
    }

    #[test]
    fn ring_pages_that_cannot_exist_are_an_error_not_a_panic() {
        for bytes in [0usize, usize::MAX, usize::MAX - 4095] {
            assert!(matches!(HostPages::new(bytes), Err(DeviceError::Unsupported(_))), "{bytes}");
        }
        // Larger than any address space: the size rounds, mmap refuses it.
        let huge = 1usize << 62;
        assert!(matches!(HostPages::new(huge), Err(DeviceError::Unsupported(ref m)) if m.contains("mmap")));
    }
}
