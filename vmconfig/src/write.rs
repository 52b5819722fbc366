//! Writing a [`Domain`] back as libvirt domain XML (with farvm's metadata element), e.g. to
//! hand a domain to `virsh define`. What [`Domain::parse`] reads back from it equals the domain.

use std::fmt::Write;

use quick_xml::escape::escape;

use crate::domain::{CharBackend, CharDevice, Disk, Domain, Interface};
use crate::remote::{Overrides, Servers};
use crate::FARVM_NS;

fn el(out: &mut String, indent: usize, name: &str, text: &str) {
    let _ = writeln!(out, "{:indent$}<{name}>{}</{name}>", "", escape(text));
}

fn char_device(out: &mut String, kind: &str, dev: &CharDevice) {
    let ty = match &dev.backend {
        CharBackend::Pty => "pty",
        CharBackend::File(_) => "file",
        CharBackend::Null => "null",
        CharBackend::Stdio => "stdio",
    };
    let _ = writeln!(out, "    <{kind} type='{ty}'>");
    if let CharBackend::File(p) = &dev.backend {
        let _ = writeln!(
            out,
            "      <source path='{}'/>",
            escape(p.to_string_lossy())
        );
    }
    if dev.target_type.is_some() || dev.target_port.is_some() {
        out.push_str("      <target");
        if let Some(t) = &dev.target_type {
            let _ = write!(out, " type='{}'", escape(t.as_str()));
        }
        if let Some(p) = dev.target_port {
            let _ = write!(out, " port='{p}'");
        }
        out.push_str("/>\n");
    }
    let _ = writeln!(out, "    </{kind}>");
}

fn disk(out: &mut String, d: &Disk) {
    let (ty, key) = if d.block {
        ("block", "dev")
    } else {
        ("file", "file")
    };
    let _ = writeln!(out, "    <disk type='{ty}' device='disk'>");
    out.push_str("      <driver name='qemu' type='raw'/>\n");
    let _ = writeln!(
        out,
        "      <source {key}='{}'/>",
        escape(d.source.to_string_lossy())
    );
    let _ = writeln!(
        out,
        "      <target dev='{}' bus='virtio'/>",
        escape(d.target.as_str())
    );
    if d.readonly {
        out.push_str("      <readonly/>\n");
    }
    out.push_str("    </disk>\n");
}

fn interface(out: &mut String, i: &Interface) {
    out.push_str("    <interface type='ethernet'>\n");
    if let Some(m) = &i.mac {
        let _ = writeln!(
            out,
            "      <mac address='{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}'/>",
            m[0], m[1], m[2], m[3], m[4], m[5]
        );
    }
    let _ = writeln!(out, "      <target dev='{}'/>", escape(i.tap.as_str()));
    out.push_str("      <model type='virtio'/>\n");
    out.push_str("    </interface>\n");
}

/// farvm's `<remote-memory>` element for `o` (indented for `<metadata>`).
pub fn metadata_xml(o: &Overrides) -> String {
    let mut out = format!("    <farvm:remote-memory xmlns:farvm='{FARVM_NS}'>\n");
    match &o.servers {
        Some(Servers::Memservers(list)) => {
            for a in list {
                let _ = writeln!(
                    out,
                    "      <farvm:memserver address='{}'/>",
                    escape(a.as_str())
                );
            }
        }
        Some(Servers::Pool(p)) => {
            match &p.name {
                Some(n) => {
                    let _ = writeln!(out, "      <farvm:pool name='{}'>", escape(n.as_str()));
                }
                None => out.push_str("      <farvm:pool>\n"),
            }
            for e in &p.endpoints {
                el(&mut out, 8, "farvm:endpoint", e);
            }
            out.push_str("      </farvm:pool>\n");
        }
        Some(Servers::Embedded) | None => {}
    }
    if let Some(v) = o.local_only {
        el(
            &mut out,
            6,
            "farvm:local-only",
            if v { "yes" } else { "no" },
        );
    }
    if let Some(v) = o.local_memory {
        el(&mut out, 6, "farvm:local-memory", &v.to_string());
    }
    if let Some(v) = &o.prefetcher {
        el(&mut out, 6, "farvm:prefetcher", v);
    }
    if let Some(v) = o.replicas {
        el(&mut out, 6, "farvm:replicas", &v.to_string());
    }
    if let Some(v) = &o.token_file {
        el(&mut out, 6, "farvm:token-file", &v.to_string_lossy());
    }
    if let Some(v) = o.page_space {
        el(&mut out, 6, "farvm:page-space", v.as_str());
    }
    if let Some(v) = o.probe_every {
        el(&mut out, 6, "farvm:probe-every", &v.to_string());
    }
    if let Some(v) = &o.metrics {
        let _ = writeln!(
            out,
            "      <farvm:metrics address='{}'/>",
            escape(v.as_str())
        );
    }
    out.push_str("    </farvm:remote-memory>\n");
    out
}

impl Domain {
    /// The domain as libvirt domain XML (memory in KiB).
    pub fn to_xml(&self) -> String {
        let mut out = format!("<domain type='{}'>\n", escape(self.domain_type.as_str()));
        el(&mut out, 2, "name", &self.name);
        if let Some(u) = &self.uuid {
            el(&mut out, 2, "uuid", &u.to_string());
        }
        if let Some(o) = &self.farvm {
            out.push_str("  <metadata>\n");
            out.push_str(&metadata_xml(o));
            out.push_str("  </metadata>\n");
        }
        let _ = writeln!(out, "  <memory unit='KiB'>{}</memory>", self.memory / 1024);
        if let Some(c) = self.current_memory {
            let _ = writeln!(
                out,
                "  <currentMemory unit='KiB'>{}</currentMemory>",
                c / 1024
            );
        }
        let _ = writeln!(out, "  <vcpu>{}</vcpu>", self.vcpus);
        out.push_str("  <os>\n    <type");
        if let Some(a) = &self.os.arch {
            let _ = write!(out, " arch='{}'", escape(a.as_str()));
        }
        if let Some(m) = &self.os.machine {
            let _ = write!(out, " machine='{}'", escape(m.as_str()));
        }
        let _ = writeln!(out, ">{}</type>", escape(self.os.os_type.as_str()));
        if let Some(k) = &self.os.kernel {
            el(&mut out, 4, "kernel", &k.to_string_lossy());
        }
        if let Some(i) = &self.os.initrd {
            el(&mut out, 4, "initrd", &i.to_string_lossy());
        }
        if let Some(c) = &self.os.cmdline {
            el(&mut out, 4, "cmdline", c);
        }
        out.push_str("  </os>\n");
        for (tag, a) in [
            ("on_poweroff", self.on_poweroff),
            ("on_reboot", self.on_reboot),
            ("on_crash", self.on_crash),
        ] {
            if let Some(a) = a {
                el(&mut out, 2, tag, a.as_str());
            }
        }
        if self.emulator.is_some()
            || self.serial.is_some()
            || self.console.is_some()
            || !self.disks.is_empty()
            || !self.interfaces.is_empty()
        {
            out.push_str("  <devices>\n");
            if let Some(e) = &self.emulator {
                el(&mut out, 4, "emulator", &e.to_string_lossy());
            }
            for d in &self.disks {
                disk(&mut out, d);
            }
            for i in &self.interfaces {
                interface(&mut out, i);
            }
            if let Some(s) = &self.serial {
                char_device(&mut out, "serial", s);
            }
            if let Some(c) = &self.console {
                char_device(&mut out, "console", c);
            }
            out.push_str("  </devices>\n");
        }
        out.push_str("</domain>\n");
        out
    }
}
