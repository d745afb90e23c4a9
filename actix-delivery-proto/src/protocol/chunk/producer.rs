//! The producer of chunked messages: each message's chunks are deliveries of an ordinary
//! [`ProducerCore`] (its window, retransmission, backoff, `max_attempts` and ACK validation,
//! unchanged), grouped back into messages here. Pure: time is an argument.
//!
//! # The rules (on top of the producer's)
//!
//! - A message of `n` chunks takes `n` consecutive seqs; its chunks are numbered when it is
//!   started (after every message before it) and take window slots one by one, in order.
//! - A chunk's ACK frees its slot; the **last chunk's ACK confirms the message**, once, and
//!   forgets its other chunks (in flight or not yet sent).
//! - `window_start` never passes the first seq of a message that is not settled, so a
//!   consumer that lost the message's chunks (it starts a fresh window) still admits them.
//! - A **round**: when the last chunk is due for retransmission (no ACK within
//!   `resend_timeout`) while every other chunk of its message was ACKed, the consumer may have
//!   lost them (a restart, an eviction, a failed handler): the whole message is sent again,
//!   every chunk under its seq, from the first, through the window, before anything newer (the
//!   last chunk gives its slot up for that, so a window of one slot cannot deadlock). With
//!   `max_attempts`, a message sent whole that many times is given up.
//! - A chunk given up after `max_attempts` gives its whole message up; stopping settles each
//!   message once.

use std::collections::VecDeque;
use std::time::Instant;

use bytes::Bytes;

use crate::config::ProducerConfig;
use crate::error::DeliveryError;
use crate::protocol::chunk::ChunkHeader;
use crate::protocol::envelope::{Ack, Incarnation, ProducerId};
use crate::protocol::producer::{ProducerCore, ProducerStats, Transmission};
use crate::protocol::trace_context::TraceContext;

/// One chunk as the inner core holds it: a view of its message's bytes and where it sits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    /// Its message's chunk header.
    pub header: ChunkHeader,
    /// Its bytes.
    pub bytes: Bytes,
}

/// A message whose chunks are numbered.
#[derive(Debug)]
struct Message<C> {
    header: ChunkHeader,
    chunks: Vec<Bytes>,
    confirm: C,
    /// Chunks other than the last that are numbered and not ACKed (in flight or queued).
    outstanding: u32,
    /// Times the message was sent whole (1, then one more per round).
    sendings: u32,
}

/// A message not started yet; `first` if a durable producer numbered it already.
#[derive(Debug)]
struct Pending<C> {
    first: Option<u64>,
    chunks: Vec<Bytes>,
    confirm: C,
}

/// Counters of the grouping (the inner core counts deliveries).
#[derive(Clone, Copy, Debug, Default)]
struct Counts {
    confirmed: u64,
    given_up: u64,
    refused: u64,
    rounds: u64,
    /// Chunks sent again by rounds (the inner core counts them as sent).
    resent: u64,
}

/// The producer state machine for chunked messages. Its messages are encoded bytes; `C` is
/// the confirmation token settled once per message. Used like [`ProducerCore`]: after the
/// `handle_*` calls drain [`poll_transmit`](Self::poll_transmit) and
/// [`poll_settled`](Self::poll_settled), and call [`handle_timeout`](Self::handle_timeout) at
/// [`next_deadline`](Self::next_deadline).
#[derive(Debug)]
pub struct ChunkedProducer<C> {
    inner: ProducerCore<Part, u64>,
    room: usize,
    max_attempts: Option<u32>,
    /// Started messages, ascending by first seq.
    messages: VecDeque<Message<C>>,
    pending: VecDeque<Pending<C>>,
    settled: VecDeque<(C, Result<(), DeliveryError>)>,
    durably_settled_below: u64,
    /// The first seq the next stored message must have.
    next_stored: u64,
    counts: Counts,
}

impl<C> ChunkedProducer<C> {
    /// A producer with the given (validated) settings and incarnation, its randomness drawn
    /// from `random` (see [`ProducerCore::seeded`]; `new`, in the shell, passes the OS CSPRNG).
    pub fn seeded(
        config: &ProducerConfig,
        incarnation: Incarnation,
        random: impl FnMut() -> u64,
    ) -> Self {
        Self::around(ProducerCore::seeded(config, incarnation, random), config)
    }

    /// A durable producer's new life (see [`ProducerCore::resume`]): it keeps `incarnation`,
    /// numbers new messages from `next_seq`, and first sends `resumed` (its stored, unsettled
    /// messages, ascending, whole: every chunk of each) again under their own seqs, its
    /// randomness drawn from `random`.
    ///
    /// # Panics
    /// If a resumed message has no chunks, overlaps the one before, or reaches `next_seq`.
    pub fn resume(
        config: &ProducerConfig,
        incarnation: Incarnation,
        next_seq: u64,
        resumed: impl IntoIterator<Item = (u64, Vec<Bytes>, C)>,
        random: impl FnMut() -> u64,
    ) -> Self {
        let inner = ProducerCore::resume(config, incarnation, next_seq, [], random);
        let mut producer = Self::around(inner, config);
        let mut end = 1;
        for (first, chunks, confirm) in resumed {
            assert!(
                !chunks.is_empty() && first >= end,
                "resumed messages ascend"
            );
            end = first + chunks.len() as u64;
            assert!(end <= next_seq, "resumed messages lie below next_seq");
            producer.pending.push_back(Pending {
                first: Some(first),
                chunks,
                confirm,
            });
        }
        let first = producer.pending.front().and_then(|p| p.first);
        producer.durably_settled_below = first.unwrap_or(next_seq);
        producer.hold_window_start();
        producer
    }

    fn around(inner: ProducerCore<Part, u64>, config: &ProducerConfig) -> Self {
        Self {
            next_stored: inner.next_seq(),
            inner,
            room: config.window_size.saturating_add(config.max_pending),
            max_attempts: config.max_attempts.get(),
            messages: VecDeque::new(),
            pending: VecDeque::new(),
            settled: VecDeque::new(),
            durably_settled_below: u64::MAX,
            counts: Counts::default(),
        }
    }

    /// Seeds the retransmission jitter, for reproducible simulations.
    pub fn with_jitter_seed(mut self, seed: u64) -> Self {
        self.inner = self.inner.with_jitter_seed(seed);
        self
    }

    /// Accepts an encoded message in its chunks (see [`ChunkWriter`](super::ChunkWriter)), to
    /// be sent after those before it.
    ///
    /// # Errors
    /// The chunks are handed back (and `confirm` settled with [`DeliveryError::QueueFull`])
    /// when `window_size + max_pending` messages are held already. A message of no chunks, or
    /// of more than `u32::MAX`, is settled with [`DeliveryError::Unencodable`].
    pub fn handle_send(&mut self, chunks: Vec<Bytes>, confirm: C) -> Result<(), Vec<Bytes>> {
        if self.messages.len() + self.pending.len() >= self.room {
            self.counts.refused += 1;
            self.settled
                .push_back((confirm, Err(DeliveryError::QueueFull)));
            return Err(chunks);
        }
        if chunks.is_empty() || u32::try_from(chunks.len()).is_err() {
            let why = format!("a message of {} chunks", chunks.len());
            self.handle_unsendable(confirm, DeliveryError::Unencodable(why));
            return Ok(());
        }
        self.pending.push_back(Pending {
            first: None,
            chunks,
            confirm,
        });
        Ok(())
    }

    /// A message that cannot be sent (its encoding failed): settled with `error`, in order
    /// with the others.
    pub fn handle_unsendable(&mut self, confirm: C, error: DeliveryError) {
        self.settled.push_back((confirm, Err(error)));
    }

    /// Accepts a message a durable producer stored, chunk by chunk, under the seqs from
    /// `first`. Never refused for room (it exists already).
    ///
    /// # Errors
    /// The message is handed back if `first` is not the seq the producer would give next, or
    /// it has no chunks: the numberings diverged.
    pub fn handle_stored(
        &mut self,
        first: u64,
        chunks: Vec<Bytes>,
        confirm: C,
    ) -> Result<(), (Vec<Bytes>, C)> {
        let unnumbered = self.pending.iter().any(|p| p.first.is_none());
        if first != self.next_stored || chunks.is_empty() || unnumbered {
            return Err((chunks, confirm));
        }
        self.next_stored += chunks.len() as u64;
        self.pending.push_back(Pending {
            first: Some(first),
            chunks,
            confirm,
        });
        Ok(())
    }

    /// Every seq below `seq` is durably settled (see
    /// [`ProducerCore::set_durably_settled_below`]).
    pub fn set_durably_settled_below(&mut self, seq: u64) {
        self.durably_settled_below = seq;
        self.hold_window_start();
    }

    /// Acts on an ACK the inner core validates: a chunk's frees its slot, the last chunk's
    /// confirms its message. Returns whether it was acted on.
    pub fn handle_ack(&mut self, ack: &Ack) -> bool {
        let acted = self.inner.handle_ack(ack);
        if acted {
            self.drain_inner();
        }
        acted
    }

    /// Retransmits what is due; a chunk given up gives its message up.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.inner.handle_timeout(now);
        self.drain_inner();
    }

    /// Settles every message held: those started (some chunk numbered or sent) and those
    /// stored by a durable producer with [`DeliveryError::StoppedUnconfirmed`], the others with
    /// [`DeliveryError::ProducerStopped`].
    pub fn stop(&mut self) {
        self.inner.stop();
        self.drain_inner();
        for pending in self.pending.drain(..) {
            let error = match pending.first {
                Some(_) => DeliveryError::StoppedUnconfirmed,
                None => DeliveryError::ProducerStopped,
            };
            self.settled.push_back((pending.confirm, Err(error)));
        }
    }

    /// A new life: settles everything as [`stop`](Self::stop) does, then continues under a
    /// new incarnation with seqs from 1.
    pub fn restart(&mut self, incarnation: Incarnation) {
        self.stop();
        self.inner.restart(incarnation);
        self.next_stored = self.inner.next_seq();
        self.durably_settled_below = u64::MAX;
        self.hold_window_start();
    }

    /// The next chunk to put on the wire (its header's `chunk` says where it sits), with the
    /// trace context of its message read from the message's token by `trace_context`.
    /// Starts waiting messages as the window drains, and rounds when they are due.
    pub fn poll_transmit_with(
        &mut self,
        now: Instant,
        trace_context: impl Fn(&C) -> Option<TraceContext>,
    ) -> Option<Transmission<Bytes>> {
        loop {
            let messages = &self.messages;
            let transmitted = self.inner.poll_transmit_with(now, |&seq| {
                find(messages, seq).and_then(|i| trace_context(&messages[i].confirm))
            });
            if let Some(Transmission {
                mut header,
                body,
                attempt,
            }) = transmitted
            {
                if attempt > 1 && body.header.is_last(header.seq) && self.round(header.seq) {
                    continue; // sent again from the first chunk instead
                }
                header.chunk = Some(body.header);
                return Some(Transmission {
                    header,
                    body: body.bytes,
                    attempt,
                });
            }
            if !self.start_next() {
                return None;
            }
        }
    }

    /// [`poll_transmit_with`](Self::poll_transmit_with) without trace contexts.
    pub fn poll_transmit(&mut self, now: Instant) -> Option<Transmission<Bytes>> {
        self.poll_transmit_with(now, |_| None)
    }

    /// The settled messages' tokens not polled yet, in order, without taking them.
    pub fn settled(&self) -> impl Iterator<Item = &C> {
        self.settled.iter().map(|(token, _)| token)
    }

    /// The next settled message's token and result.
    pub fn poll_settled(&mut self) -> Option<(C, Result<(), DeliveryError>)> {
        self.settled.pop_front()
    }

    /// When [`handle_timeout`](Self::handle_timeout) is due.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.inner.next_deadline()
    }

    /// This producer's id.
    pub fn id(&self) -> &ProducerId {
        self.inner.id()
    }

    /// This producer's current incarnation.
    pub fn incarnation(&self) -> Incarnation {
        self.inner.incarnation()
    }

    /// Whether nothing is held or waiting to be polled.
    pub fn is_idle(&self) -> bool {
        self.inner.is_idle()
            && self.messages.is_empty()
            && self.pending.is_empty()
            && self.settled.is_empty()
    }

    /// Counters: deliveries (`sent`, `retransmitted`, `in_flight`) count chunks, the rest
    /// messages; `queued` counts messages not started.
    pub fn stats(&self) -> ProducerStats {
        let inner = self.inner.stats();
        ProducerStats {
            sent: inner.sent - self.counts.resent,
            retransmitted: inner.retransmitted + self.counts.resent,
            confirmed: self.counts.confirmed,
            given_up: self.counts.given_up,
            refused: self.counts.refused,
            queued: self.pending.len(),
            chunk_rounds: self.counts.rounds,
            ..inner
        }
    }

    /// Numbers the next waiting message's chunks (when the inner core has nothing numbered
    /// left to send); whether it did.
    fn start_next(&mut self) -> bool {
        if self.inner.stats().queued > 0 {
            return false;
        }
        let Some(pending) = self.pending.pop_front() else {
            return false;
        };
        let first = pending.first.unwrap_or_else(|| self.inner.next_seq());
        let header = ChunkHeader {
            first_seq: first,
            chunks: pending.chunks.len() as u32,
            message_len: pending.chunks.iter().map(|c| c.len() as u64).sum(),
        };
        for (seq, bytes) in (first..).zip(&pending.chunks) {
            let part = Part {
                header,
                bytes: bytes.clone(),
            };
            // A resumed message lies below the inner core's next seq, a new or stored one
            // starts at it (checked when stored): unreachable errors.
            let numbered = if seq < self.inner.next_seq() {
                self.inner.handle_again(seq, part, seq)
            } else {
                self.inner.handle_stored(seq, part, seq)
            };
            debug_assert!(numbered.is_ok(), "chunk {seq} does not fit the inner core");
        }
        self.messages.push_back(Message {
            header,
            outstanding: header.chunks - 1,
            sendings: 1,
            chunks: pending.chunks,
            confirm: pending.confirm,
        });
        self.hold_window_start();
        true
    }

    /// Sends the message whose last chunk `last` is due for retransmission again, whole,
    /// from the first chunk (the last one gives its window slot up and goes last again),
    /// unless one of its chunks is still unacknowledged; gives it up after `max_attempts`
    /// sendings. Whether the last chunk's retransmission was replaced.
    fn round(&mut self, last: u64) -> bool {
        let Some(index) = find(&self.messages, last) else {
            return false;
        };
        let message = &mut self.messages[index];
        if message.outstanding > 0 || message.header.chunks == 1 {
            return false;
        }
        if self.max_attempts.is_some_and(|max| message.sendings >= max) {
            let attempts = message.sendings;
            self.settle(index, Err(DeliveryError::GaveUp { attempts }));
            return true;
        }
        self.inner.forget(last);
        let header = message.header;
        for (seq, bytes) in (header.first_seq..).zip(&message.chunks) {
            let part = Part {
                header,
                bytes: bytes.clone(),
            };
            if self.inner.handle_again(seq, part, seq).is_ok() {
                self.counts.resent += 1;
            }
        }
        message.outstanding = header.chunks - 1;
        message.sendings += 1;
        self.counts.rounds += 1;
        true
    }

    /// Settles message `index` (forgetting its chunks still held).
    fn settle(&mut self, index: usize, result: Result<(), DeliveryError>) {
        let Some(message) = self.messages.remove(index) else {
            return;
        };
        for seq in message.header.first_seq..=message.header.last_seq() {
            self.inner.forget(seq);
        }
        match &result {
            Ok(()) => self.counts.confirmed += 1,
            Err(DeliveryError::GaveUp { .. }) => self.counts.given_up += 1,
            Err(_) => {}
        }
        self.settled.push_back((message.confirm, result));
        self.hold_window_start();
    }

    /// Groups what the inner core settled into messages.
    fn drain_inner(&mut self) {
        while let Some((seq, result)) = self.inner.poll_settled() {
            let Some(index) = find(&self.messages, seq) else {
                continue; // its message was settled already
            };
            let message = &mut self.messages[index];
            if result.is_ok() && !message.header.is_last(seq) {
                message.outstanding = message.outstanding.saturating_sub(1);
                continue;
            }
            self.settle(index, result);
        }
    }

    /// Keeps the inner core's `window_start` at or below the first seq of the oldest message
    /// not settled (and what a durable producer recorded).
    fn hold_window_start(&mut self) {
        let oldest = self
            .messages
            .front()
            .map_or(u64::MAX, |m| m.header.first_seq);
        let next = self
            .pending
            .front()
            .and_then(|p| p.first)
            .unwrap_or(u64::MAX);
        let below = oldest.min(next).min(self.durably_settled_below);
        self.inner.set_durably_settled_below(below);
    }
}

/// The index of the message that took `seq`.
fn find<C>(messages: &VecDeque<Message<C>>, seq: u64) -> Option<usize> {
    let index = messages.partition_point(|m| m.header.last_seq() < seq);
    let message = messages.get(index)?;
    (message.header.first_seq <= seq).then_some(index)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::Limit;
    use crate::protocol::chunk::split;

    type Producer = ChunkedProducer<u32>;

    const INCARNATION: Incarnation = Incarnation::from_u128(42);
    const TIMEOUT: Duration = Duration::from_millis(500);

    fn config(window_size: usize) -> ProducerConfig {
        ProducerConfig {
            producer_id: Some("p".into()),
            window_size,
            ..Default::default()
        }
    }

    /// A producer whose messages the tests split into chunks of `chunk_size` bytes.
    struct Split(Producer, usize);

    impl std::ops::Deref for Split {
        type Target = Producer;
        fn deref(&self) -> &Producer {
            &self.0
        }
    }

    impl std::ops::DerefMut for Split {
        fn deref_mut(&mut self) -> &mut Producer {
            &mut self.0
        }
    }

    impl Split {
        fn send(&mut self, message: Bytes, token: u32) -> Result<(), Vec<Bytes>> {
            let chunks = split(&message, self.1);
            self.0.handle_send(chunks, token)
        }
    }

    fn producer(window_size: usize, chunk_size: usize) -> Split {
        with_config(&config(window_size), chunk_size)
    }

    fn with_config(config: &ProducerConfig, chunk_size: usize) -> Split {
        Split(
            ChunkedProducer::seeded(config, INCARNATION, || 7),
            chunk_size,
        )
    }

    fn ack(seq: u64) -> Ack {
        Ack {
            producer_id: ProducerId::from("p"),
            incarnation: INCARNATION,
            seq,
        }
    }

    /// (seq, window_start, chunk index, bytes) of what goes on the wire at `now`.
    fn sent(p: &mut Split, now: Instant) -> Vec<(u64, u64, u32, Vec<u8>)> {
        std::iter::from_fn(|| p.poll_transmit(now))
            .map(|t| {
                let chunk = t.header.chunk.expect("every delivery is a chunk");
                let index = chunk.index_of(t.header.seq).expect("one of its message's");
                (t.header.seq, t.header.window_start, index, t.body.to_vec())
            })
            .collect()
    }

    fn seqs(p: &mut Split, now: Instant) -> Vec<u64> {
        sent(p, now).into_iter().map(|(seq, ..)| seq).collect()
    }

    fn settled(p: &mut Split) -> Vec<(u32, Result<(), DeliveryError>)> {
        std::iter::from_fn(|| p.poll_settled()).collect()
    }

    fn message(len: usize, fill: u8) -> Bytes {
        Bytes::from(vec![fill; len])
    }

    #[test]
    fn a_message_takes_consecutive_seqs_one_chunk_per_window_slot() {
        let mut p = producer(2, 4);
        let now = Instant::now();
        p.send(Bytes::from_static(b"abcdefghij"), 1).unwrap();
        p.send(message(3, 7), 2).unwrap();
        let first = sent(&mut p, now);
        assert_eq!(
            first,
            [(1, 1, 0, b"abcd".to_vec()), (2, 1, 1, b"efgh".to_vec())],
            "the window holds two chunks"
        );
        assert!(p.handle_ack(&ack(1)));
        assert!(p.handle_ack(&ack(2)));
        assert!(settled(&mut p).is_empty(), "only the last chunk confirms");
        assert_eq!(
            sent(&mut p, now),
            [(3, 1, 2, b"ij".to_vec()), (4, 1, 0, vec![7; 3])],
            "window_start stays at the unsettled message's first seq"
        );
        assert!(p.handle_ack(&ack(3)));
        assert!(p.handle_ack(&ack(4)));
        assert_eq!(settled(&mut p), [(1, Ok(())), (2, Ok(()))]);
        let stats = p.stats();
        assert_eq!((stats.sent, stats.confirmed, stats.in_flight), (4, 2, 0));
        assert!(p.is_idle());
    }

    #[test]
    fn a_window_smaller_than_the_chunk_count_does_not_deadlock() {
        let mut p = producer(1, 1);
        let now = Instant::now();
        p.send(message(5, 1), 1).unwrap();
        for seq in 1..=5 {
            assert_eq!(seqs(&mut p, now), [seq]);
            assert!(p.handle_ack(&ack(seq)));
        }
        assert_eq!(settled(&mut p), [(1, Ok(()))]);
    }

    #[test]
    fn the_last_chunks_ack_confirms_once_and_forgets_the_other_chunks() {
        let mut p = producer(4, 1);
        let now = Instant::now();
        p.send(message(3, 1), 1).unwrap();
        p.send(message(1, 2), 2).unwrap();
        assert_eq!(seqs(&mut p, now), [1, 2, 3, 4]);
        // The consumer completed the message from an earlier copy: the last ACK comes first.
        assert!(p.handle_ack(&ack(3)));
        assert_eq!(settled(&mut p), [(1, Ok(()))]);
        assert!(!p.handle_ack(&ack(1)), "forgotten with its message");
        assert!(
            !p.handle_ack(&ack(3)),
            "a duplicate ACK confirms nothing twice"
        );
        assert_eq!(p.stats().in_flight, 1);
        p.handle_timeout(now + TIMEOUT);
        assert_eq!(
            seqs(&mut p, now + TIMEOUT),
            [4],
            "only seq 4 is left to resend"
        );
    }

    #[test]
    fn an_unconfirmed_last_chunk_sends_the_acked_chunks_again_in_a_round() {
        let mut p = producer(2, 1);
        let t0 = Instant::now();
        p.send(message(3, 1), 1).unwrap();
        assert_eq!(seqs(&mut p, t0), [1, 2]);
        p.handle_ack(&ack(1));
        p.handle_ack(&ack(2));
        assert_eq!(seqs(&mut p, t0), [3]);
        // The consumer lost chunks 1 and 2 (a restart): no ACK for the last chunk.
        let t1 = t0 + TIMEOUT;
        p.handle_timeout(t1);
        let round = sent(&mut p, t1);
        let round: Vec<(u64, u64)> = round.iter().map(|(s, w, ..)| (*s, *w)).collect();
        assert_eq!(
            round,
            [(1, 1), (2, 1)],
            "the whole message again, from its first chunk"
        );
        assert_eq!(p.stats().chunk_rounds, 1);
        p.handle_ack(&ack(1));
        assert_eq!(
            seqs(&mut p, t1),
            [3],
            "the last chunk last, through the window"
        );
        // While a chunk of the round is unACKed, another timeout is no new round.
        let t2 = t1 + TIMEOUT;
        p.handle_timeout(t2);
        assert_eq!(seqs(&mut p, t2), [2, 3]);
        assert_eq!(p.stats().chunk_rounds, 1);
        p.handle_ack(&ack(2));
        p.handle_ack(&ack(3));
        assert_eq!(settled(&mut p), [(1, Ok(()))]);
        let stats = p.stats();
        assert_eq!((stats.sent, stats.retransmitted), (3, 6));
    }

    #[test]
    fn a_round_through_a_window_of_one_slot_does_not_deadlock_and_max_attempts_bounds_rounds() {
        let config = ProducerConfig {
            max_attempts: Limit::At(2),
            ..config(1)
        };
        let mut p = with_config(&config, 1);
        let mut now = Instant::now();
        p.send(message(3, 1), 1).unwrap();
        for _ in 0..2 {
            for seq in 1..=2 {
                assert_eq!(seqs(&mut p, now), [seq]);
                p.handle_ack(&ack(seq));
            }
            assert_eq!(seqs(&mut p, now), [3], "the last chunk holds the only slot");
            now += TIMEOUT;
            p.handle_timeout(now);
        }
        assert!(seqs(&mut p, now).is_empty(), "no third sending");
        assert_eq!(p.stats().chunk_rounds, 1);
        assert_eq!(
            settled(&mut p),
            [(1, Err(DeliveryError::GaveUp { attempts: 2 }))],
            "sent whole twice"
        );
        assert!(p.is_idle());
    }

    #[test]
    fn a_slow_handler_costs_a_round_per_resend_timeout_never_a_second_confirmation() {
        let mut p = producer(4, 1);
        let mut now = Instant::now();
        p.send(message(2, 1), 1).unwrap();
        assert_eq!(seqs(&mut p, now), [1, 2]);
        p.handle_ack(&ack(1));
        for _ in 0..3 {
            now += TIMEOUT;
            p.handle_timeout(now);
            assert_eq!(seqs(&mut p, now), [1, 2]);
            p.handle_ack(&ack(1)); // the consumer holds the message: it ACKs the chunk
        }
        p.handle_ack(&ack(2));
        assert_eq!(settled(&mut p), [(1, Ok(()))]);
        assert_eq!(p.stats().chunk_rounds, 3);
    }

    #[test]
    fn a_chunk_given_up_gives_its_message_up_once() {
        let config = ProducerConfig {
            max_attempts: Limit::At(2),
            ..config(4)
        };
        let mut p = with_config(&config, 1);
        let t0 = Instant::now();
        p.send(message(3, 1), 1).unwrap();
        p.send(message(1, 2), 2).unwrap();
        assert_eq!(seqs(&mut p, t0), [1, 2, 3, 4]);
        p.handle_ack(&ack(1));
        p.handle_ack(&ack(4));
        assert_eq!(settled(&mut p), [(2, Ok(()))]);
        p.handle_timeout(t0 + TIMEOUT);
        assert_eq!(
            seqs(&mut p, t0 + TIMEOUT),
            [2, 3],
            "no round: chunk 2 is unACKed"
        );
        p.handle_timeout(t0 + 2 * TIMEOUT);
        assert_eq!(
            settled(&mut p),
            [(1, Err(DeliveryError::GaveUp { attempts: 2 }))]
        );
        assert_eq!(p.stats().given_up, 1);
        assert!(p.is_idle());
    }

    #[test]
    fn room_counts_messages_and_stop_settles_each_message_once() {
        let config = ProducerConfig {
            max_pending: 1,
            ..config(1)
        };
        let mut p = with_config(&config, 1);
        let now = Instant::now();
        p.send(message(3, 1), 1).unwrap();
        p.send(message(3, 2), 2).unwrap();
        assert_eq!(p.send(message(1, 3), 3), Err(vec![message(1, 3)]));
        assert_eq!(seqs(&mut p, now), [1]);
        p.stop();
        assert_eq!(
            settled(&mut p),
            [
                (3, Err(DeliveryError::QueueFull)),
                (1, Err(DeliveryError::StoppedUnconfirmed)),
                (2, Err(DeliveryError::ProducerStopped))
            ]
        );
        assert!(p.is_idle());
    }

    #[test]
    fn a_resumed_life_sends_stored_messages_whole_under_their_seqs() {
        let chunks = |n: usize| (0..n).map(|i| message(1, i as u8)).collect::<Vec<_>>();
        let mut p = Split(
            Producer::resume(&config(8), INCARNATION, 20, [(5, chunks(2), 1)], || 7),
            1,
        );
        assert_eq!(
            p.handle_stored(9, chunks(1), 2),
            Err((chunks(1), 2)),
            "a gap"
        );
        p.handle_stored(20, chunks(3), 2).unwrap();
        let now = Instant::now();
        let sent: Vec<(u64, u64)> = sent(&mut p, now)
            .iter()
            .map(|(s, w, ..)| (*s, *w))
            .collect();
        assert_eq!(sent, [(5, 5), (6, 5), (20, 5), (21, 5), (22, 5)]);
        p.handle_ack(&ack(6));
        p.set_durably_settled_below(20);
        for seq in [20, 21, 22] {
            p.handle_ack(&ack(seq));
        }
        assert_eq!(settled(&mut p), [(1, Ok(())), (2, Ok(()))]);
    }
}
