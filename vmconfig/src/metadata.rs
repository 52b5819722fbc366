//! farvm's element in a libvirt domain's `<metadata>`: the remote-memory settings of one domain.
//!
//! ```xml
//! <metadata>
//!   <farvm:remote-memory xmlns:farvm="https://farvm.dev/xmlns/domain/1">
//!     <farvm:memserver address="10.0.0.5:7070"/>      <!-- repeatable -->
//!     <farvm:local-memory>25%</farvm:local-memory>   <!-- or <... unit='MiB'>256</...>, all -->
//!     <farvm:prefetcher>leap+stream</farvm:prefetcher>
//!     <farvm:replicas>2</farvm:replicas>
//!     <farvm:token-file>/etc/farvm/tokens/web-1</farvm:token-file>
//!   </farvm:remote-memory>
//! </metadata>
//! ```
//!
//! Every element inside `remote-memory` must be in the farvm namespace ([`crate::FARVM_NS`]);
//! an unknown or un-namespaced one is an error (a typo must not silently drop a setting).

use std::path::PathBuf;

use crate::error::ConfigError;
use crate::remote::{
    check_host_port, check_prefetcher, LocalShare, Overrides, PageSpace, Pool, Servers,
};
use crate::xml::Element;
use crate::FARVM_NS;

/// Local name of farvm's metadata element.
pub const ELEMENT: &str = "remote-memory";

fn invalid(el: &Element, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        element: format!("farvm:{}", el.name),
        line: el.line,
        message: message.into(),
    }
}

fn set_once<T>(slot: &mut Option<T>, el: &Element, value: T) -> Result<(), ConfigError> {
    if slot.is_some() {
        return Err(invalid(el, "given twice"));
    }
    *slot = Some(value);
    Ok(())
}

fn no_attrs(el: &Element, allowed: &[&str]) -> Result<(), ConfigError> {
    match el
        .attrs
        .iter()
        .find(|a| a.ns.is_some() || !allowed.contains(&a.name.as_str()))
    {
        Some(a) => Err(invalid(el, format!("unknown attribute `{}`", a.name))),
        None => Ok(()),
    }
}

fn leaf_text(el: &Element) -> Result<&str, ConfigError> {
    if let Some(c) = el.children.first() {
        return Err(invalid(el, format!("takes text, not <{}>", c.name)));
    }
    let t = el.trimmed_text();
    if t.is_empty() {
        return Err(invalid(el, "is empty"));
    }
    Ok(t)
}

fn yes_no(el: &Element) -> Result<bool, ConfigError> {
    if el.trimmed_text().is_empty() && el.children.is_empty() {
        return Ok(true);
    }
    match leaf_text(el)? {
        "yes" | "on" | "true" => Ok(true),
        "no" | "off" | "false" => Ok(false),
        other => Err(invalid(el, format!("`{other}` is not yes or no"))),
    }
}

fn number(el: &Element, min: u32) -> Result<u32, ConfigError> {
    let t = leaf_text(el)?;
    match t.parse::<u32>() {
        Ok(n) if n >= min => Ok(n),
        _ => Err(invalid(
            el,
            format!("`{t}` is not an integer of at least {min}"),
        )),
    }
}

/// Reads farvm's `<remote-memory>` element (already known to be in [`FARVM_NS`]).
pub fn parse(root: &Element) -> Result<Overrides, ConfigError> {
    no_attrs(root, &[])?;
    if !root.trimmed_text().is_empty() {
        return Err(invalid(root, "holds text; settings go in child elements"));
    }
    let mut o = Overrides::default();
    let mut memservers: Vec<String> = Vec::new();
    let mut memserver_line = None;
    let mut pool: Option<Pool> = None;
    let mut pool_line = None;
    for el in &root.children {
        if el.ns.as_deref() != Some(FARVM_NS) {
            return Err(ConfigError::Invalid {
                element: el.name.clone(),
                line: el.line,
                message: format!(
                    "elements inside farvm:{ELEMENT} must be in its namespace {FARVM_NS} \
                     (write <farvm:{}>)",
                    el.name
                ),
            });
        }
        match el.name.as_str() {
            "memserver" => {
                no_attrs(el, &["address"])?;
                let addr = el
                    .attr("address")
                    .ok_or_else(|| invalid(el, "needs address='HOST:PORT'"))?;
                check_host_port(addr).map_err(|e| invalid(el, e))?;
                memservers.push(addr.to_string());
                memserver_line.get_or_insert(el.line);
            }
            "pool" => {
                no_attrs(el, &["name"])?;
                let mut endpoints = Vec::new();
                for ep in &el.children {
                    if ep.ns.as_deref() != Some(FARVM_NS) || ep.name != "endpoint" {
                        return Err(invalid(
                            el,
                            format!("takes <farvm:endpoint> children, not <{}>", ep.name),
                        ));
                    }
                    no_attrs(ep, &[])?;
                    endpoints.push(leaf_text(ep)?.to_string());
                }
                if endpoints.is_empty() {
                    return Err(invalid(el, "needs at least one <farvm:endpoint>"));
                }
                let name = el.attr("name").map(str::to_string);
                set_once(&mut pool, el, Pool { name, endpoints })?;
                pool_line = Some(el.line);
            }
            "local-only" => {
                no_attrs(el, &[])?;
                let v = yes_no(el)?;
                set_once(&mut o.local_only, el, v)?;
            }
            "local-memory" => {
                no_attrs(el, &["unit"])?;
                let t = leaf_text(el)?;
                let share = match el.attr("unit") {
                    Some(unit) => crate::units::parse_scaled(t, Some(unit), 1)
                        .and_then(|b| {
                            if b == 0 {
                                Err("must be more than 0 bytes".to_string())
                            } else {
                                Ok(LocalShare::Bytes(b))
                            }
                        })
                        .map_err(|e| invalid(el, e))?,
                    None => LocalShare::parse(t).map_err(|e| invalid(el, e))?,
                };
                set_once(&mut o.local_memory, el, share)?;
            }
            "prefetcher" => {
                no_attrs(el, &[])?;
                let t = leaf_text(el)?;
                check_prefetcher(t).map_err(|e| invalid(el, e))?;
                set_once(&mut o.prefetcher, el, t.to_string())?;
            }
            "replicas" => {
                no_attrs(el, &[])?;
                let n = number(el, 1)?;
                set_once(&mut o.replicas, el, n)?;
            }
            "token-file" => {
                no_attrs(el, &[])?;
                let t = leaf_text(el)?;
                set_once(&mut o.token_file, el, PathBuf::from(t))?;
            }
            "page-space" => {
                no_attrs(el, &[])?;
                let p = PageSpace::parse(leaf_text(el)?).map_err(|e| invalid(el, e))?;
                set_once(&mut o.page_space, el, p)?;
            }
            "probe-every" => {
                no_attrs(el, &[])?;
                let n = number(el, 0)?;
                set_once(&mut o.probe_every, el, n)?;
            }
            "metrics" => {
                no_attrs(el, &["address"])?;
                let addr = el
                    .attr("address")
                    .ok_or_else(|| invalid(el, "needs address='ADDR:PORT'"))?;
                addr.parse::<std::net::SocketAddr>()
                    .map_err(|_| invalid(el, format!("`{addr}` is not an IP address and port")))?;
                set_once(&mut o.metrics, el, addr.to_string())?;
            }
            other => {
                return Err(invalid(
                    el,
                    format!(
                        "farvm's namespace has no element <{other}> (known: memserver, pool, \
                         local-only, local-memory, prefetcher, replicas, token-file, \
                         page-space, probe-every, metrics)"
                    ),
                ))
            }
        }
    }
    o.servers = match (memservers.is_empty(), pool) {
        (true, None) => None,
        (false, None) => Some(Servers::Memservers(memservers)),
        (true, Some(p)) => Some(Servers::Pool(p)),
        (false, Some(_)) => {
            return Err(ConfigError::Invalid {
                element: "farvm:pool".into(),
                line: pool_line.or(memserver_line).unwrap_or(root.line),
                message: "give memory servers either as <farvm:memserver> or as a \
                          <farvm:pool>, not both"
                    .into(),
            })
        }
    };
    Ok(o)
}
