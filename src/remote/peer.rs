//! Where a node's peer is: an address, or a name and port resolved on every connection
//! attempt (so that a peer whose name moves to another address is reached there). Pure.

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::Arc;

/// The longest host name accepted (DNS: 253 characters).
const MAX_HOST: usize = 253;

/// Where a peer node listens: a socket address, or a host name and port (resolved when a
/// connection is made and again on every reconnection). Parsed from `"10.0.0.7:7100"`,
/// `"[::1]:7100"` or `"orders.internal:7100"`; made from a [`SocketAddr`] with `into()`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PeerAddr(pub(crate) Target);

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Target {
    Addr(SocketAddr),
    Name { host: Arc<str>, port: u16 },
}

/// Why a peer address was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{input}` is not an address or host:port: {why}")]
pub struct PeerAddrError {
    input: String,
    why: &'static str,
}

impl PeerAddr {
    /// The host name `host` (letters, digits, `-`, `_` and `.`, at most 253 characters) at
    /// `port`.
    ///
    /// # Errors
    /// [`PeerAddrError`] if `host` is not such a name.
    pub fn name(host: &str, port: u16) -> Result<Self, PeerAddrError> {
        let refuse = |why| PeerAddrError {
            input: format!("{host}:{port}"),
            why,
        };
        if host.is_empty() || host.len() > MAX_HOST {
            return Err(refuse("the host name must have 1 to 253 characters"));
        }
        let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
        if !host.chars().all(allowed) || host.starts_with(['.', '-']) {
            return Err(refuse(
                "a host name has letters, digits, '-', '_' and '.' (and starts with neither)",
            ));
        }
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
}
