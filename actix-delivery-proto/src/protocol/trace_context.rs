//! The trace context a delivery may carry: the W3C Trace Context `traceparent` (trace id,
//! parent span id, flags), so that a trace follows a message from `send` to its handler, also
//! on another node. The crate never makes or interprets contexts: the producer's
//! `trace_context` hook sets one per message
//! (read from the application's tracing system), the handler reads it from
//! `DeliveryInfo::trace_context`.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// A W3C Trace Context `traceparent`: a 16-byte trace id, the 8-byte id of the span the
/// message was sent in, and the trace flags (bit 0: sampled). Shared, so that the envelopes
/// that carry it grow by one pointer only: making one allocates once, cloning it allocates
/// nothing, and a message without one allocates nothing (and takes one byte on the wire; a
/// context takes 26).
///
/// Made through [`new`](Self::new) or [`parse_traceparent`](Self::parse_traceparent), a
/// context is valid (neither id is all zeros, as W3C requires). One received from a peer is
/// untrusted: admission makes a delivery whose context is not valid a dead letter
/// (`DeadLetterReason::InvalidTraceContext`).
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TraceContext(Arc<Parts>);

/// The parts of a [`TraceContext`], as they go on the wire.
#[derive(PartialEq, Eq, Hash, Serialize, Deserialize)]
struct Parts {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    flags: u8,
}

/// The `traceparent` version this crate writes (and the only one whose layout it knows).
const VERSION: &str = "00";

impl TraceContext {
    /// The sampled flag (W3C `trace-flags` bit 0).
    pub const SAMPLED: u8 = 0x01;

    /// How many values share this context's allocation: for the leak checks of the shells'
    /// tests, not an API.
    #[doc(hidden)]
    pub fn holders(&self) -> usize {
        Arc::strong_count(&self.0)
    }

    /// A context, or `None` if an id is all zeros (invalid in W3C Trace Context).
    pub fn new(trace_id: [u8; 16], span_id: [u8; 8], flags: u8) -> Option<Self> {
        let parts = Parts {
            trace_id,
            span_id,
            flags,
        };
        let valid = trace_id != [0; 16] && span_id != [0; 8];
        valid.then(|| Self(Arc::new(parts)))
    }

    /// The trace id.
    pub fn trace_id(&self) -> [u8; 16] {
        self.0.trace_id
    }

    /// The id of the span the message was sent in (the handler's parent).
    pub fn span_id(&self) -> [u8; 8] {
        self.0.span_id
    }

    /// The trace flags.
    pub fn flags(&self) -> u8 {
        self.0.flags
    }

    /// Whether the sender sampled the trace (flag bit 0).
    pub fn is_sampled(&self) -> bool {
        self.0.flags & Self::SAMPLED != 0
    }

    /// Whether neither id is all zeros; always true of a context made by this type's
    /// constructors, not necessarily of one decoded from a peer's bytes.
    pub fn is_valid(&self) -> bool {
        self.0.trace_id != [0; 16] && self.0.span_id != [0; 8]
    }

    /// The `traceparent` header value: `00-<32 hex trace id>-<16 hex span id>-<2 hex flags>`.
    pub fn to_traceparent(&self) -> String {
        self.to_string()
    }

    /// Reads a `traceparent` header value of version `00` (lowercase hex, as W3C requires).
    /// `None` if it is malformed, of another version, or has an all-zero id.
    pub fn parse_traceparent(value: &str) -> Option<Self> {
        let mut parts = value.split('-');
        let (version, trace, span, flags) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        if version != VERSION || parts.next().is_some() {
            return None;
        }
        let mut trace_id = [0; 16];
        let mut span_id = [0; 8];
        let mut flag = [0; 1];
        hex_into(trace, &mut trace_id)?;
        hex_into(span, &mut span_id)?;
        hex_into(flags, &mut flag)?;
        Self::new(trace_id, span_id, flag[0])
    }
}

/// Fills `out` from exactly `2 * out.len()` lowercase hex digits.
fn hex_into(hex: &str, out: &mut [u8]) -> Option<()> {
    let digits = hex.as_bytes();
    if digits.len() != 2 * out.len() {
        return None;
    }
    let digit = |d: u8| match d {
        b'0'..=b'9' => Some(d - b'0'),
        b'a'..=b'f' => Some(d - b'a' + 10),
        _ => None,
    };
    for (byte, pair) in out.iter_mut().zip(digits.chunks_exact(2)) {
        *byte = (digit(pair[0])? << 4) | digit(pair[1])?;
    }
    Some(())
}

/// The `traceparent` form.
impl fmt::Display for TraceContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(VERSION)?;
        f.write_str("-")?;
        self.0
            .trace_id
            .iter()
            .try_for_each(|b| write!(f, "{b:02x}"))?;
        f.write_str("-")?;
        self.0
            .span_id
            .iter()
            .try_for_each(|b| write!(f, "{b:02x}"))?;
        write!(f, "-{:02x}", self.0.flags)
    }
}

impl fmt::Debug for TraceContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TraceContext({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn the_w3c_example_round_trips_through_traceparent() {
        let context = TraceContext::parse_traceparent(EXAMPLE).expect("valid");
        assert_eq!(context.trace_id()[..2], [0x4b, 0xf9]);
        assert_eq!(context.span_id()[7], 0xb7);
        assert!(context.is_sampled());
        assert_eq!(context.to_traceparent(), EXAMPLE);
        assert_eq!(format!("{context:?}"), format!("TraceContext({EXAMPLE})"));
    }

    #[test]
    fn malformed_traceparents_are_refused() {
        for bad in [
            "",
            "00",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902bg-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-é4bf92f3577b34da6a3ce929d0e0e47-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceContext::parse_traceparent(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn all_zero_ids_are_not_valid_contexts() {
        assert!(TraceContext::new([0; 16], [1; 8], 0).is_none());
        assert!(TraceContext::new([1; 16], [0; 8], 0).is_none());
        let context = TraceContext::new([1; 16], [2; 8], 0).expect("valid");
        assert!(context.is_valid() && !context.is_sampled());
    }

    #[test]
    fn on_the_wire_a_context_takes_25_bytes_and_its_absence_one() {
        let context = TraceContext::new([1; 16], [2; 8], 1);
        assert_eq!(crate::codec::encode(&context).unwrap().len(), 1 + 25);
        assert_eq!(
            crate::codec::encode(&None::<TraceContext>).unwrap(),
            vec![0]
        );
        let decoded: Option<TraceContext> =
            crate::codec::decode(&crate::codec::encode(&context).unwrap()).unwrap();
        assert_eq!(decoded, context);
    }
}
