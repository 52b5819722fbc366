//! Fuzz target: the domain XML reader must never panic on any input, and a domain it accepts
//! must survive being written back as XML and read again unchanged.
#![no_main]

use farvm_vmconfig::Domain;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(parsed) = Domain::parse(text) {
        let xml = parsed.domain.to_xml();
        let again = Domain::parse(&xml)
            .unwrap_or_else(|e| panic!("written XML does not parse: {e}\n{xml}"));
        assert_eq!(again.domain, parsed.domain, "{xml}");
    }
});
