//! The libvirt domain XML subset farvm reads (`farvm run --domain FILE.xml`, and the domain a
//! libvirt driver hands farvm): name, uuid, memory/currentMemory, vcpu, os (type, kernel,
//! initrd, cmdline), serial/console, disks, network interfaces (`<interface type='ethernet'>`
//! on a tap: other types are refused), on_poweroff/on_reboot/on_crash, the emulator path, and
//! farvm's own `<metadata>` element ([`crate::metadata`]).
//!
//! Anything else libvirt allows is reported as a [`Warning`] naming the element and ignored
//! (except what libvirt itself adds to every domain it stores: `<os><boot>` with a kernel,
//! `<clock offset='utc'/>`, `<controller>`s), unless ignoring it would give the guest a
//! different VM than described: `<memoryBacking>` (huge pages, locked or shared memory),
//! `<numatune>` and `<cpu><numa>` are refused;
//! XML that is not well-formed, or a value farvm cannot use, is a [`ConfigError`] naming the
//! element and line.

use std::fmt;
use std::path::PathBuf;

use crate::error::{ConfigError, Warning};
use crate::remote::Overrides;
use crate::xml::Element;
use crate::FARVM_NS;

/// Most vCPUs farvm runs (`farvm run --vcpus`).
pub const MAX_VCPUS: u32 = 255;

/// A domain UUID (RFC 4122 layout; libvirt accepts it with or without dashes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Uuid(pub [u8; 16]);

impl Uuid {
    /// Parses 32 hex digits, optionally split by dashes (libvirt's `virUUIDParse`).
    pub fn parse(s: &str) -> Result<Self, String> {
        let t = s.trim();
        let hex: Vec<u8> = t.bytes().filter(|&b| b != b'-').collect();
        if hex.len() != 32 || !hex.iter().all(u8::is_ascii_hexdigit) {
            return Err(format!("`{t}` is not a UUID (32 hex digits)"));
        }
        let nibble = |b: u8| (b as char).to_digit(16).unwrap_or(0) as u8;
        let mut out = [0u8; 16];
        for (i, o) in out.iter_mut().enumerate() {
            *o = nibble(hex[2 * i]) << 4 | nibble(hex[2 * i + 1]);
        }
        Ok(Uuid(out))
    }
}

impl fmt::Display for Uuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, b) in self.0.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                f.write_str("-")?;
            }
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// What happens when the guest powers off, reboots or crashes (`on_poweroff` ...).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LifecycleAction {
    /// `destroy`: stop the domain.
    Destroy,
    /// `restart`: start it again.
    Restart,
    /// `preserve`: keep its resources for inspection.
    Preserve,
    /// `rename-restart`: start it again under a new name.
    RenameRestart,
    /// `coredump-destroy`: dump the guest's memory, then stop.
    CoredumpDestroy,
    /// `coredump-restart`: dump the guest's memory, then start again.
    CoredumpRestart,
}

impl LifecycleAction {
    /// Every action, in libvirt's schema order.
    pub const ALL: [LifecycleAction; 6] = [
        LifecycleAction::Destroy,
        LifecycleAction::Restart,
        LifecycleAction::Preserve,
        LifecycleAction::RenameRestart,
        LifecycleAction::CoredumpDestroy,
        LifecycleAction::CoredumpRestart,
    ];

    /// The name in domain XML.
    pub fn as_str(self) -> &'static str {
        match self {
            LifecycleAction::Destroy => "destroy",
            LifecycleAction::Restart => "restart",
            LifecycleAction::Preserve => "preserve",
            LifecycleAction::RenameRestart => "rename-restart",
            LifecycleAction::CoredumpDestroy => "coredump-destroy",
            LifecycleAction::CoredumpRestart => "coredump-restart",
        }
    }

    /// Whether libvirt's schema allows this action for `on_poweroff`/`on_reboot` (the coredump
    /// ones are for `on_crash` only).
    pub fn allowed_outside_crash(self) -> bool {
        !matches!(
            self,
            LifecycleAction::CoredumpDestroy | LifecycleAction::CoredumpRestart
        )
    }

    fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.as_str() == s)
    }
}

/// A character device backing the guest's serial port or console.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CharBackend {
    /// A pseudo-terminal (libvirt reports its path).
    Pty,
    /// Appended to / written into a file (`<source path='...'/>`).
    File(PathBuf),
    /// Discarded.
    Null,
    /// The VMM's standard output.
    Stdio,
}

/// `<serial>` or `<console>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CharDevice {
    /// Where its bytes go.
    pub backend: CharBackend,
    /// `<target type='...'>` (`serial` or `virtio` for a console; `isa-serial` ... for serial).
    pub target_type: Option<String>,
    /// `<target port='N'>`.
    pub target_port: Option<u32>,
}

/// `<os>`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Os {
    /// `<type>`: `hvm` is the only one farvm runs.
    pub os_type: String,
    /// `<type arch=...>`.
    pub arch: Option<String>,
    /// `<type machine=...>`.
    pub machine: Option<String>,
    /// `<kernel>`: the kernel to boot directly.
    pub kernel: Option<PathBuf>,
    /// `<initrd>`.
    pub initrd: Option<PathBuf>,
    /// `<cmdline>`: the kernel command line.
    pub cmdline: Option<String>,
}

/// A `<disk>`: a raw image file or block device the guest sees as a virtio-blk disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Disk {
    /// `<source file=...>` (type `file`) or `<source dev=...>` (type `block`).
    pub source: PathBuf,
    /// Whether the source is a block device (`type='block'`).
    pub block: bool,
    /// `<target dev=...>`: `vda`, `vdb`, ... (farvm attaches disks in this order).
    pub target: String,
    /// `<readonly/>`.
    pub readonly: bool,
}

impl Disk {
    /// The target of the disk attached `index`-th (`vda` for 0): `None` past `vdz`.
    pub fn target_of(index: usize) -> Option<String> {
        (index < 26).then(|| format!("vd{}", char::from(b'a' + index as u8)))
    }
}

/// A MAC address.
pub type Mac = [u8; 6];

/// An `<interface type='ethernet'>`: a tap device on the host the guest sees as a virtio-net
/// device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interface {
    /// `<target dev=...>`: the host's tap device (opened, or created, by that name).
    pub tap: String,
    /// `<mac address=...>` [`None`: farvm derives one from the tap's name].
    pub mac: Option<Mac>,
}

/// Longest network interface name Linux takes (`IFNAMSIZ` less the NUL).
pub const MAX_TAP_NAME: usize = 15;

/// Parses a MAC address `aa:bb:cc:dd:ee:ff` (or with dashes); a multicast address (the low bit
/// of the first byte) is refused, as no NIC may have one.
pub fn parse_mac(s: &str) -> Result<Mac, String> {
    let bad = || format!("`{s}` is not a MAC address (six hex bytes, aa:bb:cc:dd:ee:ff)");
    let parts: Vec<&str> = s.split([':', '-']).collect();
    if parts.len() != 6 {
        return Err(bad());
    }
    let mut mac = [0u8; 6];
    for (m, p) in mac.iter_mut().zip(&parts) {
        if p.len() != 2 {
            return Err(bad());
        }
        *m = u8::from_str_radix(p, 16).map_err(|_| bad())?;
    }
    if mac[0] & 1 != 0 {
        return Err(format!(
            "`{s}` is a multicast address; a network interface needs a unicast one"
        ));
    }
    Ok(mac)
}

/// Checks a tap name Linux would take: 1 to 15 bytes, no '/', ':', whitespace or NUL.
pub fn check_tap_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_TAP_NAME
        && name != "."
        && name != ".."
        && !name
            .chars()
            .any(|c| c == '/' || c == ':' || c.is_whitespace() || c == '\0');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "`{name}` is not a network interface name (1 to {MAX_TAP_NAME} bytes, no '/', ':' \
             or spaces)"
        ))
    }
}

/// The parts of a libvirt domain farvm uses. Memory sizes are in bytes (whole KiB, as libvirt
/// keeps them).
#[derive(Clone, Debug, PartialEq)]
pub struct Domain {
    /// `<domain type=...>`: always `kvm` (what libvirt's Cloud Hypervisor driver uses).
    pub domain_type: String,
    /// `<name>`.
    pub name: String,
    /// `<uuid>`.
    pub uuid: Option<Uuid>,
    /// `<memory>`: the guest's RAM.
    pub memory: u64,
    /// `<currentMemory>`, when given (at most `memory`).
    pub current_memory: Option<u64>,
    /// `<vcpu>`.
    pub vcpus: u32,
    /// `<os>`.
    pub os: Os,
    /// `<on_poweroff>`.
    pub on_poweroff: Option<LifecycleAction>,
    /// `<on_reboot>`.
    pub on_reboot: Option<LifecycleAction>,
    /// `<on_crash>`.
    pub on_crash: Option<LifecycleAction>,
    /// `<devices><emulator>`.
    pub emulator: Option<PathBuf>,
    /// The first `<serial>`.
    pub serial: Option<CharDevice>,
    /// The first `<console>`.
    pub console: Option<CharDevice>,
    /// `<disk>`s, in document order.
    pub disks: Vec<Disk>,
    /// `<interface>`s, in document order (the guest's eth0, eth1, ...).
    pub interfaces: Vec<Interface>,
    /// farvm's `<metadata>` element, when present.
    pub farvm: Option<Overrides>,
    /// Where the elements above are in the document, for errors found after parsing.
    pub lines: Lines,
}

/// The 1-based line of each element a later check may need to name (`None`: absent, or the
/// domain was not parsed from text). Where a domain was written is not part of what it says:
/// two domains that differ only in their lines are equal.
#[derive(Clone, Debug, Default)]
pub struct Lines {
    /// `<name>`.
    pub name: Option<u32>,
    /// `<memory>`.
    pub memory: Option<u32>,
    /// `<vcpu>`.
    pub vcpu: Option<u32>,
    /// `<os><kernel>`, else `<os>`.
    pub kernel: Option<u32>,
    /// `<os><initrd>`.
    pub initrd: Option<u32>,
    /// `<os><cmdline>`.
    pub cmdline: Option<u32>,
    /// farvm's `<farvm:remote-memory>` element.
    pub remote_memory: Option<u32>,
    /// Each `<disk>` (as [`Domain::disks`]).
    pub disks: Vec<u32>,
    /// Each `<interface>` (as [`Domain::interfaces`]).
    pub interfaces: Vec<u32>,
}

impl PartialEq for Lines {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Lines {}

/// A parsed domain and what in it farvm ignores.
#[derive(Clone, Debug)]
pub struct ParsedDomain {
    /// What farvm reads.
    pub domain: Domain,
    /// What it ignores, in document order.
    pub warnings: Vec<Warning>,
}

fn invalid(el: &Element, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        element: el.name.clone(),
        line: el.line,
        message: message.into(),
    }
}

fn missing(parent: &Element, child: &str) -> ConfigError {
    ConfigError::Invalid {
        element: parent.name.clone(),
        line: parent.line,
        message: format!("needs a <{child}> element"),
    }
}

/// Collects warnings with their element paths.
struct Warnings(Vec<Warning>);

impl Warnings {
    fn element(&mut self, path: &str, el: &Element) {
        let what = match &el.ns {
            Some(ns) => format!("{path}/{{{ns}}}{}", el.name),
            None => format!("{path}/{}", el.name),
        };
        self.0.push(Warning {
            line: el.line,
            element: what.trim_start_matches('/').to_string(),
            message: "not supported by farvm; ignored".into(),
        });
    }

    /// Warns about every attribute of `el` not in `known`.
    fn attrs(&mut self, path: &str, el: &Element, known: &[&str]) {
        for a in &el.attrs {
            if a.ns.is_none() && known.contains(&a.name.as_str()) {
                continue;
            }
            self.0.push(Warning {
                line: el.line,
                element: format!("{path}@{}", a.name),
                message: format!("attribute `{}` is not supported by farvm; ignored", a.name),
            });
        }
    }

    fn note(&mut self, el: &Element, path: &str, message: impl Into<String>) {
        self.0.push(Warning {
            line: el.line,
            element: path.into(),
            message: message.into(),
        });
    }
}

/// Children of `el` named `name` (no namespace), and an error if there are more than one.
fn only<'a>(el: &'a Element, name: &str) -> Result<Option<&'a Element>, ConfigError> {
    let mut found = el
        .children
        .iter()
        .filter(|c| c.ns.is_none() && c.name == name);
    let first = found.next();
    if let Some(second) = found.next() {
        return Err(invalid(second, "given twice"));
    }
    Ok(first)
}

fn text_of(el: &Element) -> Result<&str, ConfigError> {
    if let Some(c) = el.children.first() {
        return Err(invalid(el, format!("takes text, not <{}>", c.name)));
    }
    Ok(el.trimmed_text())
}

fn nonempty_text(el: &Element) -> Result<&str, ConfigError> {
    let t = text_of(el)?;
    if t.is_empty() {
        return Err(invalid(el, "is empty"));
    }
    Ok(t)
}

fn memory(el: &Element, w: &mut Warnings) -> Result<u64, ConfigError> {
    w.attrs(&el.name, el, &["unit"]);
    crate::units::parse_memory(nonempty_text(el)?, el.attr("unit")).map_err(|e| invalid(el, e))
}

fn lifecycle(el: &Element, w: &mut Warnings) -> Result<LifecycleAction, ConfigError> {
    w.attrs(&el.name, el, &[]);
    let t = nonempty_text(el)?;
    let a = LifecycleAction::parse(t).ok_or_else(|| {
        invalid(
            el,
            format!(
                "`{t}` is not an action (destroy, restart, preserve, rename-restart{})",
                if el.name == "on_crash" {
                    ", coredump-destroy, coredump-restart"
                } else {
                    ""
                }
            ),
        )
    })?;
    if el.name != "on_crash" && !a.allowed_outside_crash() {
        return Err(invalid(el, format!("`{t}` is allowed only in <on_crash>")));
    }
    Ok(a)
}

fn vcpus(el: &Element, w: &mut Warnings) -> Result<u32, ConfigError> {
    w.attrs("vcpu", el, &["placement", "current"]);
    let t = nonempty_text(el)?;
    let n: u32 = t
        .parse()
        .map_err(|_| invalid(el, format!("`{t}` is not a vCPU count")))?;
    if n == 0 || n > MAX_VCPUS {
        return Err(invalid(
            el,
            format!("{n} vCPUs: farvm runs 1 to {MAX_VCPUS}"),
        ));
    }
    if let Some(cur) = el.attr("current") {
        match cur.trim().parse::<u32>() {
            Ok(c) if c >= 1 && c <= n => {
                if c < n {
                    w.note(
                        el,
                        "vcpu@current",
                        format!(
                            "farvm has no vCPU hotplug: all {n} vCPUs run (current={c} ignored)"
                        ),
                    );
                }
            }
            _ => return Err(invalid(el, format!("current=`{cur}` must be 1..={n}"))),
        }
    }
    Ok(n)
}

fn os(el: &Element, w: &mut Warnings) -> Result<Os, ConfigError> {
    w.attrs("os", el, &[]);
    let mut os = Os::default();
    let ty = only(el, "type")?.ok_or_else(|| missing(el, "type"))?;
    w.attrs("os/type", ty, &["arch", "machine"]);
    os.os_type = nonempty_text(ty)?.to_string();
    if os.os_type != "hvm" {
        return Err(invalid(
            ty,
            format!("`{}`: farvm runs only hvm guests", os.os_type),
        ));
    }
    os.arch = ty.attr("arch").map(str::to_string);
    if let Some(a) = &os.arch {
        if a != "x86_64" {
            return Err(invalid(ty, format!("arch `{a}`: farvm runs only x86_64")));
        }
    }
    os.machine = ty.attr("machine").map(str::to_string);
    let path = |name: &str, w: &mut Warnings| -> Result<Option<PathBuf>, ConfigError> {
        match only(el, name)? {
            Some(c) => {
                w.attrs(&format!("os/{name}"), c, &[]);
                Ok(Some(PathBuf::from(nonempty_text(c)?)))
            }
            None => Ok(None),
        }
    };
    os.kernel = path("kernel", w)?;
    os.initrd = path("initrd", w)?;
    if let Some(c) = only(el, "cmdline")? {
        w.attrs("os/cmdline", c, &[]);
        os.cmdline = Some(text_of(c)?.to_string());
    }
    if os.kernel.is_none() && (os.initrd.is_some() || os.cmdline.is_some()) {
        return Err(invalid(el, "<initrd> and <cmdline> need a <kernel>"));
    }
    for c in &el.children {
        let known = match c.name.as_str() {
            "type" | "kernel" | "initrd" | "cmdline" => true,
            // libvirt adds a boot order to every domain; a direct kernel boot has none.
            "boot" => os.kernel.is_some(),
            _ => false,
        };
        if c.ns.is_some() || !known {
            w.element("os", c);
        }
    }
    Ok(os)
}

fn char_device(
    el: &Element,
    path: &str,
    w: &mut Warnings,
) -> Result<Option<CharDevice>, ConfigError> {
    w.attrs(path, el, &["type"]);
    let ty = el
        .attr("type")
        .ok_or_else(|| invalid(el, "needs a type attribute (pty, file, null, stdio)"))?;
    let source_path = || -> Result<PathBuf, ConfigError> {
        let src = only(el, "source")?
            .ok_or_else(|| invalid(el, format!("type='{ty}' needs <source path='...'/>")))?;
        let p = src
            .attr("path")
            .filter(|p| !p.is_empty())
            .ok_or_else(|| invalid(src, "needs a path attribute"))?;
        Ok(PathBuf::from(p))
    };
    let backend = match ty {
        "pty" => CharBackend::Pty,
        "file" => CharBackend::File(source_path()?),
        "null" => CharBackend::Null,
        "stdio" => CharBackend::Stdio,
        other => {
            w.note(
                el,
                path,
                format!("type='{other}' is not supported by farvm (pty, file, null, stdio); device ignored"),
            );
            return Ok(None);
        }
    };
    let mut dev = CharDevice {
        backend,
        target_type: None,
        target_port: None,
    };
    if let Some(t) = only(el, "target")? {
        w.attrs(&format!("{path}/target"), t, &["type", "port"]);
        dev.target_type = t.attr("type").map(str::to_string);
        if let Some(p) = t.attr("port") {
            dev.target_port = Some(
                p.trim()
                    .parse()
                    .map_err(|_| invalid(t, format!("port=`{p}` is not a number")))?,
            );
        }
    }
    for c in &el.children {
        let known = match c.name.as_str() {
            "target" => true,
            "source" => ty == "file",
            _ => false,
        };
        if c.ns.is_some() || !known {
            w.element(path, c);
        }
    }
    Ok(Some(dev))
}

fn devices(el: &Element, d: &mut Domain, w: &mut Warnings) -> Result<(), ConfigError> {
    w.attrs("devices", el, &[]);
    if let Some(e) = only(el, "emulator")? {
        w.attrs("devices/emulator", e, &[]);
        d.emulator = Some(PathBuf::from(nonempty_text(e)?));
    }
    for c in &el.children {
        match (c.ns.is_some(), c.name.as_str()) {
            // libvirt adds controllers for the devices it keeps (e.g. virtio-serial for a
            // virtio console); farvm needs none.
            (false, "emulator" | "controller") => {}
            (false, kind @ ("serial" | "console")) => {
                let path = format!("devices/{kind}");
                let slot = if kind == "serial" {
                    &mut d.serial
                } else {
                    &mut d.console
                };
                let dev = char_device(c, &path, w)?;
                if slot.is_some() {
                    if dev.is_some() {
                        w.note(
                            c,
                            &path,
                            format!("farvm has one {kind}; this one is ignored"),
                        );
                    }
                } else {
                    *slot = dev;
                }
            }
            (false, "disk") => {
                d.disks.push(disk(c, w)?);
                d.lines.disks.push(c.line);
            }
            (false, "interface") => {
                d.interfaces.push(interface(c, w)?);
                d.lines.interfaces.push(c.line);
            }
            _ => w.element("devices", c),
        }
    }
    Ok(())
}

/// A `<disk>`: raw images only (a format farvm cannot read is an error, never a disk the guest
/// would see as garbage).
fn disk(el: &Element, w: &mut Warnings) -> Result<Disk, ConfigError> {
    w.attrs("devices/disk", el, &["type", "device"]);
    let block = match el.attr("type") {
        Some("file") => false,
        Some("block") => true,
        Some(t) => {
            return Err(invalid(
                el,
                format!(
                    "type='{t}': farvm's disks are image files (file) or block devices (block)"
                ),
            ))
        }
        None => return Err(invalid(el, "needs type='file' or type='block'")),
    };
    match el.attr("device").unwrap_or("disk") {
        "disk" => {}
        d => {
            return Err(invalid(
                el,
                format!("device='{d}': farvm has virtio-blk disks only"),
            ))
        }
    }
    if let Some(drv) = only(el, "driver")? {
        w.attrs(
            "devices/disk/driver",
            drv,
            &["name", "type", "cache", "discard"],
        );
        match drv.attr("type").unwrap_or("raw") {
            "raw" => {}
            f => {
                return Err(invalid(
                    drv,
                    format!(
                        "format {f}: farvm reads raw images only (convert one with \
                         `qemu-img convert -O raw IN OUT`)"
                    ),
                ))
            }
        }
    }
    let src = only(el, "source")?.ok_or_else(|| missing(el, "source"))?;
    let key = if block { "dev" } else { "file" };
    w.attrs("devices/disk/source", src, &[key]);
    let source = src
        .attr(key)
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .ok_or_else(|| invalid(src, format!("needs a {key} attribute")))?;
    let target = only(el, "target")?.ok_or_else(|| missing(el, "target"))?;
    w.attrs("devices/disk/target", target, &["dev", "bus"]);
    match target.attr("bus") {
        None | Some("virtio") => {}
        Some(b) => {
            return Err(invalid(
                target,
                format!("bus='{b}': farvm's disks are virtio (bus='virtio')"),
            ))
        }
    }
    let dev = target
        .attr("dev")
        .filter(|d| d.len() == 3 && d.starts_with("vd") && d.as_bytes()[2].is_ascii_lowercase())
        .ok_or_else(|| invalid(target, "needs dev='vdX' (vda, vdb, ...)"))?;
    let readonly = match only(el, "readonly")? {
        Some(r) => {
            w.attrs("devices/disk/readonly", r, &[]);
            true
        }
        None => false,
    };
    for c in &el.children {
        let known = c.ns.is_none()
            && matches!(
                c.name.as_str(),
                "driver" | "source" | "target" | "readonly" | "alias" | "address"
            );
        if !known {
            w.element("devices/disk", c);
        }
    }
    Ok(Disk {
        source,
        block,
        target: dev.to_string(),
        readonly,
    })
}

/// An `<interface>`: a tap device (`type='ethernet'`) with a virtio model. Other types (a
/// libvirt network, a bridge, user networking, macvtap, ...) are refused: farvm does not
/// create or plug taps itself, so it would give the guest no network where one was described.
fn interface(el: &Element, w: &mut Warnings) -> Result<Interface, ConfigError> {
    w.attrs("devices/interface", el, &["type"]);
    match el.attr("type") {
        Some("ethernet") => {}
        Some(t) => {
            return Err(invalid(
                el,
                format!(
                    "type='{t}': farvm attaches existing tap devices only (type='ethernet' with \
                     <target dev='TAP'/>); create the tap (and plug it into a bridge) on the host"
                ),
            ))
        }
        None => return Err(invalid(el, "needs type='ethernet'")),
    }
    let target = only(el, "target")?.ok_or_else(|| missing(el, "target"))?;
    w.attrs("devices/interface/target", target, &["dev", "managed"]);
    let tap = target
        .attr("dev")
        .ok_or_else(|| invalid(target, "needs dev='TAP' (the host's tap device)"))?;
    check_tap_name(tap).map_err(|m| invalid(target, m))?;
    let mac = match only(el, "mac")? {
        Some(m) => {
            w.attrs("devices/interface/mac", m, &["address"]);
            let a = m
                .attr("address")
                .ok_or_else(|| invalid(m, "needs an address attribute"))?;
            Some(parse_mac(a).map_err(|e| invalid(m, e))?)
        }
        None => None,
    };
    if let Some(model) = only(el, "model")? {
        w.attrs("devices/interface/model", model, &["type"]);
        match model.attr("type") {
            None | Some("virtio") => {}
            Some(t) => {
                return Err(invalid(
                    model,
                    format!("type='{t}': farvm's network device is virtio (type='virtio')"),
                ))
            }
        }
    }
    for c in &el.children {
        let known = c.ns.is_none()
            && matches!(
                c.name.as_str(),
                "target" | "mac" | "model" | "alias" | "address"
            );
        if !known {
            w.element("devices/interface", c);
        }
    }
    Ok(Interface {
        tap: tap.to_string(),
        mac,
    })
}

fn metadata(el: &Element, w: &mut Warnings) -> Result<Option<Overrides>, ConfigError> {
    let mut found: Option<Overrides> = None;
    for c in &el.children {
        match c.ns.as_deref() {
            Some(FARVM_NS) if c.name == crate::metadata::ELEMENT => {
                if found.is_some() {
                    return Err(invalid(c, "farvm's metadata element is given twice"));
                }
                found = Some(crate::metadata::parse(c)?);
            }
            Some(FARVM_NS) => {
                return Err(ConfigError::Invalid {
                    element: format!("farvm:{}", c.name),
                    line: c.line,
                    message: format!(
                        "farvm's metadata element is <farvm:{}>",
                        crate::metadata::ELEMENT
                    ),
                })
            }
            // Another application's metadata; a look-alike of ours (wrong namespace URI, no
            // namespace) is most likely a mistake and is pointed out.
            ns if c.name == crate::metadata::ELEMENT || ns.is_some_and(|n| n.contains("farvm")) => {
                w.note(
                    c,
                    "metadata",
                    format!(
                        "<{}> in namespace {} is not farvm's (farvm reads <{}> in {FARVM_NS}); ignored",
                        c.name,
                        ns.unwrap_or("(none)"),
                        crate::metadata::ELEMENT
                    ),
                );
            }
            _ => {}
        }
    }
    Ok(found)
}

impl Domain {
    /// Parses a libvirt domain XML document.
    pub fn parse(xml: &str) -> Result<ParsedDomain, ConfigError> {
        let root = crate::xml::parse(xml)?;
        Self::from_element(&root)
    }

    /// Reads a domain from an already parsed `<domain>` element.
    pub fn from_element(root: &Element) -> Result<ParsedDomain, ConfigError> {
        if root.ns.is_some() || root.name != "domain" {
            return Err(invalid(root, "the root element must be <domain>"));
        }
        let mut w = Warnings(Vec::new());
        w.attrs("domain", root, &["type", "id"]);
        let domain_type = root
            .attr("type")
            .ok_or_else(|| invalid(root, "needs type='kvm'"))?;
        if domain_type != "kvm" {
            return Err(invalid(
                root,
                format!("type='{domain_type}': farvm runs domains of type 'kvm'"),
            ));
        }
        let name_el = only(root, "name")?.ok_or_else(|| missing(root, "name"))?;
        let name = nonempty_text(name_el)?.to_string();
        if name.contains('/') || name.chars().any(char::is_control) {
            return Err(invalid(
                name_el,
                format!("`{name}`: a domain name holds no `/` or control characters"),
            ));
        }
        let uuid = only(root, "uuid")?
            .map(|u| Uuid::parse(text_of(u)?).map_err(|e| invalid(u, e)))
            .transpose()?;
        let mem_el = only(root, "memory")?.ok_or_else(|| missing(root, "memory"))?;
        let memory = memory(mem_el, &mut w)?;
        if memory == 0 {
            return Err(invalid(mem_el, "must be more than 0"));
        }
        let current_memory = match only(root, "currentMemory")? {
            Some(c) => {
                let m = memory_checked(c, memory, &mut w)?;
                Some(m)
            }
            None => None,
        };
        let vcpus = match only(root, "vcpu")? {
            Some(v) => vcpus(v, &mut w)?,
            None => 1,
        };
        let os_el = only(root, "os")?.ok_or_else(|| missing(root, "os"))?;
        let os = os(os_el, &mut w)?;
        let line_of = |parent: &Element, name: &str| {
            parent
                .children
                .iter()
                .find(|c| c.ns.is_none() && c.name == name)
                .map(|c| c.line)
        };
        let lines = Lines {
            name: Some(name_el.line),
            memory: Some(mem_el.line),
            vcpu: line_of(root, "vcpu"),
            kernel: line_of(os_el, "kernel").or(Some(os_el.line)),
            initrd: line_of(os_el, "initrd"),
            cmdline: line_of(os_el, "cmdline"),
            remote_memory: root
                .children
                .iter()
                .filter(|c| c.ns.is_none() && c.name == "metadata")
                .flat_map(|m| m.children.iter())
                .find(|c| c.ns.as_deref() == Some(FARVM_NS) && c.name == crate::metadata::ELEMENT)
                .map(|c| c.line),
            disks: Vec::new(),
            interfaces: Vec::new(),
        };
        let mut d = Domain {
            domain_type: domain_type.to_string(),
            name,
            uuid,
            memory,
            current_memory,
            vcpus,
            os,
            on_poweroff: None,
            on_reboot: None,
            on_crash: None,
            emulator: None,
            serial: None,
            console: None,
            disks: Vec::new(),
            interfaces: Vec::new(),
            farvm: None,
            lines,
        };
        for (tag, slot) in [
            ("on_poweroff", &mut d.on_poweroff),
            ("on_reboot", &mut d.on_reboot),
            ("on_crash", &mut d.on_crash),
        ] {
            if let Some(el) = only(root, tag)? {
                *slot = Some(lifecycle(el, &mut w)?);
            }
        }
        if let Some(dev) = only(root, "devices")? {
            devices(dev, &mut d, &mut w)?;
        }
        if let Some(m) = only(root, "metadata")? {
            d.farvm = metadata(m, &mut w)?;
        }
        for c in &root.children {
            refuse_unhonoured(c)?;
            // libvirt writes `<clock offset='utc'/>` into every domain: the guest clock farvm
            // gives (the host's, in UTC).
            let utc_clock = c.name == "clock"
                && c.attrs.len() == 1
                && c.attr("offset") == Some("utc")
                && c.children.is_empty();
            let known = utc_clock
                || c.ns.is_none()
                    && matches!(
                        c.name.as_str(),
                        "name"
                            | "uuid"
                            | "title"
                            | "description"
                            | "metadata"
                            | "memory"
                            | "currentMemory"
                            | "vcpu"
                            | "os"
                            | "on_poweroff"
                            | "on_reboot"
                            | "on_crash"
                            | "devices"
                    );
            if !known {
                w.element("", c);
            }
        }
        // In document order (stable: an element's own notes keep their order).
        let mut warnings = w.0;
        warnings.sort_by_key(|w| w.line);
        Ok(ParsedDomain {
            domain: d,
            warnings,
        })
    }
}

/// Refuses a top-level element whose setting would change what the guest gets or how its
/// memory is held, and which farvm cannot honour: running the domain without it would give
/// the operator a different VM than the one described. (Elements that change nothing the guest
/// relies on are warned about and ignored instead.)
fn refuse_unhonoured(c: &Element) -> Result<(), ConfigError> {
    if c.ns.is_some() {
        return Ok(());
    }
    match c.name.as_str() {
        "memoryBacking" => match c.children.first() {
            Some(first) => Err(invalid(
                first,
                format!(
                    "<memoryBacking><{}> is not supported: farvm holds guest RAM itself (a \
                     memfd or anonymous memory of 4 KiB pages, paged to the memory servers), \
                     so huge pages, locked, shared or file-backed guest memory cannot be \
                     given; remove <memoryBacking>",
                    first.name
                ),
            )),
            None => Ok(()),
        },
        "numatune" => Err(invalid(
            c,
            "NUMA placement is not supported: farvm gives the guest one NUMA node and \
             places its memory itself; remove <numatune>",
        )),
        "cpu" => match c
            .children
            .iter()
            .find(|n| n.ns.is_none() && n.name == "numa")
        {
            Some(numa) => Err(invalid(
                numa,
                "guest NUMA cells are not supported: farvm gives the guest one NUMA node; \
                 remove <cpu><numa>",
            )),
            None => Ok(()),
        },
        _ => Ok(()),
    }
}

fn memory_checked(c: &Element, max: u64, w: &mut Warnings) -> Result<u64, ConfigError> {
    let m = memory(c, w)?;
    if m == 0 || m > max {
        return Err(invalid(
            c,
            format!("{m} bytes must be more than 0 and at most <memory> ({max} bytes)"),
        ));
    }
    if m < max {
        w.note(
            c,
            "currentMemory",
            "farvm has no balloon: the guest gets all of <memory>",
        );
    }
    Ok(m)
}
