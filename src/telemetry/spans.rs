//! The `tracing` spans of the crate (feature `tracing`). Every span has the target
//! `actix_delivery`; fields that a span learns only at its end start empty and are recorded
//! then. The crate's `log` records stay `log` records (a `tracing-log` bridge shows them inside
//! these spans).
//!
//! | span | level | fields |
//! |---|---|---|
//! | `handler` | `INFO` | `consumer` (the name given to [`ConsumerOptionsBuilder::name`](crate::ConsumerOptionsBuilder::name), default `default`), `producer_id`, `seq`, `traceparent` (the delivery's [`TraceContext`], if it has one) |
//! | `journal.commit` | `DEBUG` | `journal` (`sqlite`, `postgres`), `stream` (the persistence id of the group's first write), `streams`, `writes`, `events` (appended) |
//! | `recovery` | `INFO` | `kind` (`persistent_entity`, `durable_producer`), `persistence_id`, then `events` (replayed) |
//! | `tcp.connection` | `INFO` | `direction` (`inbound`, `outbound`), `peer_addr`, `node` (this node's name), `peer_name` (the name dialed, outbound) |
//! | `tcp.handshake` | `DEBUG` | `direction`, `peer_addr`, inside its connection's span |
//! | `nats.subscription` | `INFO` | `subject`, `queue_group` |
//!
//! A handler span covers every poll of the handler's future (and, for a pipelined handler,
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
    let span = tracing::info_span!(
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

/// The span of one journal transaction.
pub(crate) fn journal_commit(
    journal: &'static str,
    stream: &str,
    streams: usize,
    writes: usize,
    events: usize,
) -> Span {
    tracing::debug_span!(
        target: "actix_delivery",
        "journal.commit",
        journal,
        stream,
        streams,
        writes,
        events,
    )
}

/// The span of a recovery (`kind`: what recovers); record `events` when done.
pub(crate) fn recovery(kind: &'static str, persistence_id: &str) -> Span {
    tracing::info_span!(
        target: "actix_delivery",
        "recovery",
        kind,
        persistence_id,
        events = Empty,
    )
}

/// The span of one TCP connection's life.
pub(crate) fn connection(
    direction: &'static str,
    peer_addr: &dyn std::fmt::Display,
    node: &str,
    peer_name: Option<&str>,
) -> Span {
    tracing::info_span!(
        target: "actix_delivery",
        "tcp.connection",
        direction,
        peer_addr = %peer_addr,
        node,
        peer_name,
    )
}

/// The span of one TCP handshake (inside its connection's span).
pub(crate) fn handshake(direction: &'static str, peer_addr: &dyn std::fmt::Display) -> Span {
    tracing::debug_span!(
        target: "actix_delivery",
        "tcp.handshake",
        direction,
        peer_addr = %peer_addr,
    )
}

/// The span of one NATS subscription's life.
pub(crate) fn subscription(subject: &str, queue_group: Option<&str>) -> Span {
    tracing::info_span!(
        target: "actix_delivery",
        "nats.subscription",
        subject,
        queue_group,
    )
}
