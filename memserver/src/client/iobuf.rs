//! Caller-owned page buffers for the asynchronous API.
//!
//! An [`IoBuf`] is allocated once (for up to `max_pages` pages) and moved into a request and
//! back out in its completion, so the fault path allocates nothing per request.

use crate::protocol::{page_crc, PageSel, MAX_PAGES_PER_FRAME, PAGE_SIZE};

use super::ClientError;

/// Which pages a buffer covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    Run { start: u64 },
    Scatter,
}

/// A reusable batch of pages: page indices, data and (after a read) presence.
pub struct IoBuf {
    data: Box<[u8]>,
    indices: Vec<u64>,
    crcs: Vec<u32>,
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
            .finish()
    }
}

impl IoBuf {
    /// A buffer for up to `max_pages` pages (clamped to 1..=256).
    pub fn new(max_pages: usize) -> Self {
        let cap = max_pages.clamp(1, MAX_PAGES_PER_FRAME);
        Self {
            data: vec![0u8; cap * PAGE_SIZE].into_boxed_slice(),
            indices: Vec::with_capacity(cap),
            crcs: Vec::with_capacity(cap),
            scatter_wire: Vec::with_capacity(cap * 8),
            present: [0; MAX_PAGES_PER_FRAME / 64],
            len: 0,
            shape: Shape::Run { start: 0 },
        }
    }

    /// Capacity in pages.
    pub fn capacity(&self) -> usize {
        self.data.len() / PAGE_SIZE
    }

    /// Selects `count` contiguous pages from `start`.
    pub fn set_run(&mut self, start: u64, count: usize) -> Result<(), ClientError> {
        if count == 0 || count > self.capacity() {
            return Err(ClientError::InvalidRequest(
                "page count outside 1..=capacity",
            ));
        }
        if start.checked_add(count as u64 - 1).is_none() {
            return Err(ClientError::InvalidRequest("page run overflows u64"));
        }
        self.indices.clear();
        self.indices.extend((0..count as u64).map(|i| start + i));
        self.len = count;
        self.shape = Shape::Run { start };
        self.present = [0; MAX_PAGES_PER_FRAME / 64];
        Ok(())
    }

    /// Selects an explicit list of pages.
    pub fn set_scatter(&mut self, pages: &[u64]) -> Result<(), ClientError> {
        if pages.is_empty() || pages.len() > self.capacity() {
            return Err(ClientError::InvalidRequest(
                "page count outside 1..=capacity",
            ));
        }
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

    /// Data of entry `i` (after a read: the page if present, else unspecified).
    pub fn page(&self, i: usize) -> &[u8] {
        &self.data[i * PAGE_SIZE..(i + 1) * PAGE_SIZE]
    }

    /// Mutable data of entry `i` (fill before a write).
    pub fn page_mut(&mut self, i: usize) -> &mut [u8] {
        &mut self.data[i * PAGE_SIZE..(i + 1) * PAGE_SIZE]
    }

    /// The data of all selected pages, contiguous.
    pub fn data(&self) -> &[u8] {
        &self.data[..self.len * PAGE_SIZE]
    }

    /// Mutable data of all selected pages.
    pub fn data_mut(&mut self) -> &mut [u8] {
        &mut self.data[..self.len * PAGE_SIZE]
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

    pub(crate) fn compute_crcs(&mut self) {
        self.crcs.clear();
        for i in 0..self.len {
            let c = page_crc(&self.data[i * PAGE_SIZE..(i + 1) * PAGE_SIZE]);
            self.crcs.push(c);
        }
    }

    pub(crate) fn crc(&self, i: usize) -> u32 {
        self.crcs[i]
    }

    pub(crate) fn clear_present(&mut self) {
        self.present = [0; MAX_PAGES_PER_FRAME / 64];
    }

    pub(crate) fn set_present(&mut self, i: usize) {
        self.present[i / 64] |= 1 << (i % 64);
    }
}
