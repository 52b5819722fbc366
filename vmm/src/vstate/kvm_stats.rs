//! KVM's binary statistics (`KVM_GET_STATS_FD`) of a vCPU: counters such as `exits`,
//! `insn_emulation`, `pf_fixed`, `pf_taken`, read with `pread` from any thread while the vCPU
//! runs (no vCPU mutex, unlike most vCPU ioctls).

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::FileExt;

use kvm_ioctls::VcpuFd;

/// `_IO(KVMIO, 0xce)`.
const KVM_GET_STATS_FD: libc::c_ulong = 0xae_ce;
const HEADER_SIZE: usize = 24;
const DESC_FIXED: usize = 16;

/// One scalar counter: name and offset (in u64s) into the data block.
#[derive(Clone, Debug)]
struct Counter {
    name: String,
    offset: u64,
}

/// The statistics file of one vCPU.
pub struct VcpuStats {
    file: File,
    data_offset: u64,
    counters: Vec<Counter>,
}

impl VcpuStats {
    /// Opens the vCPU's stats fd and reads its descriptors (only single-value stats are kept).
    pub fn open(vcpu: &VcpuFd) -> io::Result<Self> {
        // SAFETY: KVM_GET_STATS_FD takes no argument and returns a new fd or -1.
        let fd = unsafe { libc::ioctl(vcpu.as_raw_fd(), KVM_GET_STATS_FD as _, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor owned by nobody else.
        let file = unsafe { File::from_raw_fd(fd) };
        let mut h = [0u8; HEADER_SIZE];
        file.read_exact_at(&mut h, 0)?;
        let u32_at = |b: &[u8], o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let name_size = u32_at(&h, 4) as usize;
        let num_desc = u32_at(&h, 8) as usize;
        let desc_offset = u64::from(u32_at(&h, 16));
        let data_offset = u64::from(u32_at(&h, 20));
        if num_desc > 4096 || name_size > 4096 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "implausible KVM stats header",
            ));
        }
        let desc_size = DESC_FIXED + name_size;
        let mut descs = vec![0u8; desc_size * num_desc];
        file.read_exact_at(&mut descs, desc_offset)?;
        let mut counters = Vec::with_capacity(num_desc);
        for d in descs.chunks_exact(desc_size) {
            let size = u16::from_le_bytes([d[6], d[7]]);
            if size != 1 {
                continue; // histograms
            }
            let offset = u64::from(u32_at(d, 8));
            let raw = &d[DESC_FIXED..];
            let end = raw.iter().position(|&c| c == 0).unwrap_or(raw.len());
            counters.push(Counter {
                name: String::from_utf8_lossy(&raw[..end]).into_owned(),
                offset,
            });
        }
        Ok(VcpuStats {
            file,
            data_offset,
            counters,
        })
    }

    /// Current values of every scalar counter, `(name, value)`.
    pub fn read(&self) -> io::Result<Vec<(String, u64)>> {
        let max = self
            .counters
            .iter()
            .map(|c| c.offset + 8)
            .max()
            .unwrap_or(0) as usize;
        let mut data = vec![0u8; max];
        self.file.read_exact_at(&mut data, self.data_offset)?;
        Ok(self
            .counters
            .iter()
            .map(|c| {
                let o = c.offset as usize;
                let v = u64::from_le_bytes(data[o..o + 8].try_into().unwrap_or([0; 8]));
                (c.name.clone(), v)
            })
            .collect())
    }
}
