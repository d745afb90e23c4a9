//! The `tracing` spans of the crate (feature `tracing`). Every span has the target
//! `actix_delivery`; fields that a span learns only at its end start empty and are recorded
//! then. The crate's `log` records stay `log` records (a `tracing-log` bridge shows them inside
//! these spans).
//!
//! | span | level | fields |
//! |---|---|---|
//! | `handler` | `DEBUG` | `consumer` (the name given to [`ConsumerOptionsBuilder::name`](crate::ConsumerOptionsBuilder::name), default `default`), `producer_id`, `seq`, `traceparent` (the delivery's [`TraceContext`], if it has one) |
//! | `journal.commit` | `DEBUG` | `journal` (`sqlite`, `postgres`), `stream` (the persistence id of the group's first write), `streams`, `writes`, `events` (appended) |
//! | `recovery` | `INFO` | `kind` (`persistent_entity`, `durable_producer`), `persistence_id` (the stream), then `events` (events replayed, a persistent entity) or `resumed` (unsettled messages sent again, a durable producer; its log's own recovery is a `persistent_entity` span of the same stream) |
//! | `tcp.connection` | `INFO` | `direction` (`inbound`, `outbound`), `peer_addr` (the address dialed, a name or a socket address; or the socket address a connection came from), then `peer_node` (the peer's node id for its run) and `peer_identity` (its TLS names, mutual TLS) |
//! | `tcp.handshake` | `DEBUG` | `outcome` (`established`, or why it failed), inside its connection's span |
//! | `nats.subscription` | `INFO` | `subject`, `queue_group` |
//!
//! Each span is made here but one: `journal.commit` is made beside the journals' writes
//! (`journal::write`), so that telemetry imports nothing of the subsystems (a leaf).
//!
//! The handler span is the one opened per message, so it is at `DEBUG`: a service whose
//! subscriber records `INFO` pays one relaxed atomic load per message for it (measured by
//! `examples/bench_report.rs --features tracing`). A handler span covers every poll of the handler's future (and, for a pipelined handler,
//! of the outcome future it hands off); a connection span covers the connection's handshake
//! and life; a subscription span the subscription's life.

use tracing::field::Empty;
use tracing::Span;

use crate::protocol::envelope::Header;
#[cfg(doc)]
use crate::protocol::trace_context::TraceContext;

/// The consumer name of spans whose consumer was not named.
pub(crate) const DEFAULT_CONSUMER: &str = "default";

/// The span of one handler run.
pub(crate) fn handler(consumer: &str, header: &Header) -> Span {
    let span = tracing::debug_span!(
        target: "actix_delivery",
        "handler",
        consumer,
        producer_id = header.producer_id.as_str(),
        seq = header.seq,
        traceparent = Empty,
    );
    if let Some(context) = &header.trace_context {
        span.record("traceparent", tracing::field::display(context));
    }
    span
}

/// The span of a recovery (`kind`: what recovers); record `events` (a persistent entity's
/// replayed events) or `resumed` (a durable producer's unsettled messages) when done.
pub(crate) fn recovery(kind: &'static str, persistence_id: &str) -> Span {
    tracing::info_span!(
        target: "actix_delivery",
        "recovery",
        kind,
        persistence_id,
        events = Empty,
        resumed = Empty,
    )
}

/// The span of one TCP connection's life, from its handshake on; record `peer_node` (the
/// peer's node id for its run) and `peer_identity` (its TLS names) once they are known.
pub(crate) fn connection(direction: &'static str, peer_addr: &dyn std::fmt::Display) -> Span {
    tracing::info_span!(
        target: "actix_delivery",
        "tcp.connection",
        direction,
        peer_addr = %peer_addr,
        peer_node = Empty,
        peer_identity = Empty,
    )
}

/// Records what the handshake learnt of the peer on its connection's `span`.
pub(crate) fn established(span: &Span, peer: &dyn std::fmt::Display, identity: Option<&[String]>) {
    span.record("peer_node", tracing::field::display(peer));
    if let Some(names) = identity {
        span.record("peer_identity", tracing::field::debug(names));
    }
}

/// The span of one TCP handshake (inside its connection's span); records `outcome`.
pub(crate) fn handshake() -> Span {
    tracing::debug_span!(target: "actix_delivery", "tcp.handshake", outcome = Empty)
}

/// The span of one NATS subscription's life.
#[cfg(feature = "nats")]
pub(crate) fn subscription(subject: &str, queue_group: Option<&str>) -> Span {
    tracing::info_span!(
        target: "actix_delivery",
        "nats.subscription",
        subject,
        queue_group,
    )
}
