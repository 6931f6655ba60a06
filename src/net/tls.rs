//! Mutual TLS for remote channels (rustls, ring provider): both sides present a certificate
//! signed by one authority that both trust; the client also checks the server's name.

use std::fmt;
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio_rustls::rustls;

use crate::net::error::SetupError;

/// TLS material for one side: its certificate chain and key, the authority that signs the
/// peers' certificates, and the name the server's certificate carries.
#[derive(Clone)]
pub struct Tls {
    pub(crate) server: Arc<rustls::ServerConfig>,
    pub(crate) client: Arc<rustls::ClientConfig>,
    pub(crate) server_name: ServerName<'static>,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

fn tls_err(what: &str, e: impl fmt::Display) -> SetupError {
    SetupError::Tls(format!("{what}: {e}"))
}

impl Tls {
    /// Mutual TLS from PEM text: `cert_chain` (this side's certificate, then any
    /// intermediates), its private `key`, the certificate of the authority `ca` that signed
    /// the peers' certificates, and `server_name`, a DNS name or IP address that the server's
    /// certificate must carry (the client checks it; the server ignores it).
    ///
    /// # Errors
    /// [`SetupError::Tls`] if the PEM cannot be parsed or rustls refuses the material.
    pub fn from_pem(
        cert_chain: &[u8],
        key: &[u8],
        ca: &[u8],
        server_name: &str,
    ) -> Result<Tls, SetupError> {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_chain)
            .collect::<Result<_, _>>()
            .map_err(|e| tls_err("certificate chain", e))?;
        if certs.is_empty() {
            return Err(SetupError::Tls("certificate chain: no certificate".into()));
        }
        let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| tls_err("private key", e))?;
        let mut roots = rustls::RootCertStore::empty();
        for ca in CertificateDer::pem_slice_iter(ca) {
            let ca = ca.map_err(|e| tls_err("authority", e))?;
            roots.add(ca).map_err(|e| tls_err("authority", e))?;
        }
        if roots.is_empty() {
            return Err(SetupError::Tls("authority: no certificate".into()));
        }
        let roots = Arc::new(roots);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            roots.clone(),
            provider.clone(),
        )
        .build()
        .map_err(|e| tls_err("client verifier", e))?;
        let server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_err("protocol versions", e))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(certs.clone(), key.clone_key())
            .map_err(|e| tls_err("certificate and key", e))?;
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_err("protocol versions", e))?
            .with_root_certificates(roots)
            .with_client_auth_cert(certs, key)
            .map_err(|e| tls_err("certificate and key", e))?;
        let server_name =
            ServerName::try_from(server_name.to_owned()).map_err(|e| tls_err("server name", e))?;
        Ok(Tls {
            server: Arc::new(server),
            client: Arc::new(client),
            server_name,
        })
    }
}
