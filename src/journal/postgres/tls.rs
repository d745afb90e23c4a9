//! TLS to PostgreSQL (features `postgres` and `tls`): a rustls connector for tokio-postgres,
//! in the modes of libpq's `sslmode=require` (encrypted, the server's certificate not
//! checked) and `sslmode=verify-full` (encrypted, the certificate checked against the given
//! roots and the host name connected to).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};

use crate::journal::JournalError;
use crate::runtime::error_chain::ErrorChain;

/// TLS to the PostgreSQL server (features `postgres` and `tls`), set with
/// [`PostgresOptionsBuilder::tls`](crate::journal::PostgresOptionsBuilder::tls): TLS 1.3
/// through rustls (the `ring` provider). With it the journal never falls back to an
/// unencrypted connection, whatever `sslmode` the connection string names.
#[derive(Clone)]
pub struct PostgresTls {
    verify: bool,
    ca_pem: Vec<u8>,
    config: Arc<ClientConfig>,
}

impl PostgresTls {
    /// Like `sslmode=verify-full`: encrypted, and the server's certificate checked against the
    /// certificate authorities in `ca_pem` (PEM), its validity dates, and the host connected
    /// to (a host name, or an IP address the certificate names as an IP subject alternative
    /// name).
    ///
    /// # Errors
    /// [`JournalError::InvalidArgument`] if `ca_pem` holds no valid certificate.
    pub fn verify_full(ca_pem: impl AsRef<[u8]>) -> Result<Self, JournalError> {
        let invalid = |why: String| JournalError::InvalidArgument {
            persistence_id: None,
            reason: format!("PostgresTls::verify_full: {why}"),
        };
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca_pem.as_ref()) {
            let cert = cert.map_err(|err| invalid(format!("the CA PEM: {}", ErrorChain(&err))))?;
            roots
                .add(cert)
                .map_err(|err| invalid(format!("a CA certificate: {}", ErrorChain(&err))))?;
        }
        if roots.is_empty() {
            return Err(invalid("no certificate in the CA PEM".to_string()));
        }
        let config = builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Self {
            verify: true,
            ca_pem: ca_pem.as_ref().to_vec(),
            config: Arc::new(config),
        })
    }

    /// Like `sslmode=require`: encrypted, the server's certificate **not** checked (the
    /// connection is private from passive listeners, not from an active man in the middle).
    /// Prefer [`verify_full`](Self::verify_full).
    pub fn require() -> Self {
        let verifier = Arc::new(Unverified(provider()));
        let config = builder()
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth();
        Self {
            verify: false,
            ca_pem: Vec::new(),
            config: Arc::new(config),
        }
    }

    /// The connector for tokio-postgres.
    pub(super) fn connector(&self) -> MakeRustls {
        MakeRustls(self.config.clone())
    }
}

impl PartialEq for PostgresTls {
    fn eq(&self, other: &Self) -> bool {
        self.verify == other.verify && self.ca_pem == other.ca_pem
    }
}

impl Eq for PostgresTls {}

impl std::fmt::Debug for PostgresTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.verify {
            "PostgresTls(verify-full)"
        } else {
            "PostgresTls(require)"
        })
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn builder() -> rustls::ConfigBuilder<ClientConfig, rustls::WantsVerifier> {
    ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("the ring provider speaks TLS 1.3")
}

/// `sslmode=require`: any certificate is accepted; the handshake's signatures are still
/// checked (so the session is with the holder of the presented key).
#[derive(Debug)]
struct Unverified(Arc<CryptoProvider>);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// tokio-postgres's `MakeTlsConnect` over rustls.
#[derive(Clone)]
pub(super) struct MakeRustls(Arc<ClientConfig>);

impl<S> MakeTlsConnect<S> for MakeRustls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type TlsConnect = RustlsConnect;
    type Error = io::Error;

    fn make_tls_connect(&mut self, host: &str) -> io::Result<RustlsConnect> {
        let name = ServerName::try_from(host.to_string())
            .map_err(|err| io::Error::new(io::ErrorKind::InvalidInput, err))?;
        Ok(RustlsConnect {
            config: self.0.clone(),
            name,
        })
    }
}

/// Connects one stream.
pub(super) struct RustlsConnect {
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
}

impl<S> TlsConnect<S> for RustlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<RustlsStream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            let connector = tokio_rustls::TlsConnector::from(self.config);
            connector
                .connect(self.name, stream)
                .await
                .map(|stream| RustlsStream(Box::new(stream)))
        })
    }
}

/// A TLS connection to the server. No channel binding: SCRAM authenticates without it
/// (`channel_binding=prefer`, the default).
pub(super) struct RustlsStream<S>(Box<tokio_rustls::client::TlsStream<S>>);

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for RustlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for RustlsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_shutdown(cx)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for RustlsStream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}
