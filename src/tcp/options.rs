//! A node's options, validated when built.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::{duration, positive, Overrides};
use crate::error::OptionsError;
use crate::tcp::auth::NodeSecret;
use crate::tcp::frame::PROTOCOL_VERSION;
use crate::tcp::handshake::{check_frame_limits, check_wire_version};
#[cfg(feature = "tls")]
use crate::tcp::tls::NodeTls;

/// How a node authenticates its peers.
#[derive(Clone, Debug)]
enum Auth {
    Secret(NodeSecret),
    #[cfg(feature = "tls")]
    Tls(NodeTls),
    Insecure,
}

/// Resolves a host name and port to addresses (see [`NodeOptionsBuilder::resolver`]).
pub(crate) type ResolveFn = dyn Fn(&str, u16) -> io::Result<Vec<SocketAddr>> + Send + Sync;

/// The node's resolver of names: `None` is the system's (through the runtime).
#[derive(Clone, Default)]
pub(crate) struct Resolver(pub(crate) Option<Arc<ResolveFn>>);

impl std::fmt::Debug for Resolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "custom" } else { "system" })
    }
}

/// The data settings of a [`NodeHandle`](crate::tcp::NodeHandle): plain, loadable with serde from
/// the application's configuration (durations in `_ms`, unknown keys refused), validated when
/// [`NodeOptionsBuilder::build`] builds the options. `Default` gives the documented defaults.
///
/// ```
/// # use actix_delivery::tcp::{NodeConfig, NodeOptions};
/// # use std::time::Duration;
/// let config: NodeConfig = serde_json::from_str(
///     r#"{ "listen": "127.0.0.1:7000", "max_connections": 32, "idle_timeout_ms": 5000 }"#,
/// ).unwrap();
/// let options = NodeOptions::builder()
///     .insecure_no_authentication() // the authentication mode is code: see below
///     .config(config)
///     .max_connections(64) // a builder value wins over the loaded one
///     .build()
///     .unwrap();
/// assert_eq!(options.config().max_connections, 64);
/// assert_eq!(options.config().idle_timeout, Duration::from_secs(5));
/// ```
///
/// What is not data is set on the builder only: the authentication mode and its secret
/// ([`secret`](NodeOptionsBuilder::secret), `tls` (feature `tls`) with its
/// certificates and keys, or
/// [`insecure_no_authentication`](NodeOptionsBuilder::insecure_no_authentication)), and the
/// [`resolver`](NodeOptionsBuilder::resolver). Each field's meaning is that of the builder
/// method of the same name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeConfig {
    /// Listen on this address (`"127.0.0.1:7000"`; default: none). See
    /// [`NodeOptionsBuilder::listen`].
    pub listen: Option<SocketAddr>,
    /// The largest frame accepted, in bytes: default 1 MiB, 4 KiB to 16 MiB.
    pub max_frame_length: usize,
    /// Bytes of frames held per connection: default 4 MiB, at least twice
    /// `max_frame_length`, at most 1 GiB.
    pub max_output_bytes: usize,
    /// Authenticated incoming connections open at once: default 256; positive.
    pub max_connections: usize,
    /// Incoming connections in their handshake at once: default 64; positive.
    pub max_handshakes: usize,
    /// Producer incarnations remembered per remote address: default 1024; positive.
    pub max_routes: usize,
    /// Settings key `handshake_timeout_ms`: default 5 s.
    #[serde(rename = "handshake_timeout_ms", with = "handshake_timeout_ms")]
    pub handshake_timeout: Duration,
    /// Settings key `connect_timeout_ms`: default 5 s.
    #[serde(rename = "connect_timeout_ms", with = "connect_timeout_ms")]
    pub connect_timeout: Duration,
    /// Settings key `heartbeat_interval_ms`: default 1 s.
    #[serde(rename = "heartbeat_interval_ms", with = "heartbeat_interval_ms")]
    pub heartbeat_interval: Duration,
    /// Settings key `idle_timeout_ms`: default 10 s, longer than `heartbeat_interval`.
    #[serde(rename = "idle_timeout_ms", with = "idle_timeout_ms")]
    pub idle_timeout: Duration,
    /// The first wait between reconnection attempts. Settings key `reconnect_min_ms`:
    /// default 100 ms.
    #[serde(rename = "reconnect_min_ms", with = "reconnect_min_ms")]
    pub reconnect_min: Duration,
    /// The longest wait between reconnection attempts. Settings key `reconnect_max_ms`:
    /// default 5 s, at least `reconnect_min`.
    #[serde(rename = "reconnect_max_ms", with = "reconnect_max_ms")]
    pub reconnect_max: Duration,
    /// The highest protocol version this node offers when it connects: default 4, 3 to 4.
    /// See [`NodeOptionsBuilder::wire_version`].
    pub wire_version: u16,
}

crate::config::millis_key!(handshake_timeout_ms, "handshake_timeout_ms");
crate::config::millis_key!(connect_timeout_ms, "connect_timeout_ms");
crate::config::millis_key!(heartbeat_interval_ms, "heartbeat_interval_ms");
crate::config::millis_key!(idle_timeout_ms, "idle_timeout_ms");
crate::config::millis_key!(reconnect_min_ms, "reconnect_min_ms");
crate::config::millis_key!(reconnect_max_ms, "reconnect_max_ms");

impl Default for NodeConfig {
    fn default() -> Self {
        Self {
            listen: None,
            max_frame_length: 1 << 20,
            max_output_bytes: 4 << 20,
            max_connections: 256,
            max_handshakes: 64,
            max_routes: 1024,
            handshake_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
            heartbeat_interval: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(10),
            reconnect_min: Duration::from_millis(100),
            reconnect_max: Duration::from_secs(5),
            wire_version: PROTOCOL_VERSION,
        }
    }
}

impl NodeConfig {
    /// Checks every rule; the error names the first offending settings key.
    ///
    /// # Errors
    /// [`OptionsError`] naming the key and the rule it breaks.
    pub fn validate(&self) -> Result<(), OptionsError> {
        check_frame_limits(self.max_frame_length, self.max_output_bytes)?;
        check_wire_version(self.wire_version)?;
        positive("max_connections", self.max_connections)?;
        positive("max_handshakes", self.max_handshakes)?;
        positive("max_routes", self.max_routes)?;
        duration("handshake_timeout_ms", self.handshake_timeout)?;
        duration("connect_timeout_ms", self.connect_timeout)?;
        duration("heartbeat_interval_ms", self.heartbeat_interval)?;
        duration("idle_timeout_ms", self.idle_timeout)?;
        duration("reconnect_min_ms", self.reconnect_min)?;
        duration("reconnect_max_ms", self.reconnect_max)?;
        if self.idle_timeout <= self.heartbeat_interval {
            return Err(OptionsError::new(
                "idle_timeout_ms",
                format!(
                    "must be longer than heartbeat_interval_ms (got {} ms and {} ms)",
                    self.idle_timeout.as_millis(),
                    self.heartbeat_interval.as_millis()
                ),
            ));
        }
        if self.reconnect_max < self.reconnect_min {
            return Err(OptionsError::new(
                "reconnect_max_ms",
                format!(
                    "must be at least reconnect_min_ms (got {} ms and {} ms)",
                    self.reconnect_max.as_millis(),
                    self.reconnect_min.as_millis()
                ),
            ));
        }
        Ok(())
    }
}

/// Everything a [`NodeHandle`](crate::tcp::NodeHandle) needs, validated. Built with
/// [`NodeOptions::builder`].
#[derive(Clone, Debug)]
pub struct NodeOptions {
    auth: Auth,
    pub(crate) config: NodeConfig,
    pub(crate) resolver: Resolver,
    #[cfg(feature = "metrics")]
    pub(crate) metrics_label: Option<String>,
}

impl NodeOptions {
    /// Starts a builder. Choosing [`secret`](NodeOptionsBuilder::secret),
    /// `tls` (feature `tls`) or, explicitly,
    /// [`insecure_no_authentication`](NodeOptionsBuilder::insecure_no_authentication) is
    /// required.
    pub fn builder() -> NodeOptionsBuilder {
        NodeOptionsBuilder {
            auth: Auth::Insecure,
            #[cfg(feature = "metrics")]
            metrics_label: None,
            auth_chosen: false,
            resolver: Resolver::default(),
            loaded: NodeConfig::default(),
            explicit: Overrides::default(),
        }
    }

    /// The validated data settings.
    pub fn config(&self) -> &NodeConfig {
        &self.config
    }

    /// The shared secret, or `None` in the TLS and insecure modes.
    pub(crate) fn secret(&self) -> Option<&NodeSecret> {
        match &self.auth {
            Auth::Secret(secret) => Some(secret),
            _ => None,
        }
    }

    /// The TLS settings, in the TLS mode.
    #[cfg(feature = "tls")]
    pub(crate) fn tls(&self) -> Option<&NodeTls> {
        match &self.auth {
            Auth::Tls(tls) => Some(tls),
            _ => None,
        }
    }

    /// Whether the node runs without any authentication.
    pub(crate) fn insecure(&self) -> bool {
        matches!(self.auth, Auth::Insecure)
    }

    fn validate(&self) -> Result<(), OptionsError> {
        #[cfg(feature = "metrics")]
        if let Some(label) = &self.metrics_label {
            crate::config::check_label(label)?;
        }
        #[cfg(feature = "tls")]
        if let (Some(tls), Some(_)) = (self.tls(), self.config.listen)
            && !tls.can_listen()
        {
            return Err(OptionsError::new(
                "tls",
                "a listening node needs a certificate (NodeTlsBuilder::certificate)",
            ));
        }
        self.config.validate()
    }
}

/// Builds [`NodeOptions`]: the authentication mode and resolver, and the data settings
/// ([`NodeConfig`]): a value set here wins over one [loaded](Self::config), which wins over
/// the default, whatever order the calls come in.
#[derive(Debug)]
pub struct NodeOptionsBuilder {
    auth: Auth,
    auth_chosen: bool,
    resolver: Resolver,
    loaded: NodeConfig,
    explicit: Overrides<NodeConfig>,
    #[cfg(feature = "metrics")]
    metrics_label: Option<String>,
}

impl NodeOptionsBuilder {
    /// Loaded data settings (e.g. the `[node]` section of the application's config file);
    /// values set on the builder still win.
    pub fn config(mut self, config: NodeConfig) -> Self {
        self.loaded = config;
        self
    }

    /// The value of the `node` label on this node's metrics (feature `metrics`; default
    /// `"default"`; not empty).
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn metrics_label(mut self, label: impl Into<String>) -> Self {
        self.metrics_label = Some(label.into());
        self
    }

    /// Authenticate every peer, and every frame, with this secret (shared by all nodes that
    /// talk to each other).
    pub fn secret(mut self, secret: NodeSecret) -> Self {
        self.auth = Auth::Secret(secret);
        self.auth_chosen = true;
        self
    }

    /// Speak TLS 1.3 with these settings instead of tagging frames with a shared secret: traffic is
    /// encrypted, the listening node is authenticated by its certificate and, with
    /// [mutual](crate::tcp::NodeTlsBuilder::mutual) TLS, the connecting one too, by an identity
    /// that [`NodeHandle::expose_to`](crate::tcp::NodeHandle::expose_to) can authorize. TLS nodes
    /// and nodes without TLS refuse each other (counted in `tls_failures`), and a mutual listener
    /// refuses a TLS node that presents no certificate (see [`NodeTls`](crate::tcp::NodeTls) for
    /// which way round holds).
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls(mut self, tls: NodeTls) -> Self {
        self.auth = Auth::Tls(tls);
        self.auth_chosen = true;
        self
    }

    /// Resolve the names of [`PeerAddr`](crate::tcp::PeerAddr)s with this function
    /// instead of the system's resolver (for tests, or a service registry). It is called on
    /// the node's arbiter on every connection attempt, and must not block for long; the
    /// addresses it returns are tried in order.
    pub fn resolver(
        mut self,
        resolve: impl Fn(&str, u16) -> io::Result<Vec<SocketAddr>> + Send + Sync + 'static,
    ) -> Self {
        self.resolver = Resolver(Some(Arc::new(resolve)));
        self
    }

    /// Run without authentication: **anyone who can reach the node's address can deliver
    /// messages to its exposed consumers, and anyone on the path can alter frames.** Only for
    /// tests and trusted networks; the node logs a warning when it starts. Nodes of this mode
    /// refuse nodes with a secret and vice versa.
    pub fn insecure_no_authentication(mut self) -> Self {
        self.auth = Auth::Insecure;
        self.auth_chosen = true;
        self
    }

    /// Listen on this address for peers (default: do not listen; a node that only sends
    /// needs no listener). Port 0 picks a free port: see
    /// [`NodeHandle::local_addr`](crate::tcp::NodeHandle::local_addr).
    pub fn listen(mut self, addr: SocketAddr) -> Self {
        self.explicit.set(move |c| c.listen = Some(addr));
        self
    }

    /// The largest frame this node accepts, in bytes (default 1 MiB, 4 KiB to 16 MiB). A
    /// message whose encoding does not fit a frame cannot be sent. A peer can make this node
    /// buffer up to this much per connection.
    pub fn max_frame_length(mut self, bytes: usize) -> Self {
        self.explicit.set(move |c| c.max_frame_length = bytes);
        self
    }

    /// Bytes of frames held per connection at most, queued or being written to the socket
    /// (default 4 MiB, at least twice `max_frame_length`); beyond, deliveries and ACKs are
    /// dropped (and retransmitted). Deliveries waiting for a connection being made are bounded
    /// by about as much. A frame is encoded before its size is checked, so for a
    /// moment one more frame may be held: never more than this plus one frame.
    pub fn max_output_bytes(mut self, bytes: usize) -> Self {
        self.explicit.set(move |c| c.max_output_bytes = bytes);
        self
    }

    /// Authenticated incoming connections open at once (default 256); more are closed after
    /// their handshake (counted in `connections_refused`). Connections still in their
    /// handshake do not count here but against [`max_handshakes`](Self::max_handshakes).
    pub fn max_connections(mut self, n: usize) -> Self {
        self.explicit.set(move |c| c.max_connections = n);
        self
    }

    /// Incoming connections in their handshake at once (default 64). A new one beyond
    /// closes the oldest (counted in `handshakes_evicted`), so that connections that never
    /// authenticate cannot keep an honest peer out: under a flood of `r` connections a
    /// second, a handshake has about `n / r` seconds (64 / 1 000 a second: 64 ms, many round
    /// trips), besides `handshake_timeout`.
    pub fn max_handshakes(mut self, n: usize) -> Self {
        self.explicit.set(move |c| c.max_handshakes = n);
        self
    }

    /// Producer incarnations remembered per remote address for routing ACKs and reusing
    /// encoded bodies (default 1024; least recently used forgotten).
    pub fn max_routes(mut self, n: usize) -> Self {
        self.explicit.set(move |c| c.max_routes = n);
        self
    }

    /// A connection whose handshake takes longer is closed (default 5 s).
    pub fn handshake_timeout(mut self, timeout: Duration) -> Self {
        self.explicit.set(move |c| c.handshake_timeout = timeout);
        self
    }

    /// A connection attempt that takes longer fails (default 5 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.explicit.set(move |c| c.connect_timeout = timeout);
        self
    }

    /// Send a heartbeat after this long without sending anything (default 1 s).
    pub fn heartbeat_interval(mut self, interval: Duration) -> Self {
        self.explicit.set(move |c| c.heartbeat_interval = interval);
        self
    }

    /// Close a connection after this long without receiving anything (default 10 s, longer
    /// than `heartbeat_interval`): a peer or path that went silent is detected, and the
    /// connection made again.
    pub fn idle_timeout(mut self, timeout: Duration) -> Self {
        self.explicit.set(move |c| c.idle_timeout = timeout);
        self
    }

    /// Waits between reconnection attempts double from `min` to `max` (default 100 ms to
    /// 5 s), each shortened by a random part of up to half.
    pub fn reconnect_backoff(mut self, min: Duration, max: Duration) -> Self {
        self.explicit.set(move |c| {
            c.reconnect_min = min;
            c.reconnect_max = max;
        });
        self
    }

    /// The highest protocol version this node offers when it connects to a peer (default 4,
    /// the newest this release speaks; 3 to 4). A connection speaks the highest version both
    /// of its nodes speak: the connecting node offers this version at most, and the accepting
    /// one answers with the highest it speaks up to that offer (whatever its own setting).
    ///
    /// For a rolling upgrade from a release that speaks an older version only (and refuses a
    /// connection that offers more): set this to that version on every node of this release
    /// until every node runs this release, then raise it, a node at a time.
    ///
    /// Version 3 has no chunks: a chunk of a large message
    /// ([`chunk_size`](crate::ProducerOptionsBuilder::chunk_size)) is never sent on a
    /// connection at version 3. It is held back and warned about, and stays unconfirmed: its
    /// producer retransmits it, and it is held again, each time counted in
    /// [`NodeStats::chunks_held_for_version`](crate::tcp::NodeStats::chunks_held_for_version)
    /// (counted per held transmission, not per chunk). The producer's window stays occupied,
    /// so a producer that chunks stalls on a version-3 link until the connection is made again
    /// at 4 or its [`max_attempts`](crate::ProducerOptionsBuilder::max_attempts) gives the
    /// message up.
    pub fn wire_version(mut self, version: u16) -> Self {
        self.explicit.set(move |c| c.wire_version = version);
        self
    }

    /// Validates and returns the options.
    ///
    /// # Errors
    /// [`OptionsError`] naming the first invalid field; `secret` if no mode (a secret, TLS or
    /// the insecure mode) was chosen; `tls` if a listening TLS node has no certificate.
    pub fn build(self) -> Result<NodeOptions, OptionsError> {
        if !self.auth_chosen {
            return Err(OptionsError::new(
                "secret",
                "set a secret (or TLS), or choose insecure_no_authentication() explicitly",
            ));
        }
        let options = NodeOptions {
            auth: self.auth,
            config: self.explicit.apply(self.loaded),
            resolver: self.resolver,
            #[cfg(feature = "metrics")]
            metrics_label: self.metrics_label,
        };
        options.validate()?;
        Ok(options)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secure() -> NodeOptionsBuilder {
        NodeOptions::builder().secret(NodeSecret::new([7; 32]).unwrap())
    }

    #[test]
    fn authentication_must_be_chosen() {
        assert_eq!(NodeOptions::builder().build().unwrap_err().field, "secret");
        assert!(secure().build().unwrap().secret().is_some());
        let insecure = NodeOptions::builder()
            .insecure_no_authentication()
            .build()
            .unwrap();
        assert!(insecure.secret().is_none());
    }

    #[test]
    fn every_invalid_field_is_named() {
        let cases: Vec<(&str, NodeOptionsBuilder)> = vec![
            ("max_frame_length", secure().max_frame_length(4095)),
            ("max_frame_length", secure().max_frame_length(17 << 20)),
            ("max_output_bytes", secure().max_output_bytes(1 << 20)),
            ("max_connections", secure().max_connections(0)),
            ("max_handshakes", secure().max_handshakes(0)),
            ("max_routes", secure().max_routes(0)),
            ("wire_version", secure().wire_version(2)),
            ("wire_version", secure().wire_version(5)),
            (
                "handshake_timeout_ms",
                secure().handshake_timeout(Duration::ZERO),
            ),
            (
                "connect_timeout_ms",
                secure().connect_timeout(crate::config::MAX_DURATION * 2),
            ),
            (
                "heartbeat_interval_ms",
                secure().heartbeat_interval(Duration::ZERO),
            ),
            (
                "idle_timeout_ms",
                secure()
                    .heartbeat_interval(Duration::from_secs(2))
                    .idle_timeout(Duration::from_secs(2)),
            ),
            (
                "reconnect_max_ms",
                secure().reconnect_backoff(Duration::from_secs(2), Duration::from_secs(1)),
            ),
        ];
        for (field, builder) in cases {
            assert_eq!(builder.build().unwrap_err().field, field);
        }
        assert!(secure()
            .max_frame_length(4096)
            .max_output_bytes(8192)
            .build()
            .is_ok());
        for version in 3..=4 {
            let options = secure().wire_version(version).build().unwrap();
            assert_eq!(options.config().wire_version, version);
        }
    }
}
