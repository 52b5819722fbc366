//! Fuzz target: an API request as the server sees it — method, path and body (the input's
//! first two lines, then the rest) — must never panic the router or the `vm.create` parser;
//! every refusal must be a Cloud Hypervisor status with a JSON array of messages; and a body
//! that is accepted must read back to the same VM from the configuration farvm reports.
#![no_main]

use farvm_chapi::{route, ApiError, CreateSpec};
use libfuzzer_sys::fuzz_target;

fn check_error(e: &ApiError) {
    assert!(matches!(e.status(), 400 | 404 | 405 | 500), "{e:?}");
    let messages: Vec<String> = serde_json::from_str(&e.body()).expect("error body is JSON");
    assert_eq!(messages.len(), 2, "{e:?}");
}

fuzz_target!(|data: &[u8]| {
    let mut parts = data.splitn(3, |&b| b == b'\n');
    let method = String::from_utf8_lossy(parts.next().unwrap_or_default());
    let path = String::from_utf8_lossy(parts.next().unwrap_or_default());
    let body = parts.next().unwrap_or_default();
    if let Err(e) = route(&method, &path) {
        check_error(&e);
    }
    match CreateSpec::parse(body) {
        Ok(spec) => {
            let again = CreateSpec::parse(spec.to_json().to_string().as_bytes())
                .unwrap_or_else(|e| panic!("farvm's own body is refused: {e}"));
            assert_eq!(again, spec);
            let name = "fuzz";
            assert_eq!(spec.to_domain(name).name, name);
        }
        Err(e) => check_error(&e),
    }
});
