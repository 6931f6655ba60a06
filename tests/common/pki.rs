//! A test authority for mutual TLS (shared by the network tests).
#![allow(dead_code)]

/// A test authority that signs certificates for mutual TLS.
pub(crate) struct Pki {
    pub(crate) ca_pem: String,
    ca: rcgen::CertifiedKey,
}

impl Pki {
    pub(crate) fn new(name: &str) -> Pki {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Pki {
            ca_pem: cert.pem(),
            ca: rcgen::CertifiedKey {
                cert,
                key_pair: key,
            },
        }
    }

    /// A certificate for `name` signed by this authority: (chain PEM, key PEM).
    pub(crate) fn issue(&self, name: &str) -> (String, String) {
        let params = rcgen::CertificateParams::new(vec![name.to_owned()]).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params
            .signed_by(&key, &self.ca.cert, &self.ca.key_pair)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    }

    pub(crate) fn tls(&self, name: &str) -> shmflow::net::Tls {
        let (c, k) = self.issue(name);
        shmflow::net::Tls::from_pem(
            c.as_bytes(),
            k.as_bytes(),
            self.ca_pem.as_bytes(),
            "localhost",
        )
        .unwrap()
    }
}
