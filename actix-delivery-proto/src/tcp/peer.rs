//! Where a node's peer is: an address, or a name and port resolved on every connection
//! attempt (so that a peer whose name moves to another address is reached there). A name is a
//! DNS name by the rules rustls checks a certificate's name by, so that under TLS the listener
//! is always checked for the name dialed, never for the IP it resolved to. Pure.

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::Arc;

/// A connecting peer's identity under mutual TLS: the DNS names of its certificate's subject
/// alternative names.
pub type Identity = Arc<[String]>;

/// The longest host name accepted (DNS: 253 characters).
const MAX_HOST: usize = 253;

/// The longest label (the part between two dots) of a host name (DNS: 63 characters).
const MAX_LABEL: usize = 63;

/// Where a peer node listens: a socket address, or a host name and port (resolved when a
/// connection is made and again on every reconnection). Parsed from `"10.0.0.7:7100"`,
/// `"[::1]:7100"` or `"orders.internal:7100"`; made from a [`SocketAddr`] with `into()`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PeerAddr(Target);

/// Where a peer is: an address, or a host name resolved when dialled.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// An IP address and port.
    Addr(SocketAddr),
    /// A host name (checked as a DNS name) and port.
    Name {
        /// The host name.
        host: Arc<str>,
        /// The port.
        port: u16,
    },
}

/// Why a peer address was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{input}` is not an address or host:port: {why}")]
pub struct PeerAddrError {
    input: String,
    why: &'static str,
}

impl PeerAddr {
    /// Where it is: an address, or a name and port.
    pub fn target(&self) -> &Target {
        &self.0
    }

    /// The host name `host` at `port`: a DNS name of at most 253 characters, of labels
    /// separated by dots (one trailing dot allowed), each of 1 to 63 letters, digits, `-` and
    /// `_`, neither starting nor ending with `-`, the last not a number (`7100`, `0x1f`: the
    /// name would read as an IPv4 address). These are the names a certificate can be checked
    /// for; a name is never checked as the IP it resolves to. Give an IP as a [`SocketAddr`].
    ///
    /// # Errors
    /// [`PeerAddrError`] if `host` is not such a name, saying why.
    pub fn name(host: &str, port: u16) -> Result<Self, PeerAddrError> {
        check_host(host).map_err(|why| PeerAddrError {
            input: format!("{host}:{port}"),
            why,
        })?;
        Ok(Self(Target::Name {
            host: host.to_ascii_lowercase().into(),
            port,
        }))
    }

    /// The socket address, if this is one (not a name).
    pub fn socket_addr(&self) -> Option<SocketAddr> {
        match &self.0 {
            Target::Addr(addr) => Some(*addr),
            Target::Name { .. } => None,
        }
    }
}

/// Why `host` is not a DNS name (the rules of rustls's `DnsName`), if it is not one.
fn check_host(host: &str) -> Result<(), &'static str> {
    if host.is_empty() || host.len() > MAX_HOST {
        return Err("the host name must have 1 to 253 characters");
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if !host.chars().all(allowed) {
        return Err("a host name has letters, digits, '-', '_' and '.' only");
    }
    let name = host.strip_suffix('.').unwrap_or(host);
    for label in name.split('.') {
        if label.is_empty() {
            return Err("an empty label (a dot first, or two in a row)");
        }
        if label.len() > MAX_LABEL {
            return Err("a label (between dots) has more than 63 characters");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err("a label starts or ends with '-'");
        }
    }
    let last = name.rsplit('.').next().unwrap_or_default();
    let hex = |digits: &str| digits.chars().all(|c| c.is_ascii_hexdigit());
    let number = last.chars().all(|c| c.is_ascii_digit())
        || last
            .strip_prefix("0x")
            .or_else(|| last.strip_prefix("0X"))
            .is_some_and(hex);
    if number {
        return Err(
            "the last label is a number, so the name reads as an IPv4 address, and a \
             certificate cannot be checked for it (give an IP as a socket address)",
        );
    }
    Ok(())
}

impl From<SocketAddr> for PeerAddr {
    fn from(addr: SocketAddr) -> Self {
        Self(Target::Addr(addr))
    }
}

impl FromStr for PeerAddr {
    type Err = PeerAddrError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        if let Ok(addr) = input.parse::<SocketAddr>() {
            return Ok(addr.into());
        }
        let refuse = |why| PeerAddrError {
            input: input.to_string(),
            why,
        };
        let (host, port) = input.rsplit_once(':').ok_or_else(|| refuse("no `:port`"))?;
        let port = port
            .parse()
            .map_err(|_| refuse("the port is not 0 to 65535"))?;
        Self::name(host, port).map_err(|err| refuse(err.why))
    }
}

impl fmt::Display for PeerAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Target::Addr(addr) => addr.fmt(f),
            Target::Name { host, port } => write!(f, "{host}:{port}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_and_names_parse_and_bad_input_is_refused() {
        let addr: PeerAddr = "10.0.0.7:7100".parse().unwrap();
        assert_eq!(addr.socket_addr(), Some("10.0.0.7:7100".parse().unwrap()));
        assert!("[::1]:7100"
            .parse::<PeerAddr>()
            .unwrap()
            .socket_addr()
            .is_some());
        let name: PeerAddr = "Orders.internal:7100".parse().unwrap();
        assert_eq!(name.to_string(), "orders.internal:7100");
        assert_eq!(name.socket_addr(), None);
        for bad in [
            "orders",
            "orders:",
            "orders:70000",
            ":7100",
            "a b:1",
            "-x:1",
            "é:1",
        ] {
            assert!(bad.parse::<PeerAddr>().is_err(), "{bad}");
        }
        assert!(PeerAddr::name(&"a".repeat(254), 1).is_err());
    }

    #[test]
    fn a_host_that_is_not_a_dns_name_is_refused_with_the_reason() {
        let long_label = format!("{}.test", "a".repeat(64));
        for (host, why) in [
            ("orders.0", "the last label is a number"),
            ("orders.7100", "the last label is a number"),
            ("0x1f", "the last label is a number"),
            ("10.0.0.7", "the last label is a number"),
            ("orders-.test", "a label starts or ends with '-'"),
            ("orders.-test", "a label starts or ends with '-'"),
            ("orders..test", "an empty label"),
            (".orders", "an empty label"),
            (long_label.as_str(), "more than 63 characters"),
        ] {
            let refused = PeerAddr::name(host, 7100).unwrap_err().to_string();
            assert!(refused.contains(why), "{host}: {refused}");
            assert!(refused.starts_with(&format!("`{host}:7100`")), "{refused}");
        }
        for host in [
            "orders.internal",
            "orders.test.",
            "node-1",
            "_srv.x",
            "0x1g",
            "a7.b",
        ] {
            assert!(PeerAddr::name(host, 1).is_ok(), "{host}");
        }
        assert!(PeerAddr::name(&format!("{}.test", "a".repeat(63)), 1).is_ok());
    }

    /// Every host name of up to 5 characters of an alphabet with the characters that decide
    /// (digits, hex, `-`, `_`, `.`): accepted exactly when rustls accepts it as a DNS name.
    #[test]
    fn the_names_accepted_are_those_rustls_checks_certificates_for() {
        const ALPHABET: &[u8] = b"a0-_.xf9";
        let mut names = vec![String::new()];
        for _ in 0..5 {
            let longer: Vec<String> = names
                .iter()
                .flat_map(|name| {
                    ALPHABET
                        .iter()
                        .map(move |&c| format!("{name}{}", char::from(c)))
                })
                .collect();
            for name in &longer {
                let rustls = rustls::pki_types::DnsName::try_from(name.as_str()).is_ok();
                assert_eq!(check_host(name).is_ok(), rustls, "{name:?}");
            }
            names = longer;
        }
    }
}
