//! The COM1 console: a 16550A UART (vm-superio) on ports 0x3F8–0x3FF whose interrupt goes
//! through the [`IrqLine`] seam (IRQ 4), with output to stdout, a file or nowhere, and input
//! from a host reader (stdin, a FIFO, a pty) pumped by a thread into the 64-byte receive FIFO.
//!
//! Input flow control: the pump blocks while the FIFO is full and wakes when the guest reads
//! the receive buffer, so no host byte is dropped however slowly the guest reads.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use vm_device::bus::{PioAddress, PioAddressOffset};
use vm_device::DevicePio;
pub use vm_superio::serial::SerialState;
use vm_superio::serial::{Error as UartError, SerialEvents};
use vm_superio::Serial;

use crate::interrupt::IrqLine;
use crate::layout::COM1_PORTS;

/// Where console output goes (stored in a snapshot's VM description).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SerialOut {
    /// The VMM's standard output (`stdout` or `-`).
    Stdout,
    /// A file, created or truncated.
    File(PathBuf),
    /// Discarded (`none` or `off`).
    None,
}

impl std::str::FromStr for SerialOut {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "stdout" | "-" => SerialOut::Stdout,
            "none" | "off" => SerialOut::None,
            "" => return Err("empty serial output destination".into()),
            path => SerialOut::File(PathBuf::from(path)),
        })
    }
}

/// Where console input comes from (stored in a snapshot's VM description).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SerialIn {
    /// The VMM's standard input (`stdin` or `-`).
    Stdin,
    /// A file, FIFO or pty slave, read until end of file.
    File(PathBuf),
    /// No input (`none` or `off`).
    None,
}

impl std::str::FromStr for SerialIn {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "stdin" | "-" => SerialIn::Stdin,
            "none" | "off" => SerialIn::None,
            "" => return Err("empty serial input source".into()),
            path => SerialIn::File(PathBuf::from(path)),
        })
    }
}

impl SerialIn {
    /// Opens the source; `None` for [`SerialIn::None`].
    pub fn open(&self) -> Result<Option<Box<dyn Read + Send>>, SerialError> {
        Ok(match self {
            SerialIn::Stdin => Some(Box::new(io::stdin())),
            SerialIn::File(p) => Some(Box::new(File::open(p).map_err(|source| {
                SerialError::Open {
                    path: p.clone(),
                    source,
                }
            })?)),
            SerialIn::None => None,
        })
    }
}

/// Why the console could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SerialError {
    /// The output or input file cannot be opened.
    #[error("cannot open serial console file {}: {source}", path.display())]
    Open {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    #[error("cannot start the serial input thread: {0}")]
    /// The input thread could not be spawned.
    Thread(#[source] io::Error),
    /// A saved UART state cannot be loaded (a snapshot's).
    #[error("cannot restore the serial console's state: {0}")]
    State(String),
}

/// Writes to stdout unbuffered, so the console streams live.
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

/// Wakes the input pump whenever the guest takes a byte out of the receive FIFO.
struct RxSpace(Arc<Condvar>);
impl SerialEvents for RxSpace {
    fn buffer_read(&self) {
        self.0.notify_all();
    }
    fn out_byte(&self) {}
    fn tx_lost_byte(&self) {}
    fn in_buffer_empty(&self) {}
}

type Uart = Serial<IrqLine, RxSpace, Box<dyn Write + Send>>;

struct Shared {
    uart: Mutex<Uart>,
    rx_space: Arc<Condvar>,
    /// Output errors are logged once, not once per byte.
    output_error_logged: AtomicBool,
}

/// The COM1 device, shared by all vCPUs and the input pump.
#[derive(Clone)]
pub struct SerialConsole {
    shared: Arc<Shared>,
}

/// How long the input pump sleeps when the guest makes no room (loopback mode, no reader);
/// it is also woken at once by every receive-buffer read.
const PUMP_RECHECK: Duration = Duration::from_millis(50);

impl SerialConsole {
    /// A console writing to `out` (a file is created or truncated), interrupting on `irq`.
    pub fn new(out: &SerialOut, irq: IrqLine) -> Result<Self, SerialError> {
        let w: Box<dyn Write + Send> = match out {
            SerialOut::Stdout => Box::new(StdoutWriter),
            SerialOut::File(p) => {
                Box::new(File::create(p).map_err(|source| SerialError::Open {
                    path: p.clone(),
                    source,
                })?)
            }
            SerialOut::None => Box::new(io::sink()),
        };
        Ok(Self::with_writer(w, irq))
    }

    /// A console writing to any `Write`.
    pub fn with_writer(out: Box<dyn Write + Send>, irq: IrqLine) -> Self {
        let rx_space = Arc::new(Condvar::new());
        let uart = Serial::with_events(irq, RxSpace(rx_space.clone()), out);
        SerialConsole {
            shared: Arc::new(Shared {
                uart: Mutex::new(uart),
                rx_space,
                output_error_logged: AtomicBool::new(false),
            }),
        }
    }

    fn uart(&self) -> MutexGuard<'_, Uart> {
        self.shared.uart.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts a thread ("serial-in") that copies `input` into the receive FIFO until end of
    /// file or a read error, blocking while the FIFO is full. The thread holds the console;
    /// it ends with the input (stdin blocks until the process exits, which is fine).
    pub fn attach_input(
        &self,
        mut input: Box<dyn Read + Send>,
    ) -> Result<JoinHandle<()>, SerialError> {
        let console = self.clone();
        std::thread::Builder::new()
            .name("serial-in".into())
            .spawn(move || {
                farvm_sandbox::enter(farvm_sandbox::ThreadClass::Device);
                let mut buf = [0u8; 64];
                loop {
                    match input.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => console.push_input_blocking(&buf[..n]),
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => {
                            tracing::warn!("serial console input stopped: {e}");
                            break;
                        }
                    }
                }
            })
            .map_err(SerialError::Thread)
    }

    /// Queues as much of `bytes` as the receive FIFO takes now (raising the receive interrupt
    /// if enabled); returns how many bytes were taken.
    pub fn push_input(&self, bytes: &[u8]) -> usize {
        let mut uart = self.uart();
        Self::enqueue(&mut uart, bytes)
    }

    fn enqueue(uart: &mut Uart, bytes: &[u8]) -> usize {
        let n = uart.fifo_capacity().min(bytes.len());
        if n == 0 {
            return 0;
        }
        match uart.enqueue_raw_bytes(&bytes[..n]) {
            Ok(taken) => taken,
            // The bytes are queued; only the interrupt failed.
            Err(UartError::Trigger(e)) => {
                tracing::warn!("serial console receive interrupt: {e}");
                n
            }
            Err(_) => 0,
        }
    }

    /// Queues all of `bytes`, waiting for the guest to make room.
    fn push_input_blocking(&self, mut bytes: &[u8]) {
        let mut uart = self.uart();
        while !bytes.is_empty() {
            let taken = Self::enqueue(&mut uart, bytes);
            bytes = &bytes[taken..];
            if taken == 0 {
                uart = match self.shared.rx_space.wait_timeout(uart, PUMP_RECHECK) {
                    Ok((g, _)) => g,
                    Err(p) => p.into_inner().0,
                };
            }
        }
    }

    /// The UART's registers and receive FIFO, for a snapshot.
    pub fn state(&self) -> SerialState {
        self.uart().state()
    }

    /// Loads `state` (a snapshot's) into the UART, keeping its output and interrupt line; an
    /// interrupt the state has pending is raised again.
    pub fn restore(&self, state: &SerialState) -> Result<(), SerialError> {
        // vm-superio's limit: `from_state` refuses a longer FIFO, and would drop the output
        // with it.
        if state.in_buffer.len() > 64 {
            return Err(SerialError::State(format!(
                "{} bytes in a 64-byte receive FIFO",
                state.in_buffer.len()
            )));
        }
        let mut uart = self.uart();
        let irq = uart.interrupt_evt().clone();
        let events = || RxSpace(self.shared.rx_space.clone());
        let sink: Box<dyn Write + Send> = Box::new(io::sink());
        let old = std::mem::replace(&mut *uart, Serial::with_events(irq.clone(), events(), sink));
        *uart = Serial::from_state(state, irq, events(), old.into_writer())
            .map_err(|e| SerialError::State(format!("{e:?}")))?;
        Ok(())
    }

    /// A guest read of register `offset` (0..8).
    pub fn read_register(&self, offset: u8) -> u8 {
        self.uart().read(offset)
    }

    /// A guest write of `value` to register `offset` (0..8).
    pub fn write_register(&self, offset: u8, value: u8) {
        let result = self.uart().write(offset, value);
        if let Err(e) = result {
            if !self
                .shared
                .output_error_logged
                .swap(true, Ordering::Relaxed)
            {
                tracing::warn!("serial console: {e:?} (further errors not logged)");
            }
        }
    }
}

impl DevicePio for SerialConsole {
    /// Multi-byte accesses touch consecutive registers, as on the ISA bus.
    fn pio_read(&self, _base: PioAddress, offset: PioAddressOffset, data: &mut [u8]) {
        for (i, d) in data.iter_mut().enumerate() {
            let off = offset as usize + i;
            *d = if off < COM1_PORTS as usize {
                self.read_register(off as u8)
            } else {
                0xff
            };
        }
    }

    fn pio_write(&self, _base: PioAddress, offset: PioAddressOffset, data: &[u8]) {
        for (i, &v) in data.iter().enumerate() {
            let off = offset as usize + i;
            if off < COM1_PORTS as usize {
                self.write_register(off as u8, v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interrupt::{InterruptController, InterruptError};
    use std::sync::atomic::AtomicU32;

    const THR: u8 = 0;
    const RBR: u8 = 0;
    const IER: u8 = 1;
    const IIR: u8 = 2;
    const LSR: u8 = 5;
    const IER_RDA: u8 = 1;
    const IER_THRE: u8 = 2;
    const IIR_NONE: u8 = 1;
    const IIR_THRE: u8 = 2;
    const IIR_RDA: u8 = 4;
    const LSR_DR: u8 = 1;

    /// Counts edges on line 4; any other line is unwired.
    #[derive(Default)]
    struct Edges(AtomicU32);
    impl InterruptController for Edges {
        fn trigger(&self, gsi: u32) -> Result<(), InterruptError> {
            if gsi != 4 {
                return Err(InterruptError::NotConnected { gsi });
            }
            self.0.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    }
    impl Edges {
        fn count(&self) -> u32 {
            self.0.load(Ordering::SeqCst)
        }
    }

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);
    impl Write for Captured {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn console() -> (SerialConsole, Arc<Edges>, Captured) {
        let edges = Arc::new(Edges::default());
        let out = Captured::default();
        let c = SerialConsole::with_writer(Box::new(out.clone()), IrqLine::new(edges.clone(), 4));
        (c, edges, out)
    }

    #[test]
    fn transmit_raises_thr_empty_interrupts() {
        let (c, edges, out) = console();
        c.write_register(THR, b'x');
        assert_eq!(edges.count(), 0, "no interrupt while IER is clear");
        // Enabling THRE asserts it at once: the transmitter is always empty.
        c.write_register(IER, IER_THRE);
        assert_eq!(edges.count(), 1);
        assert_eq!(c.read_register(IIR) & 0x0f, IIR_THRE);
        // Reading IIR acknowledged it; the next byte raises a new edge.
        assert_eq!(c.read_register(IIR) & 0x0f, IIR_NONE);
        c.pio_write(PioAddress(0x3f8), 0, b"y");
        assert_eq!(edges.count(), 2);
        assert_eq!(*out.0.lock().unwrap(), b"xy");
    }

    #[test]
    fn receive_raises_rda_interrupt_and_delivers_bytes_in_order() {
        let (c, edges, _) = console();
        c.write_register(IER, IER_RDA);
        assert_eq!(edges.count(), 0, "nothing received yet");
        assert_eq!(c.push_input(b"ls\n"), 3);
        assert_eq!(edges.count(), 1);
        assert_eq!(c.read_register(IIR) & 0x0f, IIR_RDA);
        let mut got = Vec::new();
        while c.read_register(LSR) & LSR_DR != 0 {
            got.push(c.read_register(RBR));
        }
        assert_eq!(got, b"ls\n");
        // Input that arrived while RDA was masked fires when the driver unmasks it.
        c.write_register(IER, 0);
        c.push_input(b"a");
        assert_eq!(edges.count(), 1);
        c.write_register(IER, IER_RDA);
        assert_eq!(edges.count(), 2);
    }

    #[test]
    fn fifo_takes_64_bytes_then_refuses() {
        let (c, _, _) = console();
        assert_eq!(c.push_input(&[7u8; 100]), 64);
        assert_eq!(c.push_input(b"z"), 0);
        c.read_register(RBR);
        assert_eq!(c.push_input(b"zz"), 1);
    }

    #[test]
    fn input_pump_delivers_more_than_the_fifo_holds() {
        let (c, edges, _) = console();
        c.write_register(IER, IER_RDA);
        let input: Vec<u8> = (0..1000u32).map(|i| (i % 251) as u8).collect();
        let pump = c
            .attach_input(Box::new(io::Cursor::new(input.clone())))
            .unwrap();
        let mut got = Vec::new();
        // The guest side: poll LSR and drain, like the 8250 driver's interrupt handler.
        for _ in 0..200_000 {
            if got.len() == input.len() {
                break;
            }
            if c.read_register(LSR) & LSR_DR != 0 {
                got.push(c.read_register(RBR));
            } else {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        pump.join().unwrap();
        assert_eq!(got, input);
        assert!(edges.count() >= 1);
    }

    #[test]
    fn wide_port_accesses_touch_consecutive_registers() {
        let (c, _, _) = console();
        c.pio_write(PioAddress(0x3f8), 7, &[0x5a]); // scratch
        let mut d = [0u8; 2];
        c.pio_read(PioAddress(0x3f8), 6, &mut d);
        assert_eq!(d[1], 0x5a);
        c.pio_read(PioAddress(0x3f8), 7, &mut d);
        assert_eq!(d, [0x5a, 0xff]);
    }

    #[test]
    fn destinations_parse_and_missing_input_is_a_clear_error() {
        assert_eq!("-".parse::<SerialOut>().unwrap(), SerialOut::Stdout);
        assert_eq!("off".parse::<SerialIn>().unwrap(), SerialIn::None);
        assert_eq!(
            "/x/y".parse::<SerialIn>().unwrap(),
            SerialIn::File("/x/y".into())
        );
        assert!("".parse::<SerialOut>().is_err());
        let err = match SerialIn::File("/nonexistent/tty".into()).open() {
            Err(e) => e.to_string(),
            Ok(_) => panic!("opened a missing file"),
        };
        assert!(err.contains("/nonexistent/tty"), "{err}");
    }
}
