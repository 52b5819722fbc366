//! `farvm-lab fuzz`: the memory server's request decoder and the page sealing fuzzed together,
//! on the stable toolchain, without coverage feedback: structured inputs (valid frames from the
//! production encoder, pages sealed by the production sealer) mutated by a seeded generator.
//! `server.rs` feeds request streams to a real in-process server and checks every answer
//! against a model of the store; `client.rs` feeds corrupted READ responses to the client's
//! receive checks; `mutate.rs` holds the mutations, `vms.rs` the two VMs. This file holds the
//! flags, the loop and the summary.

mod client;
mod mutate;
mod server;
mod vms;

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use anyhow::{bail, Result};
use clap::Args;
use farvm_prefetch::trace::rng::SplitMix64;

use client::ClientFuzz;
use server::ServerFuzz;
use vms::Vm;

pub const FUZZ_ABOUT: &str = "\
Fuzzes the memory server's request decoding and the page sealing together, on the stable
toolchain: a seeded, structured, mutation-based fuzzer (no coverage feedback). Each of
--iterations executions is drawn from --seed and is one of two kinds, evenly:

  server   a connection to a real in-process memory server (the production frame decoder,
           request handler, tenancy checks and page store; no socket) of two tenants, two VMs
           with their own token, namespace and page key. The VM's stream is a HELLO (mostly)
           and one to four READ, WRITE, DISCARD or STAT requests built with the production
           encoder, the written pages sealed with the VM's key (their plaintext tagged with
           namespace, page number and version; one page in sixteen sealed for a neighbouring
           page number, a misdirected write); one request in ten addresses the other VM's
           namespace. Six streams in ten are mutated: header field lies (opcode, flags, status,
           page count, body length, namespace, protocol version, magic), bit flips, bytes set,
           a page's seal or data changed with its crc32c fixed up, then in four of those a
           truncation, a dropped range, a duplicated frame or a spliced range.
  client   a READ response of pages the VMs sealed, corrupted the ways a compromised server
           would (a seal or data bit flipped with the crc32c fixed up, another VM's page,
           another page number's or an older version's, a seal cut short or zeroed, another
           page's seal, a bit flipped without fixing the crc32c, header and bitmap lies, the
           response cut short), received as the client's TCP link does: header and bitmap
           checks, the pages landed in the request's buffer, then the client's own crc32c and
           seal check.

A violation stops the run with exit status 1, naming the execution. Violations:

  - a panic anywhere (the server, the codec, the client's checks, the sealing);
  - a frame the server handled that the codec rejects, or an answer that does not decode,
    or not exactly one answer with the request's id;
  - any answer other than the one the model of the store gives: a page read from namespace N
    that is not, byte for byte, the last one written to N at that page number (no page comes
    back across namespaces, none stale, none lost); a request on another tenant's namespace
    not refused (Denied); counts of WRITE, DISCARD and STAT off; a write refused for a crc32c
    or capacity reason it does not have;
  - a page a VM sealed that opens at another address than its own (namespace, page number,
    version), or does not open at its own;
  - memory: the store holding other pages or namespaces than the model, or more than its
    capacity (512 pages; namespaces created by mutated frames are reclaimed, as the pool's
    collector does, when it is three quarters full);
  - the client delivering a page (marking it present) that is not exactly the plaintext the
    reading VM wrote at that page number and version, or marking any present when it refused
    the response.

At the end it prints the command, the seed, the executions of each kind, the mutations
drawn, every distinct outcome with its count (each request's answer, each way a connection
ended, each way the client accepted or refused a response), the wall time and the rate.
The same seed and iterations give the same executions and outcomes.

EXAMPLES
  farvm-lab fuzz --iterations 1000000 --seed 1
  farvm-lab fuzz --iterations 20000 --seed 7

EXIT STATUS
  0 no violation; 1 a violation (printed with its execution number); 64 bad arguments";

#[derive(Args, Debug, Clone)]
pub struct FuzzArgs {
    /// Executions to run (half server streams, half client responses, drawn by the seed).
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub iterations: u64,
    /// The seed every input is drawn from; the same seed and iterations replay the same run.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// An execution's verdict: `Err` describes the violation.
pub type Verdict = Result<(), String>;

/// Distinct outcomes and mutations with their counts.
#[derive(Default)]
pub struct Outcomes {
    outcomes: BTreeMap<String, u64>,
    mutations: BTreeMap<&'static str, u64>,
}

impl Outcomes {
    /// Counts one outcome.
    pub fn add(&mut self, outcome: impl Into<String> + AsRef<str>) {
        if let Some(n) = self.outcomes.get_mut(outcome.as_ref()) {
            *n += 1;
        } else {
            self.outcomes.insert(outcome.into(), 1);
        }
    }

    /// Counts one mutation drawn.
    pub fn add_mutation(&mut self, name: &'static str) {
        *self.mutations.entry(name).or_default() += 1;
    }
}

/// An error's kind: its variant's name (`BadLength`, `Truncated`, ...), without its fields.
pub fn kind_of(e: &impl std::fmt::Debug) -> String {
    let s = format!("{e:?}");
    let end = s.find(['(', ' ', '{']).unwrap_or(s.len());
    s[..end].to_string()
}

pub fn run(args: FuzzArgs) -> Result<()> {
    let mut setup = SplitMix64::new(args.seed);
    let mut vms = [Vm::new(0, &mut setup), Vm::new(1, &mut setup)];
    let mut server = ServerFuzz::new(&vms)?;
    let mut client = ClientFuzz::new(&mut vms);
    let mut rng = SplitMix64::new(args.seed ^ 0x5eed_f022);
    let mut out = Outcomes::default();
    let (mut server_execs, mut client_execs) = (0u64, 0u64);
    let command = format!(
        "farvm-lab fuzz --iterations {} --seed {}",
        args.iterations, args.seed
    );
    let t0 = Instant::now();
    let mut failure = None;
    for i in 0..args.iterations {
        let on_server = rng.below(2) == 0;
        let result = catch_unwind(AssertUnwindSafe(|| {
            if on_server {
                server.exec(&mut rng, &mut vms, &mut out)?;
                if i % 4096 == 0 {
                    server.check_namespaces()?;
                }
                Ok(())
            } else {
                client.exec(&mut rng, &mut vms, &mut out)
            }
        }));
        if on_server {
            server_execs += 1;
        } else {
            client_execs += 1;
        }
        let why = match result {
            Ok(Ok(())) => continue,
            Ok(Err(violation)) => violation,
            Err(panic) => format!(
                "panic: {}",
                panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("(no message)")
            ),
        };
        let kind = if on_server { "server" } else { "client" };
        failure = Some(format!("execution {i} ({kind}): {why}"));
        break;
    }
    if failure.is_none() {
        if let Err(why) = server.check_namespaces() {
            failure = Some(format!("at the end: {why}"));
        }
    }
    let wall = t0.elapsed().as_secs_f64();
    let execs = server_execs + client_execs;
    println!("command:    {command}");
    println!("seed:       {}", args.seed);
    println!("executions: {execs} (server {server_execs}, client {client_execs})");
    println!(
        "wall time:  {wall:.1} s ({:.0} executions/s)",
        execs as f64 / wall.max(1e-9)
    );
    println!("mutations drawn:");
    for (name, n) in &out.mutations {
        println!("  {n:>9}  {name}");
    }
    println!("outcomes:");
    for (name, n) in &out.outcomes {
        println!("  {n:>9}  {name}");
    }
    match failure {
        None => {
            println!("violations: 0");
            Ok(())
        }
        Some(f) => {
            println!("violations: 1");
            bail!("fuzz violation at {f}; replay: {command}")
        }
    }
}
