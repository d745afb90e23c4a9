//! Test certificates, made by the tests (no key is committed): a CA per call of [`Ca::new`],
//! and one shared PKI per test process for the suites that run over mutual TLS (handed to
//! child processes through the environment, so that parent and child trust each other).

use std::sync::OnceLock;

use actix_delivery::tcp::NodeTls;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

/// A certificate authority.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    /// Its certificate, PEM.
    pub pem: String,
}

impl Ca {
    pub fn new(name: &str) -> Self {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let pem = params.self_signed(&key).unwrap().pem();
        Self {
            issuer: Issuer::new(params, key),
            pem,
        }
    }

    /// A certificate for these subject alternative names (an IP string becomes an IP SAN):
    /// (certificate PEM, key PEM). `adjust` changes its parameters first (validity, say).
    pub fn issue_with(
        &self,
        names: &[&str],
        adjust: impl FnOnce(&mut CertificateParams),
    ) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        adjust(&mut params);
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    pub fn issue(&self, names: &[&str]) -> (String, String) {
        self.issue_with(names, |_| {})
    }

    /// Mutual TLS settings of a node with a certificate for `names`, trusting this CA.
    pub fn mutual(&self, names: &[&str]) -> NodeTls {
        self.trusted_by_node_with(self.issue(names))
    }

    /// Mutual TLS settings of a node trusting this CA and presenting `(cert, key)` (PEM).
    pub fn trusted_by_node_with(&self, (cert, key): (String, String)) -> NodeTls {
        NodeTls::builder(&self.pem)
            .unwrap()
            .certificate(cert, key)
            .unwrap()
            .mutual()
            .build()
            .unwrap()
    }
}

const CA_ENV: &str = "ACTIX_DELIVERY_TEST_TLS_CA";
const CERT_ENV: &str = "ACTIX_DELIVERY_TEST_TLS_CERT";
const KEY_ENV: &str = "ACTIX_DELIVERY_TEST_TLS_KEY";

/// The shared PKI: CA, and one node certificate (for `node.test` and 127.0.0.1) all test
/// nodes of the suites present.
struct Shared {
    ca: String,
    cert: String,
    key: String,
}

fn shared() -> &'static Shared {
    static SHARED: OnceLock<Shared> = OnceLock::new();
    SHARED.get_or_init(|| match std::env::var(CA_ENV) {
        Ok(ca) => Shared {
            ca,
            cert: std::env::var(CERT_ENV).unwrap(),
            key: std::env::var(KEY_ENV).unwrap(),
        },
        Err(_) => {
            let ca = Ca::new("actix-delivery test CA");
            let (cert, key) = ca.issue(&["node.test", "127.0.0.1"]);
            Shared {
                ca: ca.pem,
                cert,
                key,
            }
        }
    })
}

/// Mutual TLS settings from the shared PKI.
pub fn shared_tls() -> NodeTls {
    let shared = shared();
    NodeTls::builder(&shared.ca)
        .unwrap()
        .certificate(&shared.cert, &shared.key)
        .unwrap()
        .mutual()
        .build()
        .unwrap()
}

/// The environment that hands the shared PKI to a child process.
pub fn child_env() -> Vec<(&'static str, String)> {
    let shared = shared();
    vec![
        (CA_ENV, shared.ca.clone()),
        (CERT_ENV, shared.cert.clone()),
        (KEY_ENV, shared.key.clone()),
    ]
}
