//! `HostConfig::load_default` follows `$FARVM_CONFIG` (its own test binary: it sets the
//! process environment).

use farvm_vmconfig::host::{HostConfig, ENV_VAR};
use farvm_vmconfig::LocalShare;

#[test]
fn farvm_config_names_the_file() {
    let dir = std::env::temp_dir().join(format!("farvm-vmconfig-env-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("host.toml");
    std::fs::write(&p, "[defaults]\nlocal_memory = \"30%\"\n").unwrap();
    std::env::set_var(ENV_VAR, &p);
    let h = HostConfig::load_default().unwrap();
    assert_eq!(h.path.as_deref(), Some(p.as_path()));
    assert_eq!(h.defaults.local_memory, Some(LocalShare::Percent(30.0)));
    // A named file that does not exist is an error, not silently the defaults.
    std::env::set_var(ENV_VAR, dir.join("absent.toml"));
    let e = HostConfig::load_default().unwrap_err().to_string();
    assert!(e.contains("absent.toml"), "{e}");
    std::env::remove_var(ENV_VAR);
    let _ = std::fs::remove_dir_all(&dir);
}
