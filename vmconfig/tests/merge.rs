//! Merging: domain metadata over the host's domain section over the host's defaults over
//! farvm's defaults, and the resulting `farvm run` command line.

use std::path::Path;

use farvm_vmconfig::{merge, Domain, HostConfig, LocalShare, PageSpace, Pool, Serial, Servers};

const HOST: &str = r#"
[defaults]
memservers = ["10.0.0.5:7070", "10.0.0.6:7070"]
local_memory = "50%"
replicas = 2
token_file = "/etc/farvm/tokens/default"
probe_every = 64

[domain."web-1"]
local_memory = "40%"
prefetcher = "next-n"
token_file = "/etc/farvm/tokens/web-1-host"
"#;

fn host() -> HostConfig {
    HostConfig::parse(HOST, Path::new("farvm.toml")).unwrap()
}

fn domain(name: &str, metadata: &str, devices: &str) -> Domain {
    let xml = format!(
        "<domain type='kvm'><name>{name}</name><metadata>{metadata}</metadata>\
         <memory unit='MiB'>256</memory><vcpu>2</vcpu>\
         <os><type>hvm</type><kernel>/k.elf</kernel><cmdline>farvm.workload=seq:ws=32M</cmdline></os>\
         <devices>{devices}</devices></domain>"
    );
    Domain::parse(&xml).unwrap().domain
}

const NS: &str = "xmlns:farvm='https://farvm.dev/xmlns/domain/1'";

#[test]
fn each_field_comes_from_the_first_layer_that_sets_it() {
    let d = domain(
        "web-1",
        &format!(
            "<farvm:remote-memory {NS}><farvm:local-memory>25%</farvm:local-memory></farvm:remote-memory>"
        ),
        "",
    );
    let s = merge(&d, &host());
    let r = &s.remote;
    assert_eq!(r.local_memory, LocalShare::Percent(25.0), "domain XML");
    assert_eq!(r.prefetcher, "next-n", "host domain section");
    assert_eq!(
        r.token_file.as_deref(),
        Some(Path::new("/etc/farvm/tokens/web-1-host")),
        "host domain section over defaults"
    );
    assert_eq!(r.replicas, Some(2), "host defaults");
    assert_eq!(r.probe_every, Some(64), "host defaults");
    assert_eq!(r.page_space, PageSpace::Virtual, "farvm default");
    assert!(!r.local_only, "farvm default");
    assert_eq!(
        r.servers,
        Servers::Memservers(vec!["10.0.0.5:7070".into(), "10.0.0.6:7070".into()])
    );
}

#[test]
fn a_domain_without_a_section_gets_the_defaults() {
    let s = merge(&domain("other", "", ""), &host());
    assert_eq!(s.remote.local_memory, LocalShare::Percent(50.0));
    assert_eq!(s.remote.prefetcher, farvm_prefetch::registry::DEFAULT);
    assert_eq!(
        s.remote.token_file.as_deref(),
        Some(Path::new("/etc/farvm/tokens/default"))
    );
}

#[test]
fn no_host_file_means_farvm_defaults() {
    let s = merge(&domain("x", "", ""), &HostConfig::default());
    assert_eq!(s.remote.servers, Servers::Embedded);
    assert_eq!(s.remote.local_memory, LocalShare::Percent(50.0));
    assert_eq!(s.remote.replicas, None);
    assert_eq!(s.serial, Serial::Null);
    assert_eq!(
        (s.memory, s.vcpus, s.kernel.as_deref(), s.cmdline.as_deref()),
        (
            256 << 20,
            2,
            Some(Path::new("/k.elf")),
            Some("farvm.workload=seq:ws=32M")
        )
    );
    assert_eq!(s.remote.prefetcher, "leap+stream");
    assert_eq!(s.remote.page_space, PageSpace::Virtual);
    assert!(!s.remote.local_only);
}

#[test]
fn memserver_choice_is_one_field() {
    // The domain's single server replaces the host's list (not appended to it).
    let d = domain(
        "web-1",
        &format!(
            "<farvm:remote-memory {NS}><farvm:memserver address='m:1'/></farvm:remote-memory>"
        ),
        "",
    );
    let s = merge(&d, &host());
    assert_eq!(s.remote.servers, Servers::Memservers(vec!["m:1".into()]));
}

#[test]
fn every_remote_setting_is_merged() {
    let d = domain(
        "web-1",
        &format!(
            "<farvm:remote-memory {NS}><farvm:page-space>physical</farvm:page-space>\
             <farvm:metrics address='127.0.0.1:9300'/></farvm:remote-memory>"
        ),
        "<serial type='file'><source path='/tmp/c.log'/></serial>",
    );
    let s = merge(&d, &host());
    assert_eq!(s.serial, Serial::File("/tmp/c.log".into()));
    let r = &s.remote;
    assert_eq!(r.metrics.as_deref(), Some("127.0.0.1:9300"));
    assert_eq!(
        r.servers,
        Servers::Memservers(vec!["10.0.0.5:7070".into(), "10.0.0.6:7070".into()])
    );
    assert_eq!(r.local_memory, LocalShare::Percent(40.0));
    assert_eq!(r.prefetcher, "next-n");
    assert_eq!(r.replicas, Some(2));
    assert_eq!(
        r.token_file.as_deref(),
        Some(Path::new("/etc/farvm/tokens/web-1-host"))
    );
    assert_eq!(r.page_space, PageSpace::Physical);
    assert_eq!(r.probe_every, Some(64));
}

#[test]
fn local_only_a_pty_console_and_a_pool() {
    let d = domain(
        "x",
        &format!("<farvm:remote-memory {NS}><farvm:local-only/></farvm:remote-memory>"),
        "<console type='pty'><target type='virtio'/></console>",
    );
    let s = merge(&d, &host());
    assert!(s.remote.local_only);
    assert_eq!(s.serial, Serial::Pty);
    let pool = domain(
        "y",
        &format!(
            "<farvm:remote-memory {NS}><farvm:pool><farvm:endpoint>http://e:2379</farvm:endpoint></farvm:pool></farvm:remote-memory>"
        ),
        "",
    );
    assert_eq!(
        merge(&pool, &host()).remote.servers,
        Servers::Pool(Pool {
            name: None,
            endpoints: vec!["http://e:2379".into()]
        })
    );
}
