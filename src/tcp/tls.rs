//! TLS on the TCP transport (feature `tls`): a node's TLS 1.3 settings ([`NodeTls`]), with
//! the `ring` provider, certificates checked against the given roots and the peer's name,
//! and, when mutual, the identities of connecting peers (the DNS names of their
//! certificates' subject alternative names), which [`NodeHandle::expose_to`] authorizes.
//!
//! [`NodeHandle::expose_to`]: crate::tcp::NodeHandle::expose_to

use std::io;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rustls::client::ResolvesClientCert;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, DnsName, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::sign::CertifiedKey;
use rustls::{
    ClientConfig, ClientConnection, Connection, RootCertStore, ServerConfig, ServerConnection,
    SignatureScheme,
};
use tokio::net::TcpStream;
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::runtime::error_chain::ErrorChain;
use crate::tcp::peer::Identity;
use crate::tcp::peer::{PeerAddr, Target};

/// Why TLS settings were refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A PEM input holds nothing usable.
    #[error("{what}: {why}")]
    Pem {
        /// Which input (`ca`, `certificate`, `key`).
        what: &'static str,
        /// What is wrong with it.
        why: String,
    },
    /// rustls refused the settings (a key that does not match its certificate, say).
    #[error("rustls refused the TLS settings: {0}")]
    Rustls(#[from] rustls::Error),
    /// The verifier of client certificates could not be built (no usable root, say).
    #[error("the client certificate verifier: {0}")]
    Verifier(String),
    /// The server configuration given to [`NodeTls::from_configs`] did not take a TLS 1.3
    /// handshake from a client that names no server up to its certificate (it has no TLS 1.3,
    /// or no certificate for such a client, say), so whether it asks connecting peers for
    /// certificates could not be found out.
    #[error(
        "the server configuration did not take a TLS 1.3 handshake up to its certificate: {0}"
    )]
    ServerConfig(rustls::Error),
}

fn pem_error(what: &'static str) -> impl Fn(rustls::pki_types::pem::Error) -> TlsError {
    move |err| TlsError::Pem {
        what,
        why: ErrorChain(&err).to_string(),
    }
}

/// A node's TLS settings: what it trusts, what it presents, and whether peers must present a
/// certificate too (mutual TLS). Built from PEM with [`NodeTls::builder`] or from rustls
/// configurations with [`NodeTls::from_configs`]; set with
/// [`NodeOptionsBuilder::tls`](crate::tcp::NodeOptionsBuilder::tls). Cheap to clone.
///
/// Only TLS 1.3 is spoken. A connecting node checks the listening node's certificate against
/// its roots and against the name it connects to: the host of a
/// [`PeerAddr`](crate::tcp::PeerAddr) name (`orders.internal:7100`; never the IP the name
/// resolved to) or, for an address, its IP (which the certificate must then name as an IP
/// subject alternative name).
///
/// Between TLS nodes the listener decides whether the connecting node needs a certificate: a
/// mutual listener refuses a node that presents none (one built without
/// [`mutual`](NodeTlsBuilder::mutual), even with a certificate of its own), while a listener
/// without `mutual` asks for none, so a mutual node connects to it and delivers, without an
/// identity there.
///
/// ```no_run
/// use actix_delivery::tcp::{NodeOptions, NodeTls};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let tls = NodeTls::builder(std::fs::read("ca.pem")?)?
///     .certificate(std::fs::read("node.pem")?, std::fs::read("node.key")?)?
///     .mutual()
///     .build()?;
/// let options = NodeOptions::builder()
///     .tls(tls)
///     .listen("0.0.0.0:7100".parse()?)
///     .build()?;
/// # drop(options);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct NodeTls {
    server: Option<Arc<ServerConfig>>,
    client: Arc<ClientConfig>,
    identities: bool,
}

impl std::fmt::Debug for NodeTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeTls")
            .field("can_listen", &self.server.is_some())
            .field("identities", &self.identities)
            .finish_non_exhaustive()
    }
}

/// Builds [`NodeTls`] from PEM.
pub struct NodeTlsBuilder {
    roots: RootCertStore,
    certificate: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
    mutual: bool,
}

impl std::fmt::Debug for NodeTlsBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeTlsBuilder")
            .field("roots", &self.roots.len())
            .field("certificate", &self.certificate.is_some())
            .field("mutual", &self.mutual)
            .finish()
    }
}

impl NodeTls {
    /// Starts settings that trust the certificate authorities in `ca_pem` (one or more PEM
    /// certificates): for the certificates of the nodes this one connects to, and, when
    /// [`mutual`](NodeTlsBuilder::mutual), of the nodes that connect to it.
    ///
    /// # Errors
    /// [`TlsError::Pem`] (`ca`) if `ca_pem` holds no certificate or one that is not valid.
    pub fn builder(ca_pem: impl AsRef<[u8]>) -> Result<NodeTlsBuilder, TlsError> {
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca_pem.as_ref()) {
            let cert = cert.map_err(pem_error("ca"))?;
            roots.add(cert)?;
        }
        if roots.is_empty() {
            return Err(TlsError::Pem {
                what: "ca",
                why: "no certificate in the PEM".to_string(),
            });
        }
        Ok(NodeTlsBuilder {
            roots,
            certificate: None,
            mutual: false,
        })
    }

    /// Settings from rustls configurations, for what the builder does not offer (other roots,
    /// revocation lists, custom verifiers): `server` for listening (`None`: this node cannot
    /// listen), `client` for connecting. Use TLS 1.3 and verification as the builder does:
    /// these are used as they are.
    ///
    /// Connecting peers have identities (for [`NodeHandle::expose_to`]) if `server` asks them for
    /// certificates. rustls does not say whether a configuration does, so this finds out by
    /// a TLS 1.3 handshake in memory, from a client that names no server (as a node dialing an
    /// address does), up to the server's certificate.
    ///
    /// # Errors
    /// [`TlsError::ServerConfig`] if `server` does not take that handshake up to its
    /// certificate (no TLS 1.3, or no certificate for a client that names no server).
    ///
    /// [`NodeHandle::expose_to`]: crate::tcp::NodeHandle::expose_to
    pub fn from_configs(
        server: Option<Arc<ServerConfig>>,
        client: Arc<ClientConfig>,
    ) -> Result<Self, TlsError> {
        let identities = match &server {
            Some(server) => asks_for_client_certificates(server.clone())?,
            None => false,
        };
        Ok(Self {
            server,
            client,
            identities,
        })
    }

    /// Whether the node can listen (it has a certificate to present).
    pub(crate) fn can_listen(&self) -> bool {
        self.server.is_some()
    }

    /// Whether connecting peers may have identities (mutual TLS).
    pub(crate) fn identities(&self) -> bool {
        self.identities
    }

    /// The client side of TLS over `stream`, checking the server's certificate for `name`.
    pub(crate) async fn connect(
        &self,
        name: ServerName<'static>,
        stream: TcpStream,
    ) -> io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        TlsConnector::from(self.client.clone())
            .connect(name, stream)
            .await
    }

    /// The server side of TLS over `stream`; the client's identity if it presented a
    /// (verified) certificate.
    pub(crate) async fn accept(
        &self,
        stream: TcpStream,
    ) -> io::Result<(tokio_rustls::server::TlsStream<TcpStream>, Option<Identity>)> {
        let server = self
            .server
            .clone()
            .ok_or_else(|| io::Error::other("no certificate to listen with"))?;
        let stream = TlsAcceptor::from(server).accept(stream).await?;
        let identity = stream
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|chain| chain.first())
            .map(identity);
        Ok((stream, identity))
    }
}

/// Whether `server` asks a connecting client for a certificate (rustls keeps a server
/// configuration's client verifier to itself): a TLS 1.3 handshake in memory with a client
/// that trusts no certificate, presents none, and notes whether it was asked. A server asks
/// before it presents its certificate, at which the client stops.
fn asks_for_client_certificates(server: Arc<ServerConfig>) -> Result<bool, TlsError> {
    let asked = Arc::new(AskedForCertificate::default());
    let client = ClientConfig::builder_with_provider(server.crypto_provider().clone())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(RootCertStore::empty())
        .with_client_cert_resolver(asked.clone());
    // An IP as the name: the client names no server (sends no SNI).
    let name = ServerName::IpAddress(Ipv4Addr::LOCALHOST.into());
    let mut client = Connection::Client(ClientConnection::new(Arc::new(client), name)?);
    let mut server = Connection::Server(ServerConnection::new(server)?);
    // ClientHello, the server's flight (and, after a retry request, both again).
    let mut ended = rustls::Error::General("the handshake did not end".to_string());
    for _ in 0..2 {
        let round = pass(&mut client, &mut server).and_then(|()| pass(&mut server, &mut client));
        if let Err(err) = round {
            ended = err;
            break;
        }
    }
    match ended {
        // At the server's certificate: whatever the server asked for came before it.
        rustls::Error::InvalidCertificate(_) => Ok(asked.0.load(Ordering::Relaxed)),
        other => Err(TlsError::ServerConfig(other)),
    }
}

/// Hands what `from` has to send to `to`, which processes it.
fn pass(from: &mut Connection, to: &mut Connection) -> Result<(), rustls::Error> {
    let io = |err: io::Error| rustls::Error::General(ErrorChain(&err).to_string());
    let mut wire = Vec::new();
    while from.wants_write() {
        from.write_tls(&mut wire).map_err(io)?;
    }
    let mut rest = wire.as_slice();
    while !rest.is_empty() {
        to.read_tls(&mut rest).map_err(io)?;
        to.process_new_packets()?;
    }
    Ok(())
}

/// A client's certificate resolver that presents no certificate and notes whether the server
/// asked for one.
#[derive(Debug, Default)]
struct AskedForCertificate(AtomicBool);

impl ResolvesClientCert for AskedForCertificate {
    fn resolve(&self, _: &[&[u8]], _: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        self.0.store(true, Ordering::Relaxed);
        None
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// The DNS names among a (verified) certificate's subject alternative names.
fn identity(cert: &CertificateDer<'_>) -> Identity {
    let names: Vec<String> = match webpki::EndEntityCert::try_from(cert) {
        Ok(cert) => cert.valid_dns_names().map(str::to_owned).collect(),
        Err(_) => Vec::new(),
    };
    names.into()
}

impl NodeTlsBuilder {
    /// This node's certificate chain (PEM, its own certificate first) and private key (PEM:
    /// PKCS#8, PKCS#1 or SEC1). Required to listen, and for mutual TLS.
    ///
    /// # Errors
    /// [`TlsError::Pem`] (`certificate` or `key`) if either holds nothing usable.
    pub fn certificate(
        mut self,
        chain_pem: impl AsRef<[u8]>,
        key_pem: impl AsRef<[u8]>,
    ) -> Result<Self, TlsError> {
        let chain = CertificateDer::pem_slice_iter(chain_pem.as_ref())
            .collect::<Result<Vec<_>, _>>()
            .map_err(pem_error("certificate"))?;
        if chain.is_empty() {
            return Err(TlsError::Pem {
                what: "certificate",
                why: "no certificate in the PEM".to_string(),
            });
        }
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_ref()).map_err(pem_error("key"))?;
        self.certificate = Some((chain, key));
        Ok(self)
    }

    /// Mutual TLS: connecting nodes must present a certificate signed by one of the roots,
    /// and this node presents its own when it connects. A connecting node's identity is then
    /// the DNS names of its certificate's subject alternative names, which
    /// [`NodeHandle::expose_to`](crate::tcp::NodeHandle::expose_to) can authorize.
    pub fn mutual(mut self) -> Self {
        self.mutual = true;
        self
    }

    /// Builds the settings.
    ///
    /// # Errors
    /// [`TlsError::Pem`] (`certificate`) if mutual without a certificate;
    /// [`TlsError::Rustls`] if the key does not fit the certificate.
    pub fn build(self) -> Result<NodeTls, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let roots = Arc::new(self.roots);
        let client = ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_root_certificates(roots.clone());
        let client = match (&self.certificate, self.mutual) {
            (Some((chain, key)), true) => {
                client.with_client_auth_cert(chain.clone(), key.clone_key())?
            }
            (None, true) => {
                return Err(TlsError::Pem {
                    what: "certificate",
                    why: "mutual TLS needs this node's certificate".to_string(),
                })
            }
            (_, false) => client.with_no_client_auth(),
        };
        let server = match self.certificate {
            None => None,
            Some((chain, key)) => {
                let verifier = if self.mutual {
                    WebPkiClientVerifier::builder_with_provider(roots, provider.clone())
                        .build()
                        .map_err(|err| TlsError::Verifier(ErrorChain(&err).to_string()))?
                } else {
                    WebPkiClientVerifier::no_client_auth()
                };
                let server = ServerConfig::builder_with_provider(provider)
                    .with_protocol_versions(&[&rustls::version::TLS13])?
                    .with_client_cert_verifier(verifier)
                    .with_single_cert(chain, key)?;
                Some(Arc::new(server))
            }
        };
        Ok(NodeTls {
            server,
            client: Arc::new(client),
            identities: self.mutual,
        })
    }
}

/// The name a connecting node checks the listening node's certificate for: the host of a
/// name (never the IP it resolved to), or the IP of an address. A host that rustls does not
/// take for a DNS name (which [`PeerAddr::name`] refuses already) fails the attempt.
pub(crate) fn server_name(peer: &PeerAddr) -> Result<ServerName<'static>, String> {
    match peer.target() {
        Target::Addr(addr) => Ok(ServerName::IpAddress(addr.ip().into())),
        Target::Name { host, .. } => DnsName::try_from(host.to_string())
            .map(ServerName::DnsName)
            .map_err(|_| format!("`{host}` is not a DNS name a certificate can be checked for")),
    }
}

#[cfg(test)]
mod tests {
    use rustls::server::{ResolvesServerCertUsingSni, WebPkiClientVerifier};

    use super::*;

    /// A self-signed certificate for node.test, as its own root: (chain, key, roots).
    fn certificate() -> (
        Vec<CertificateDer<'static>>,
        PrivateKeyDer<'static>,
        Arc<RootCertStore>,
    ) {
        let made = rcgen::generate_simple_self_signed(vec!["node.test".to_string()]).unwrap();
        let cert = made.cert.der().clone();
        let key = PrivateKeyDer::try_from(made.signing_key.serialize_der()).unwrap();
        let mut roots = RootCertStore::empty();
        roots.add(cert.clone()).unwrap();
        (vec![cert], key, Arc::new(roots))
    }

    fn server_checking_with(
        verifier: Arc<dyn rustls::server::danger::ClientCertVerifier>,
    ) -> Arc<ServerConfig> {
        let (chain, key, _) = certificate();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let server = ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .unwrap();
        Arc::new(server)
    }

    #[test]
    fn a_server_configuration_is_asked_whether_it_wants_client_certificates() {
        let none = server_checking_with(WebPkiClientVerifier::no_client_auth());
        assert!(!asks_for_client_certificates(none).unwrap());
        let (_, _, roots) = certificate();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let required = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .unwrap();
        assert!(asks_for_client_certificates(server_checking_with(required)).unwrap());
        let optional = WebPkiClientVerifier::builder_with_provider(roots, provider)
            .allow_unauthenticated()
            .build()
            .unwrap();
        assert!(asks_for_client_certificates(server_checking_with(optional)).unwrap());
    }

    #[test]
    fn a_server_configuration_without_a_certificate_for_a_nameless_client_is_refused() {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let by_name_only = ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(ResolvesServerCertUsingSni::new()));
        let refused = NodeTls::from_configs(Some(Arc::new(by_name_only)), client()).unwrap_err();
        assert!(matches!(refused, TlsError::ServerConfig(_)), "{refused}");
        // Without a server side there is nothing to ask: no identities.
        assert!(!NodeTls::from_configs(None, client()).unwrap().identities());
    }

    fn client() -> Arc<ClientConfig> {
        let (_, _, roots) = certificate();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let client = ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        Arc::new(client)
    }
}
