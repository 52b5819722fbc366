//! Endpoints in serde formats as their URL text (`10.0.0.5:7070`, `rdma://10.0.0.5:7071`):
//! the pool keeps them that way in etcd, readable with `etcdctl get`.

use serde::{de, Deserialize, Deserializer, Serialize, Serializer};

use crate::Endpoint;

impl Serialize for Endpoint {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Endpoint {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Endpoint, D::Error> {
        let text = String::deserialize(d)?;
        Endpoint::parse_address(&text).map_err(de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use crate::{Endpoint, Transport};

    #[test]
    fn endpoints_are_their_url_in_json() {
        let e = Endpoint::parse("rdma://10.0.0.5:7071").unwrap();
        let json = serde_json::to_string(&e).unwrap();
        assert_eq!(json, "\"rdma://10.0.0.5:7071\"");
        assert_eq!(serde_json::from_str::<Endpoint>(&json).unwrap(), e);
        let tcp: Endpoint = serde_json::from_str("\"10.0.0.5:7070\"").unwrap();
        assert_eq!(tcp.transport, Transport::Tcp);
        let bad = serde_json::from_str::<Endpoint>("\"quic://10.0.0.5:1\"").unwrap_err();
        assert!(bad.to_string().contains("unknown scheme"), "{bad}");
    }
}
