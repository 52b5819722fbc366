//! How a [`VmSpec`](super::VmSpec) is stored (a snapshot's manifest keeps the description of
//! the VM it saved): every field has a serde form of its own but the pool's [`Transport`],
//! whose crate gives none; it is stored as `tcp`, `rdma` (one-sided) or `rdma-send-recv`.

use super::Transport;

/// `#[serde(with = "stored::transport")]`.
pub(super) mod transport {
    use serde::{de, Deserialize, Deserializer, Serializer};

    use super::Transport;

    pub fn serialize<S: Serializer>(t: &Transport, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(match t {
            Transport::Rdma { one_sided: false } => "rdma-send-recv",
            t => t.scheme(),
        })
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Transport, D::Error> {
        let text = String::deserialize(d)?;
        match text.as_str() {
            "rdma-send-recv" => Ok(Transport::Rdma { one_sided: false }),
            t => Transport::from_scheme(t).ok_or_else(|| {
                de::Error::custom(format!(
                    "unknown transport `{t}` (tcp, rdma or rdma-send-recv)"
                ))
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use farvm_devices::serial::{SerialIn, SerialOut};

    use crate::remote::PageSpace;
    use crate::spec::{AsyncPf, Endpoint, Transport, VmSpec};

    #[test]
    fn a_description_survives_its_json() {
        let mut spec = VmSpec {
            name: Some("snap".into()),
            memory: 80 << 20,
            vcpus: 2,
            workloads: vec!["seq:ws=32M,passes=3".into()],
            serial: SerialOut::File("none".into()),
            serial_in: Some(SerialIn::None),
            async_pf: AsyncPf::Off,
            ..VmSpec::default()
        };
        spec.remote.local_memory = farvm_ept::Budget::Percent(25.0);
        spec.remote.servers = vec![Endpoint::parse_address("rdma://127.0.0.1:7070").unwrap()];
        spec.remote.page_space = PageSpace::Physical;
        for t in [
            Transport::Tcp,
            Transport::RDMA,
            Transport::Rdma { one_sided: false },
        ] {
            spec.remote.pool_options.transport = t;
            let text = serde_json::to_string(&spec).unwrap();
            assert_eq!(
                serde_json::from_str::<VmSpec>(&text).unwrap(),
                spec,
                "{text}"
            );
        }
        let text = serde_json::to_string(&spec)
            .unwrap()
            .replace("rdma-send-recv", "quic");
        let e = serde_json::from_str::<VmSpec>(&text).unwrap_err();
        assert!(e.to_string().contains("unknown transport `quic`"), "{e}");
    }
}
