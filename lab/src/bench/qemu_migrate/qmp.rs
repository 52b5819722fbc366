//! A QMP client (QEMU's machine protocol: JSON lines over a Unix socket): the greeting, the
//! capabilities handshake, then one command at a time, its answer read past any events QEMU
//! sends in between.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

/// One QMP connection, in command mode.
pub struct Qmp {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    what: String,
}

impl Qmp {
    /// Connects to the QMP socket at `path` (retrying until QEMU has created it, for up to
    /// `patience`) and leaves capabilities negotiation; `what` names the QEMU in errors.
    pub fn connect(path: &Path, what: &str, patience: Duration) -> Result<Self> {
        let deadline = Instant::now() + patience;
        let stream = loop {
            match UnixStream::connect(path) {
                Ok(s) => break s,
                Err(e) if Instant::now() < deadline => {
                    tracing::debug!("QMP {}: {e}; retrying", path.display());
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => return Err(e).with_context(|| format!("{what}: QMP {}", path.display())),
            }
        };
        let mut qmp = Qmp {
            reader: BufReader::new(stream.try_clone().context("cloning the QMP socket")?),
            writer: stream,
            what: what.to_string(),
        };
        let greeting = qmp.read()?;
        if greeting.get("QMP").is_none() {
            bail!("{what}: no QMP greeting: {greeting}");
        }
        qmp.execute("qmp_capabilities", json!({}))?;
        Ok(qmp)
    }

    /// Runs `command` with `arguments`; its `return` value, or QEMU's error as the error.
    pub fn execute(&mut self, command: &str, arguments: Value) -> Result<Value> {
        let mut line = json!({ "execute": command, "arguments": arguments }).to_string();
        line.push('\n');
        self.writer
            .write_all(line.as_bytes())
            .with_context(|| format!("{}: sending {command}", self.what))?;
        loop {
            let answer = self.read()?;
            if answer.get("event").is_some() {
                continue;
            }
            if let Some(r) = answer.get("return") {
                return Ok(r.clone());
            }
            match answer.get("error") {
                Some(e) => bail!("{}: {command}: {}", self.what, e["desc"]),
                None => bail!("{}: {command}: unexpected answer {answer}", self.what),
            }
        }
    }

    fn read(&mut self) -> Result<Value> {
        let mut line = String::new();
        let n = self
            .reader
            .read_line(&mut line)
            .with_context(|| format!("{}: reading QMP", self.what))?;
        if n == 0 {
            bail!("{}: QEMU closed its QMP socket", self.what);
        }
        serde_json::from_str(&line).with_context(|| format!("{}: QMP sent {line:?}", self.what))
    }
}
