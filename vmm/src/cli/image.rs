//! `farvm image`: the guest images built into farvm, as files other tools can name (a libvirt
//! domain's `<kernel>`, `farvm run --kernel`).

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::{Args, Subcommand};

use super::Failure;
use farvm_vmm::boot::testguest_file::WORKLOAD_KEY;
use farvm_vmm::exit_code;

/// File name of the exported test-guest kernel.
pub const TESTGUEST_FILE: &str = "farvm-testguest.elf";

pub const IMAGE_ABOUT: &str = "\
Work with the guest images built into farvm.

`farvm image export DIR` writes the built-in test-guest kernel to DIR/farvm-testguest.elf, an
x86-64 ELF that farvm recognises by its note whatever the file is called. Boot it with
`farvm run --kernel FILE`, or name it in a libvirt domain's <kernel> element. The test guest
takes its workloads from the kernel command line: each `farvm.workload=SPEC` word adds one
process (SPEC as for `farvm run --workload`), e.g.

  <os>
    <type arch='x86_64'>hvm</type>
    <kernel>/var/lib/farvm/farvm-testguest.elf</kernel>
    <cmdline>farvm.workload=seq:ws=32M farvm.workload=random:ws=16M</cmdline>
  </os>";

#[derive(Args, Debug)]
pub struct ImageArgs {
    #[command(subcommand)]
    command: ImageCommand,
}

#[derive(Subcommand, Debug)]
enum ImageCommand {
    /// Write the built-in test-guest kernel to DIR/farvm-testguest.elf (DIR is created).
    Export(ExportArgs),
}

#[derive(Args, Debug)]
struct ExportArgs {
    /// Directory to write into (created if missing).
    #[arg(value_name = "DIR")]
    dir: PathBuf,

    /// Replace an existing file of the same name.
    #[arg(long)]
    force: bool,
}

pub fn run(a: ImageArgs) -> Result<()> {
    match a.command {
        ImageCommand::Export(e) => {
            let path = export_test_guest(&e.dir, e.force)?;
            println!("{}", path.display());
            eprintln!(
                "farvm: wrote the test guest ({} bytes); choose its workloads with \
                 {WORKLOAD_KEY}=SPEC words on the kernel command line",
                farvm_vmm::builtin::test_guest_elf().len()
            );
            Ok(())
        }
    }
}

/// Writes the test-guest ELF into `dir` (through a temporary file renamed into place, so a
/// reader never sees half a kernel) and returns its path.
pub fn export_test_guest(dir: &Path, force: bool) -> Result<PathBuf> {
    let elf = farvm_vmm::builtin::test_guest_elf();
    if elf.is_empty() {
        return Err(Failure::new(
            exit_code::BAD_KERNEL,
            "the built-in test guest is empty in this build",
        )
        .into());
    }
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let path = dir.join(TESTGUEST_FILE);
    if !force && path.exists() {
        return Err(Failure::new(
            exit_code::USAGE,
            format!("{} exists (give --force to replace it)", path.display()),
        )
        .into());
    }
    let tmp = dir.join(format!(".{TESTGUEST_FILE}.{}", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(elf)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        anyhow::Error::new(e).context(format!("cannot write {}", path.display()))
    })?;
    Ok(path)
}
