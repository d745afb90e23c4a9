//! Origins named inside a body, and the rule that binds them to the delivery carrying them.
//!
//! A pool (a sharded producer, a work-pulling producer) takes each message of its producer and
//! sends it on over a stream of its own: one per entity, one per worker. The message keeps its
//! stable id at the producer (its *origin*: producer id, incarnation, seq) inside the body, so
//! that an effectively-once receiver records the origin, not the stream it came by. A body is
//! written by the sender, though: were its origin taken as written, anyone who may send to the
//! receiver could name another producer's origin (whose public `IncarnationId` is safe to
//! log, so known) with a high seq and move that producer's window at the receiver, after
//! which its genuine messages are judged stale and confirmed without being applied.
//!
//! So an origin must be bound to the delivery that carries it: only the sender speaks for the
//! sender.
//!
//! - A pool's stream carries a **derived token**: [`sub_stream_token`] of the producer's
//!   incarnation token and what the stream is for (the entity, or the pool). It is the same
//!   for every stream the pool opens for that purpose in that producer life (a durable
//!   producer keeps its token across restarts, so across those too), and it cannot be made
//!   from the public id of either token.
//! - The origin names the producer's id and the **public id of that derived token**; its seq
//!   is the message's seq at the producer.
//! - A receiver admits the body only if [`check_origin`] holds: the carrying delivery's
//!   incarnation token has exactly the origin's public id (so its sender holds the token, not
//!   just its id), and the carrying stream's producer id is the origin's, `/` and a suffix.
//!   Otherwise the delivery is a dead letter ([`DeadLetterReason::ForeignOrigin`]): counted,
//!   not run, not acknowledged, and no window moves.
//!
//! Whoever holds a derived token may speak for the origins it names, as whoever holds a
//! producer's token may speak for the producer (see "Trust" in actix-delivery's guide, chapter "Guarantees and limits"); a public
//! `IncarnationId` grants nothing.

use sha2::{Digest, Sha256};

use crate::protocol::envelope::{DeadLetterReason, DeliveryInfo, Header, Incarnation, ProducerId};

/// The ids of a pool's streams: `<producer id>/<the stream's number, 16 hex digits>`, so that
/// a stream's id names the producer it speaks for ([`check_origin`]) and the pool finds the
/// stream an ACK is for by its number.
#[derive(Clone, Debug)]
pub struct SubStreamIds {
    /// `<producer id>/`.
    prefix: String,
    /// The id [`number`](Self::number) read last, and its number: the ACKs of one batch
    /// share their id, most often the very string, which is then found by pointer.
    last: Option<(ProducerId, u64)>,
}

impl SubStreamIds {
    /// The ids of the streams of `producer`'s pool.
    pub fn new(producer: &ProducerId) -> Self {
        Self {
            prefix: format!("{producer}/"),
            last: None,
        }
    }

    /// The id of stream `number`.
    pub fn id(&self, number: u64) -> String {
        format!("{}{number:016x}", self.prefix)
    }

    /// The number of the stream `id` names: `None` unless `id` is exactly one of these ids.
    pub fn number(&mut self, id: &ProducerId) -> Option<u64> {
        match &self.last {
            // The very string (a pointer compare): comparing the bytes of ids that differ
            // only at their end cost as much as parsing them.
            Some((last, number)) if std::ptr::eq(last.as_str(), id.as_str()) => Some(*number),
            _ => {
                let number = self.parse(id.as_str())?;
                self.last = Some((id.clone(), number));
                Some(number)
            }
        }
    }

    fn parse(&self, id: &str) -> Option<u64> {
        let digits = id.strip_prefix(self.prefix.as_str())?;
        if digits.len() != 16 {
            return None;
        }
        // By hand: a pool parses every ACK's id, and `from_str_radix` after a check of the
        // digits cost 390 instructions of a work-pulling job's 6 800.
        digits.bytes().try_fold(0u64, |number, digit| {
            let value = match digit {
                b'0'..=b'9' => digit - b'0',
                b'a'..=b'f' => digit - b'a' + 10,
                _ => return None,
            };
            Some(number << 4 | u64::from(value))
        })
    }
}

/// The token of a stream a pool opens on behalf of the producer whose token is `parent`, for
/// `purpose` (a domain label) and `key` (the entity id; empty for one token per pool): the
/// first 128 bits of SHA-256 over a fixed label, the parent token and both, length-prefixed.
/// Deterministic, so the pool's streams share it across reopenings and across restarts of a
/// durable producer; one-way, so neither it nor `parent` can be made from a public id.
pub fn sub_stream_token(parent: Incarnation, purpose: &str, key: &[u8]) -> Incarnation {
    let digest = Sha256::new()
        .chain_update(b"actix-delivery sub-stream token\0")
        .chain_update(parent.as_u128().to_le_bytes())
        .chain_update((purpose.len() as u64).to_le_bytes())
        .chain_update(purpose.as_bytes())
        .chain_update((key.len() as u64).to_le_bytes())
        .chain_update(key)
        .finalize();
    let mut first = [0u8; 16];
    first.copy_from_slice(&digest[..16]);
    Incarnation::from_u128(u128::from_le_bytes(first))
}

/// Whether `origin`, named inside the body of the delivery `carrier`, is the carrier's own:
/// `carrier`'s token has the origin's public incarnation id, and its producer id is the
/// origin's followed by `/` (a stream of the origin's producer).
///
/// # Errors
/// [`DeadLetterReason::ForeignOrigin`] otherwise.
pub fn check_origin(carrier: &Header, origin: &DeliveryInfo) -> Result<(), DeadLetterReason> {
    let own_stream = carrier
        .producer_id
        .as_str()
        .strip_prefix(origin.producer_id.as_str())
        .is_some_and(|rest| rest.starts_with('/'));
    if own_stream && carrier.incarnation.id() == origin.incarnation {
        Ok(())
    } else {
        Err(DeadLetterReason::ForeignOrigin)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sub_stream_id_gives_back_its_number_and_nothing_else_gives_one() {
        let mut ids = SubStreamIds::new(&ProducerId::from("orders"));
        let id = ids.id(0xab);
        assert_eq!(id, "orders/00000000000000ab");
        let id = ProducerId::from(id);
        assert_eq!(ids.number(&id), Some(0xab));
        assert_eq!(ids.number(&id.clone()), Some(0xab), "the same id again");
        let copy = ProducerId::from(id.as_str());
        assert_eq!(
            ids.number(&copy),
            Some(0xab),
            "an equal id in another string"
        );
        let max = ProducerId::from(ids.id(u64::MAX));
        assert_eq!(ids.number(&max), Some(u64::MAX));
        assert_eq!(ids.number(&id), Some(0xab), "the first id after another");
        for other in [
            "orders/ab",                // too short
            "orders/+0000000000000ab",  // a sign from_str_radix would take
            "orders/00000000000000ab0", // too long
            "orders/00000000000000ag",  // not hex
            "orders/00000000000000AB",  // not as `id` writes it
            "others/00000000000000ab",  // another producer
            "orders00000000000000ab",   // no separator
        ] {
            assert_eq!(ids.number(&ProducerId::from(other)), None, "{other}");
            assert_eq!(ids.number(&id), Some(0xab), "after {other}");
        }
    }

    fn carrier(id: &str, token: Incarnation) -> Header {
        Header {
            producer_id: ProducerId::from(id),
            incarnation: token,
            seq: 1,
            window_start: 1,
            trace_context: None,
            chunk: None,
        }
    }

    fn origin(id: &str, token: Incarnation) -> DeliveryInfo {
        DeliveryInfo {
            producer_id: ProducerId::from(id),
            incarnation: token.id(),
            seq: 1_000_000,
            window_start: 1_000_000,
            trace_context: None,
            first_seq: None,
        }
    }

    #[test]
    fn a_sub_stream_token_is_stable_and_differs_by_parent_purpose_and_key() {
        let parent = Incarnation::from_u128(42);
        let token = sub_stream_token(parent, "entity", b"alice");
        assert_eq!(token, sub_stream_token(parent, "entity", b"alice"));
        assert_ne!(token, sub_stream_token(parent, "entity", b"bob"));
        assert_ne!(token, sub_stream_token(parent, "jobs", b"alice"));
        assert_ne!(
            token,
            sub_stream_token(Incarnation::from_u128(43), "entity", b"alice")
        );
        // Length prefixes: a purpose cannot borrow the key's bytes.
        assert_ne!(
            sub_stream_token(parent, "ab", b"c"),
            sub_stream_token(parent, "a", b"bc")
        );
        assert_ne!(token, parent);
        // Fixed across processes and releases (entities store the ids of these tokens).
        assert_eq!(
            token.id().to_string(),
            sub_stream_token(parent, "entity", b"alice")
                .id()
                .to_string()
        );
    }

    #[test]
    fn an_origin_is_admitted_only_from_a_stream_of_its_producer_holding_its_token() {
        let token = sub_stream_token(Incarnation::from_u128(7), "entity", b"e");
        let named = origin("orders", token);
        assert_eq!(check_origin(&carrier("orders/1f", token), &named), Ok(()));
        // The public id is known to everyone: a forger's own token does not have it.
        let forger = Incarnation::from_u128(99);
        assert_eq!(
            check_origin(&carrier("orders/1f", forger), &named),
            Err(DeadLetterReason::ForeignOrigin)
        );
        // The right token on another producer's stream, or on the producer's own main stream.
        for id in ["billing/1f", "orders", "orders-eu/1f", "ordersX/1f"] {
            assert_eq!(
                check_origin(&carrier(id, token), &named),
                Err(DeadLetterReason::ForeignOrigin),
                "{id}"
            );
        }
    }
}
