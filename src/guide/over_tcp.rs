//! # Across processes over TCP
//!
//! A [`NodeHandle`](crate::tcp::NodeHandle) per process carries deliveries and ACKs over TCP,
//! with no server in between. A node listens on an address and exposes local consumers under
//! names; other nodes get a [`ConsumerRef`](crate::ConsumerRef) for (address, name) that an
//! unchanged producer sends to, and ACKs come back on the same connection. Everything in
//! [Guarantees](super::guarantees) holds across processes: a lost connection, a dropped frame or a
//! consumer process that crashed only delays confirmations. A consumer process that restarts
//! loses its in-memory dedup; a [persistent consumer](super::effectively_once) does not.
//!
//! ```
//! use actix_delivery::tcp::{NodeHandle, NodeOptions, NodeSecret};
//! use actix_delivery::{ConsumerOptions, DeliveryHandler, ProducerOptions, ReliableDelivery};
//!
//! # #[actix::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Every node of the cluster shares one secret: 32 random bytes, kept like a password
//! // (in production: NodeSecret::new(std::env::var("CLUSTER_SECRET")?)?).
//! let secret = NodeSecret::new([7; 32])?;
//!
//! // The consumer's process: listen, expose a consumer under a name.
//! let consumer = ReliableDelivery::consumer(
//!     ConsumerOptions::builder(DeliveryHandler::from_fn(|order: String| async move {
//!         println!("handling {order}");
//!         Ok::<(), std::io::Error>(())
//!     }))
//!     .build()?,
//! );
//! let server = NodeHandle::start(
//!     NodeOptions::builder().secret(secret.clone()).listen("127.0.0.1:0".parse()?).build()?,
//! )
//! .await?;
//! server.expose("orders", &consumer)?;
//! let address = server.local_addr().expect("a listening node has an address");
//!
//! // The producer's process (a node that only sends need not listen).
//! let client = NodeHandle::start(NodeOptions::builder().secret(secret).build()?).await?;
//! let orders = client.consumer_ref::<String>(address, "orders")?;
//! let producer = ReliableDelivery::producer(ProducerOptions::builder(orders).build()?);
//! producer.send("espresso".to_string()).await?; // handled and ACKed on the other node
//! # Ok(()) }
//! ```
//!
//! `cargo run --example two_nodes` runs the consumer node as a child process, SIGKILLs and
//! restarts it mid-run, and still gets every message confirmed; `-- consumer ADDR` and
//! `-- producer ADDR` run the two sides in two terminals, and `--features tls … -- --tls` the same
//! over mutual TLS.
//!
//! - **Lifetime.** A node runs until [`NodeHandle::stop`](crate::tcp::NodeHandle::stop) or until
//!   its last handle is dropped: its clones and the `ConsumerRef`s from `consumer_ref` (a
//!   producer's reference keeps its node running). Exposed consumers do not: keep a handle for as
//!   long as the node should listen.
//! - **Addresses or names.** `consumer_ref` takes a `SocketAddr` or a
//!   [`PeerAddr`](crate::tcp::PeerAddr) parsed from `"10.0.0.7:7100"` or
//!   `"orders.internal:7100"`. A name is resolved on every connection attempt, so a peer whose
//!   name moves to another address (a pod restarted elsewhere) is reached there without
//!   restarting the producer. `NodeOptionsBuilder::resolver` replaces the system's resolver.
//! - **Connections** are made on the first delivery to an address (or before it with
//!   [`dial`](crate::tcp::NodeHandle::dial)), kept with heartbeats, and made again after a loss
//!   with backoff. The first deliveries wait for the connection and go out once it is up. A
//!   restarted node is a new node: each draws a random node id at start.
//! - **Bounded and untrusted.** Each body is encoded once per message, not per retransmission.
//!   What a peer sends is untrusted and bounded, whatever it sends: per connection output,
//!   frames, routes, waiting ACKs, handshakes. The [`tcp`](crate::tcp) module documents the wire
//!   format, the handshake and every bound; [`NodeStats`](crate::tcp::NodeStats) counts every
//!   drop and refusal.
//!
//! Messages larger than a frame (`max_frame_length`, 1 MiB by default) go in
//! [chunks](super::large_messages). Types that change between releases:
//! [Bodies on the wire](super::schema_evolution#bodies-on-the-wire-rolling-deploys).
//!
//! ## Security: three modes
//!
//! A node runs in one of three modes, chosen on its options. A TLS node and a node without TLS
//! refuse each other at the handshake with a clear reason, counted, and so do a node with the
//! secret and one without. Between the two TLS modes the listener decides: a mutual listener
//! refuses a node that presents no certificate; a one-way listener asks for none, so a mutual node
//! delivers to it, without an identity there.
//!
//! | mode | option | peers are | traffic is | who may deliver to a consumer |
//! |---|---|---|---|---|
//! | shared secret | `.secret(NodeSecret)` | members (hold the secret) | authenticated, **in clear** | any member |
//! | TLS (feature `tls`) | `.tls(NodeTls)` without `mutual()` | the listening node is authenticated by its certificate | encrypted and authenticated (TLS 1.3) | anyone who can connect |
//! | mutual TLS (feature `tls`) | `.tls(NodeTls … .mutual())` | both authenticated by certificates; the connecting node has an **identity** | encrypted and authenticated (TLS 1.3) | any member, or only the identities given to `NodeHandle::expose_to` |
//!
//! **Shared secret.** Nodes authenticate each other by an HMAC-SHA256 challenge–response over
//! everything both sides announced (fresh nonces, node ids, versions, mode, frame limits); the
//! secret never crosses the wire. Then every frame carries a tag under a per-connection,
//! per-direction session key. Against an attacker without the secret that gives:
//!
//! - **No delivery, no ACK from outside.** A connection that fails the handshake is closed before
//!   any frame is read; replayed and reflected handshakes fail.
//! - **No injection into a live connection.** An on-path attacker cannot insert, alter, replay,
//!   reorder or remove frames: the next tag fails and the connection closes (it is made again).
//!
//! It does **not** give *confidentiality* (bodies, names, producer ids and incarnation tokens
//! travel in clear: use TLS, WireGuard or a service mesh when the network is not private),
//! *identity within the cluster* (any holder of the secret can deliver to any exposed consumer, or
//! accept connections meant for another address if it can redirect them) or *protection of a weak
//! secret* (a recorded handshake allows offline guessing: use 32 random bytes).
//!
//! **TLS** (feature `tls`: rustls, the `ring` provider, TLS 1.3 only). The frames are the same,
//! inside TLS and without tags. The connecting node checks the listening node's certificate
//! against its roots (`NodeTls`, from PEM or from rustls configurations),
//! its validity and the name it connects to: the host of a name, never the IP that name resolved
//! to, or for an address its IP (as an IP subject alternative name). A host that is not a DNS
//! name a certificate can be checked for (`orders.0`, `0x1f`) is refused when the `PeerAddr` is
//! made. Without `mutual()` the connecting side is anonymous: anyone who can reach the listener
//! can deliver, though nobody on the path can read or alter the traffic.
//!
//! **Mutual TLS** closes the secret mode's gap of identity. A connecting node's identity is the
//! DNS names of its certificate's subject alternative names;
//! `node.expose_to("orders", &consumer, ["billing.internal"])` admits deliveries from those
//! identities only: a delivery from any other member is refused before it reaches the consumer,
//! counted in `unauthorized_deliveries`, and closes its connection. ACKs come back only on the
//! connection the delivery went out on, to a node whose certificate was checked.
//!
//! **Open in every mode**: *availability* (an on-path attacker can drop, delay or cut
//! connections; delivery stalls and resumes afterwards, nothing is lost or confirmed unhandled);
//! *a compromised member* (a node with the secret, or a certificate of an authorized identity, can
//! deliver what it likes to what it may reach: keep CAs and identities narrow); *incarnation
//! tokens as capabilities* ([Trust](super::guarantees#trust-the-incarnation-is-a-capability)).
//! Certificates are not reloaded while a node runs: rotate by starting nodes with new settings.
//! Unauthenticated peers are bounded (`max_handshakes` in their handshake, the oldest evicted by a
//! new one, each buffering at most 256 bytes for at most `handshake_timeout`), so a flood of
//! connections without the secret cannot lock an honest node out.
//!
//! Running without any authentication is `NodeOptions::builder().insecure_no_authentication()`,
//! logged as a warning at start.
