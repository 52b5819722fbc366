//! Page buffers of requests: which pages a request names, where their bytes live, and (after a
//! read) which of them the server held.
//!
//! An [`IoBuf`] is allocated once and moved into a request and back out when it finishes, so
//! the request path allocates nothing. Its pages live either in the buffer itself
//! ([`IoBuf::new`]) or in the caller's memory ([`IoBuf::external`]): the page store points an
//! external buffer at the paging engine's pages, and a read response is received straight into
//! them (no copy through a client buffer).
//!
//! Each page also has a seal (docs/sealing.md). A buffer whose pages carry versions
//! ([`IoBuf::set_versions`], what the page store sends) is *sealed* when the client has a page
//! key: its writes are sealed in the send buffer and its reads opened in place. Any other
//! buffer moves pages *raw*: a write sends the seals it holds (zero unless a read set them), a
//! read keeps the seals it received, so re-replication copies sealed pages unopened.

use farvm_memproto::{PageSel, MAX_PAGES_PER_FRAME, PAGE_SIZE, SEAL_LEN};
use farvm_pageio::{PageBuf, Version};

use crate::ClientError;

/// Which pages a buffer covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    Run { start: u64 },
    Scatter,
}

/// Where the page bytes live.
enum Pages {
    /// In the buffer: page `i` at `i * 4096`.
    Owned(Box<[u8]>),
    /// In the caller's memory, one 4 KiB destination per page (see [`IoBuf::set_external`]).
    External(Vec<PageBuf>),
}

/// A reusable batch of pages: page indices, where their bytes live and (after a read)
/// presence.
pub struct IoBuf {
    pages: Pages,
    cap: usize,
    indices: Vec<u64>,
    /// Per page: the seal sent or received (raw buffers).
    seals: Box<[[u8; SEAL_LEN]]>,
    /// Per page: its version, when `versioned`.
    versions: Box<[Version]>,
    versioned: bool,
    scatter_wire: Vec<u8>,
    present: [u64; MAX_PAGES_PER_FRAME / 64],
    len: usize,
    shape: Shape,
}

impl std::fmt::Debug for IoBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoBuf")
            .field("len", &self.len)
            .field("shape", &self.shape)
            .field("external", &self.is_external())
            .finish()
    }
}

impl IoBuf {
    /// A buffer holding up to `max_pages` pages itself (clamped to 1..=256).
    pub fn new(max_pages: usize) -> Self {
        let cap = max_pages.clamp(1, MAX_PAGES_PER_FRAME);
        Self::with_pages(
            Pages::Owned(vec![0u8; cap * PAGE_SIZE].into_boxed_slice()),
            cap,
        )
    }

    /// A buffer for up to `max_pages` pages (clamped to 1..=256) that live in the caller's
    /// memory: select them with [`IoBuf::set_external`]. Reads land there directly.
    pub fn external(max_pages: usize) -> Self {
        let cap = max_pages.clamp(1, MAX_PAGES_PER_FRAME);
        Self::with_pages(Pages::External(Vec::with_capacity(cap)), cap)
    }

    fn with_pages(pages: Pages, cap: usize) -> Self {
        Self {
            pages,
            cap,
            indices: Vec::with_capacity(cap),
            seals: vec![[0; SEAL_LEN]; cap].into_boxed_slice(),
            versions: vec![Version::UNKNOWN; cap].into_boxed_slice(),
            versioned: false,
            scatter_wire: Vec::with_capacity(cap * 8),
            present: [0; MAX_PAGES_PER_FRAME / 64],
            len: 0,
            shape: Shape::Run { start: 0 },
        }
    }

    /// Capacity in pages.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// True for a buffer made by [`IoBuf::external`].
    pub fn is_external(&self) -> bool {
        matches!(self.pages, Pages::External(_))
    }

    /// Selects `count` contiguous pages from `start` (a buffer that holds its pages).
    pub fn set_run(&mut self, start: u64, count: usize) -> Result<(), ClientError> {
        if self.is_external() {
            return Err(ClientError::InvalidRequest(
                "an external buffer selects pages with set_external",
            ));
        }
        self.select_run(start, count)
    }

    /// Selects an explicit list of pages (a buffer that holds its pages).
    pub fn set_scatter(&mut self, pages: &[u64]) -> Result<(), ClientError> {
        if self.is_external() {
            return Err(ClientError::InvalidRequest(
                "an external buffer selects pages with set_external",
            ));
        }
        self.select_scatter(pages)
    }

    /// Selects `pages` of an external buffer, page `pages[i]` living at `bufs[i]` (sent as a
    /// run when the pages are consecutive, else as a scatter list).
    ///
    /// # Safety
    /// Every `bufs[i]` must stay valid for 4 KiB of reads and writes, and untouched by anyone
    /// else, from now until the request this buffer is submitted with has finished (or, if it
    /// is never submitted, until the next `set_external`). The client writes a read's pages
    /// there and reads a write's pages from there.
    pub unsafe fn set_external(
        &mut self,
        pages: &[u64],
        bufs: &[PageBuf],
    ) -> Result<(), ClientError> {
        if pages.len() != bufs.len() {
            return Err(ClientError::InvalidRequest(
                "one destination per page is needed",
            ));
        }
        if !self.is_external() {
            return Err(ClientError::InvalidRequest(
                "set_external needs a buffer made by IoBuf::external",
            ));
        }
        let contiguous = pages.windows(2).all(|w| w[0].checked_add(1) == Some(w[1]));
        match pages.first() {
            Some(&start) if contiguous => self.select_run(start, pages.len())?,
            _ => self.select_scatter(pages)?,
        }
        if let Pages::External(v) = &mut self.pages {
            v.clear();
            v.extend_from_slice(bufs);
        }
        Ok(())
    }

    fn select_run(&mut self, start: u64, count: usize) -> Result<(), ClientError> {
        if count == 0 || count > self.cap {
            return Err(ClientError::InvalidRequest(
                "page count outside 1..=capacity",
            ));
        }
        if start.checked_add(count as u64 - 1).is_none() {
            return Err(ClientError::InvalidRequest("page run overflows u64"));
        }
        self.versioned = false;
        self.indices.clear();
        self.indices.extend((0..count as u64).map(|i| start + i));
        self.len = count;
        self.shape = Shape::Run { start };
        self.present = [0; MAX_PAGES_PER_FRAME / 64];
        Ok(())
    }

    fn select_scatter(&mut self, pages: &[u64]) -> Result<(), ClientError> {
        if pages.is_empty() || pages.len() > self.cap {
            return Err(ClientError::InvalidRequest(
                "page count outside 1..=capacity",
            ));
        }
        self.versioned = false;
        self.indices.clear();
        self.indices.extend_from_slice(pages);
        self.scatter_wire.clear();
        for p in pages {
            self.scatter_wire.extend_from_slice(&p.to_le_bytes());
        }
        self.len = pages.len();
        self.shape = Shape::Scatter;
        self.present = [0; MAX_PAGES_PER_FRAME / 64];
        Ok(())
    }

    /// Pages selected.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when nothing is selected.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Page index of entry `i`.
    pub fn page_index(&self, i: usize) -> u64 {
        self.indices[i]
    }

    /// All selected page indices.
    pub fn indices(&self) -> &[u64] {
        &self.indices
    }

    /// Where entry `i`'s 4 KiB live (`i < len()`): the receive path lands a read's page
    /// there while the buffer sits in its request, untouched by anyone else.
    pub(crate) fn page_ptr(&mut self, i: usize) -> *mut u8 {
        match &mut self.pages {
            Pages::Owned(d) => d[i * PAGE_SIZE..(i + 1) * PAGE_SIZE].as_mut_ptr(),
            Pages::External(v) => v[i].as_ptr(),
        }
    }

    /// Data of entry `i` (after a read: the page if present, else unspecified). For an
    /// external buffer these are the caller's bytes (valid per [`IoBuf::set_external`]).
    pub fn page(&self, i: usize) -> &[u8] {
        match &self.pages {
            Pages::Owned(d) => &d[i * PAGE_SIZE..(i + 1) * PAGE_SIZE],
            // SAFETY: `set_external`'s contract keeps the destination valid and ours while
            // this buffer selects it.
            Pages::External(v) => unsafe { v[i].as_slice() },
        }
    }

    /// Mutable data of entry `i` (fill before a write).
    pub fn page_mut(&mut self, i: usize) -> &mut [u8] {
        match &mut self.pages {
            Pages::Owned(d) => &mut d[i * PAGE_SIZE..(i + 1) * PAGE_SIZE],
            // SAFETY: as in `page`.
            Pages::External(v) => unsafe { v[i].as_mut_slice() },
        }
    }

    /// The data of all selected pages, contiguous (empty for an external buffer, whose pages
    /// are not contiguous: use [`IoBuf::page`]).
    pub fn data(&self) -> &[u8] {
        match &self.pages {
            Pages::Owned(d) => &d[..self.len * PAGE_SIZE],
            Pages::External(_) => &[],
        }
    }

    /// Mutable data of all selected pages (empty for an external buffer).
    pub fn data_mut(&mut self) -> &mut [u8] {
        match &mut self.pages {
            Pages::Owned(d) => &mut d[..self.len * PAGE_SIZE],
            Pages::External(_) => &mut [],
        }
    }

    /// After a successful read: was page `i` stored on the server? An absent page was never
    /// written (or was discarded); the VMM zero-fills it.
    pub fn is_present(&self, i: usize) -> bool {
        self.present[i / 64] & (1 << (i % 64)) != 0
    }

    /// Number of present pages after a read.
    pub fn present_count(&self) -> usize {
        self.present.iter().map(|w| w.count_ones() as usize).sum()
    }

    pub(crate) fn shape(&self) -> Shape {
        self.shape
    }

    pub(crate) fn sel(&self) -> PageSel<'_> {
        match self.shape {
            Shape::Run { start } => PageSel::Run {
                start,
                count: self.len as u32,
            },
            Shape::Scatter => PageSel::Scatter(&self.scatter_wire),
        }
    }

    /// Gives the selected pages their versions (`versions[i]` for entry `i`): with a page key
    /// the buffer is sealed from now until the next selection (module doc).
    pub fn set_versions(&mut self, versions: &[Version]) -> Result<(), ClientError> {
        if versions.len() != self.len {
            return Err(ClientError::InvalidRequest(
                "one version per page is needed",
            ));
        }
        self.versions[..self.len].copy_from_slice(versions);
        self.versioned = true;
        Ok(())
    }

    /// Entry `i`'s version, if the buffer's pages carry versions.
    pub(crate) fn version(&self, i: usize) -> Option<Version> {
        self.versioned.then(|| self.versions[i])
    }

    /// Entry `i`'s seal, as received by a raw read or to be sent by a raw write.
    pub fn seal(&self, i: usize) -> &[u8; SEAL_LEN] {
        &self.seals[i]
    }

    /// Sets entry `i`'s seal for a raw write (a copy of a page read raw).
    pub fn set_seal(&mut self, i: usize, seal: &[u8; SEAL_LEN]) {
        self.seals[i] = *seal;
    }

    /// Where entry `i`'s seal lands (the receive path, like [`IoBuf::page_ptr`]).
    pub(crate) fn seal_ptr(&mut self, i: usize) -> *mut u8 {
        self.seals[i].as_mut_ptr()
    }

    pub(crate) fn clear_present(&mut self) {
        self.present = [0; MAX_PAGES_PER_FRAME / 64];
    }

    /// Marks the pages whose bits are set in `bitmap` (a READ response's, LSB first) present.
    pub(crate) fn set_present_from(&mut self, bitmap: &[u8]) {
        self.clear_present();
        for (i, b) in bitmap.iter().enumerate().take(MAX_PAGES_PER_FRAME / 8) {
            self.present[i / 8] |= (*b as u64) << ((i % 8) * 8);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presence_follows_the_wire_bitmap() {
        let mut io = IoBuf::new(20);
        io.set_run(100, 20).unwrap();
        io.set_present_from(&[0b1000_0001, 0, 0b0000_1000]);
        let present: Vec<usize> = (0..20).filter(|&i| io.is_present(i)).collect();
        assert_eq!(present, vec![0, 7, 19]);
        assert_eq!(io.present_count(), 3);
    }

    #[test]
    fn external_pages_are_the_callers_memory() {
        let mut a = vec![0u8; 2 * PAGE_SIZE];
        let (p0, p1) = a.split_at_mut(PAGE_SIZE);
        // SAFETY: both halves outlive `io` and nothing else touches them meanwhile.
        let bufs = unsafe {
            [
                PageBuf::new(p0.as_mut_ptr()).unwrap(),
                PageBuf::new(p1.as_mut_ptr()).unwrap(),
            ]
        };
        let mut io = IoBuf::external(4);
        assert!(
            io.set_run(0, 1).is_err(),
            "an external buffer needs destinations"
        );
        // SAFETY: as above.
        unsafe { io.set_external(&[8, 9], &bufs) }.unwrap();
        assert_eq!(io.shape(), Shape::Run { start: 8 });
        io.page_mut(1).fill(7);
        assert!(io.data().is_empty());
        // SAFETY: as above.
        unsafe { io.set_external(&[9, 3], &bufs) }.unwrap();
        assert_eq!(io.shape(), Shape::Scatter);
        assert_eq!(io.indices(), &[9, 3]);
        drop(io);
        assert!(a[PAGE_SIZE..].iter().all(|&b| b == 7));
        assert!(IoBuf::new(1).set_run(0, 2).is_err());
    }
}
