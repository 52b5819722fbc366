//! The 16550 UART console at COM1 (0x3F8), emulated by vm-superio, writing to stdout, a file,
//! a pseudo-terminal ([`super::pty`], which also feeds input) or nowhere. The guest polls it (no interrupt line is wired: the test guest prints few lines
//! and each byte is already an exit).

use std::fs::File;
use std::io::{self, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use vm_superio::serial::NoEvents;
use vm_superio::{Serial, Trigger};

/// First port of COM1.
pub const COM1_BASE: u16 = 0x3f8;
/// Number of COM1 ports.
pub const COM1_PORTS: u16 = 8;

/// Where console output goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SerialOut {
    Stdout,
    File(PathBuf),
    /// A pseudo-terminal (the API's `Pty` console mode).
    Pty(Arc<super::pty::Pty>),
    None,
}

impl std::str::FromStr for SerialOut {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "stdout" | "-" => SerialOut::Stdout,
            "none" | "off" => SerialOut::None,
            "" => return Err("empty --serial destination".into()),
            path => SerialOut::File(PathBuf::from(path)),
        })
    }
}

/// The UART interrupt is not wired; polling guests never need it.
struct NoIrq;
impl Trigger for NoIrq {
    type E = io::Error;
    fn trigger(&self) -> Result<(), io::Error> {
        Ok(())
    }
}

/// Writes to stdout unbuffered per byte run, so the console streams live.
struct StdoutWriter;
impl Write for StdoutWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut out = io::stdout().lock();
        out.write_all(buf)?;
        out.flush()?;
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        io::stdout().flush()
    }
}

/// The COM1 device (shared by all vCPUs).
pub struct SerialConsole {
    uart: Mutex<Serial<NoIrq, NoEvents, Box<dyn Write + Send>>>,
}

impl SerialConsole {
    /// Opens the destination (creating/truncating a file).
    pub fn new(out: &SerialOut) -> io::Result<Self> {
        let w: Box<dyn Write + Send> = match out {
            SerialOut::Stdout => Box::new(StdoutWriter),
            SerialOut::File(p) => Box::new(File::create(p).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("cannot create serial log {}: {e}", p.display()),
                )
            })?),
            SerialOut::Pty(p) => Box::new(p.writer()),
            SerialOut::None => Box::new(io::sink()),
        };
        Ok(SerialConsole {
            uart: Mutex::new(Serial::new(NoIrq, w)),
        })
    }

    /// Whether `port` belongs to this device.
    pub fn owns(port: u16) -> bool {
        (COM1_BASE..COM1_BASE + COM1_PORTS).contains(&port)
    }

    /// Guest `out` to a COM1 port.
    pub fn write(&self, port: u16, value: u8) {
        let mut uart = self.uart.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = uart.write((port - COM1_BASE) as u8, value) {
            tracing::warn!("serial console write failed: {e:?}");
        }
    }

    /// Queues host input for the guest (as much as the 64-byte receive FIFO takes); returns
    /// how many bytes were taken.
    pub fn push_input(&self, bytes: &[u8]) -> usize {
        let mut uart = self.uart.lock().unwrap_or_else(|p| p.into_inner());
        let room = uart.fifo_capacity().min(bytes.len());
        uart.enqueue_raw_bytes(&bytes[..room]).unwrap_or(0)
    }

    /// Guest `in` from a COM1 port.
    pub fn read(&self, port: u16) -> u8 {
        let mut uart = self.uart.lock().unwrap_or_else(|p| p.into_inner());
        uart.read((port - COM1_BASE) as u8)
    }
}
