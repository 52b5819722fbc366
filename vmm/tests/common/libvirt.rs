//! libvirt's Cloud Hypervisor driver for tests: `scripts/libvirt-ch.sh` starts virtchd (an
//! unprivileged per-user daemon) with a given `farvm` binary on its PATH as `cloud-hypervisor`,
//! and [`Libvirt`] drives it with `virsh` and reads its logs. Used by the VMM's libvirt tests
//! and by the KVM lab's Debian-domain test (`tests/tests/linux_debian.rs`), through `#[path]`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn script() -> PathBuf {
    workspace_root().join("scripts/libvirt-ch.sh")
}

/// Panics unless scripts/libvirt-ch.sh has built libvirt (its `status`); returns what it built.
pub fn require_libvirt_built() -> String {
    let out = Command::new("bash")
        .arg(script())
        .arg("status")
        .output()
        .expect("run scripts/libvirt-ch.sh status");
    let status = String::from_utf8_lossy(&out.stdout).into_owned();
    let built = status
        .lines()
        .find_map(|l| l.strip_prefix("built: "))
        .unwrap_or_else(|| {
            panic!(
                "libvirt with the Cloud Hypervisor driver is not built: run `scripts/libvirt-ch.sh \
                 build` once (about 10 minutes; .ci/run does it when the cache is missing)\n{status}"
            )
        });
    built.to_string()
}

/// A virtchd started by scripts/libvirt-ch.sh for this test alone; stopped on drop (which
/// destroys the domains still running).
pub struct Libvirt {
    /// The farvm binary the daemon runs as `cloud-hypervisor`.
    farvm: PathBuf,
    state: PathBuf,
    pub config: PathBuf,
    /// What scripts/libvirt-ch.sh built (version, source, date).
    built: String,
    /// `FARVM_LOG` for the daemon and so for every VMM it starts (`None`: farvm's default).
    log: Option<&'static str>,
}

impl Libvirt {
    pub fn script(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new("bash");
        cmd.arg(script())
            .args(args)
            .env("FARVM_LIBVIRT_STATE", &self.state)
            .env("FARVM_BIN", &self.farvm)
            .env("FARVM_CONFIG", &self.config);
        match self.log {
            Some(level) => cmd.env("FARVM_LOG", level),
            None => cmd.env_remove("FARVM_LOG"),
        };
        cmd.output().expect("run scripts/libvirt-ch.sh")
    }

    /// A daemon running `farvm` for the host config `config`, its state under `dir`, its
    /// VMMs logging at `info`.
    pub fn start(farvm: &Path, dir: &Path, config: &Path, built: String) -> Libvirt {
        Self::start_logging(farvm, dir, config, built, Some("info"))
    }

    /// A daemon whose VMMs log at `log` (`None`: farvm's default level).
    pub fn start_logging(
        farvm: &Path,
        dir: &Path,
        config: &Path,
        built: String,
        log: Option<&'static str>,
    ) -> Libvirt {
        let lv = Libvirt {
            farvm: farvm.to_path_buf(),
            state: dir.join("libvirt-session"),
            config: config.to_path_buf(),
            built,
            log,
        };
        let out = lv.script(&["start"]);
        assert!(
            out.status.success(),
            "scripts/libvirt-ch.sh start: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        lv
    }

    /// `virsh ARGS`, which must succeed; its stdout.
    pub fn virsh(&self, args: &[&str]) -> String {
        let out = self.script(&[&["virsh"], args].concat());
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        eprintln!("$ virsh {}\n{}", args.join(" "), stdout.trim_end());
        assert!(
            out.status.success(),
            "virsh {}: {}{}\nvirtchd log:\n{}\ndomain logs:\n{}",
            args.join(" "),
            stdout,
            String::from_utf8_lossy(&out.stderr),
            self.daemon_log(),
            self.domain_logs()
        );
        stdout
    }

    pub fn daemon_log(&self) -> String {
        let runtime = std::fs::read_to_string(&self.state).unwrap_or_default();
        std::fs::read_to_string(Path::new(runtime.trim()).join("virtchd.log")).unwrap_or_default()
    }

    /// The runtime directory of the daemon (its state dir holds the API sockets).
    pub fn runtime(&self) -> PathBuf {
        PathBuf::from(std::fs::read_to_string(&self.state).unwrap().trim())
    }

    pub fn domstate(&self, name: &str) -> String {
        self.virsh(&["domstate", name]).trim().to_string()
    }

    /// Waits for `virsh domstate --reason NAME` to be `want` (libvirt changes it when farvm's
    /// event monitor reports the VM's end).
    pub fn wait_domstate(&self, name: &str, want: &str) {
        let t0 = Instant::now();
        loop {
            let state = self
                .virsh(&["domstate", "--reason", name])
                .trim()
                .to_string();
            if state == want {
                return;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "{name} is `{state}`, never `{want}` (libvirt {}: a ch driver older than \
                 libvirt 11 does not follow its VMM's events)\nVMM log:\n{}\nvirtchd log:\n{}",
                self.built,
                self.domain_log(name),
                self.daemon_log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// What the domain's VMM wrote on its standard output and error (libvirt's domain log).
    pub fn domain_log(&self, name: &str) -> String {
        std::fs::read_to_string(
            self.runtime()
                .join(format!("cache/libvirt/ch/log/{name}.log")),
        )
        .unwrap_or_default()
    }

    /// Every domain's log (what each VMM wrote), for a failure's message.
    pub fn domain_logs(&self) -> String {
        let dir = self.runtime().join("cache/libvirt/ch/log");
        let mut text = String::new();
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let log = std::fs::read_to_string(entry.path()).unwrap_or_default();
            text.push_str(&format!("== {}\n{log}", entry.path().display()));
        }
        text
    }

    /// The field `key` of `virsh dominfo`.
    pub fn dominfo(&self, name: &str, key: &str) -> String {
        let info = self.virsh(&["dominfo", name]);
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}:")))
            .unwrap_or_else(|| panic!("no `{key}` in dominfo:\n{info}"))
            .trim()
            .to_string()
    }

    /// The console pty libvirt read from the VMM's vm.info (`virsh dumpxml`).
    pub fn console_pty(&self, name: &str) -> PathBuf {
        let xml = self.virsh(&["dumpxml", name]);
        let at = xml
            .find("<console type='pty' tty='")
            .unwrap_or_else(|| panic!("no pty console in:\n{xml}"));
        let rest = &xml[at + "<console type='pty' tty='".len()..];
        PathBuf::from(&rest[..rest.find('\'').unwrap()])
    }
}

impl Drop for Libvirt {
    fn drop(&mut self) {
        let out = self.script(&["stop"]);
        if !out.status.success() {
            eprintln!(
                "scripts/libvirt-ch.sh stop: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

/// The value of the sample `name` (whatever its labels) in a Prometheus text exposition.
pub fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| {
            let rest = l.strip_prefix(name)?;
            let rest = match rest.strip_prefix('{') {
                Some(labels) => &labels[labels.find('}')? + 1..],
                None => rest,
            };
            rest.strip_prefix(' ')?.trim().parse().ok()
        })
        .unwrap_or_else(|| panic!("no {name} in metrics:\n{text}"))
}
