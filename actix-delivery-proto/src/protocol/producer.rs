//! The producer's protocol: the window, the bounded pending queue, seq assignment at dispatch,
//! the in-flight buffer with retransmit deadlines, and ACK validation.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::config::{Backoff, ProducerConfig};
use crate::error::DeliveryError;
use crate::protocol::envelope::{Ack, Header, Incarnation, ProducerId};
use crate::protocol::keyed_ring::KeyedRing;
use crate::protocol::trace_context::TraceContext;

/// A delivery the producer wants on the wire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transmission<T> {
    /// Identity and window of the message.
    pub header: Header,
    /// A copy of the message.
    pub body: T,
    /// Which transmission of the message this is (1: the first).
    pub attempt: u32,
}

/// Counters of a producer since it started (`in_flight` and `queued` are current values).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ProducerStats {
    /// Messages transmitted for the first time.
    pub sent: u64,
    /// Retransmissions (after `resend_timeout` without an ACK).
    pub retransmitted: u64,
    /// Messages confirmed by a valid ACK.
    pub confirmed: u64,
    /// ACKs ignored: wrong producer id, wrong incarnation, or a seq not in flight (including
    /// duplicate ACKs).
    pub ignored_acks: u64,
    /// Messages given up: after `max_attempts` transmissions, or by an in-process consumer
    /// (a work-pulling pool's `give_up_after`).
    pub given_up: u64,
    /// Sends refused because the pending queue was full.
    pub refused: u64,
    /// `send_timeout` and
    /// `store_timeout` calls that got no room before
    /// their deadline ([`DeliveryError::Timeout`]: not sent).
    pub timed_out: u64,
    /// Messages in flight right now (sent, not yet ACKed).
    pub in_flight: usize,
    /// Messages waiting for the window right now (resumed and stored ones included).
    pub queued: usize,
    /// A durable producer: messages stored in its journal.
    pub stored: u64,
    /// A durable producer: stored messages of an earlier life sent again after a restart.
    pub resumed: u64,
    /// A durable producer: resumed messages confirmed (their confirmations go to the sink).
    pub resumed_confirmed: u64,
    /// A durable producer: the `MessageId` its next stored
    /// message gets (0 until its stream is open). After a restart, everything below it was
    /// stored before.
    pub next_message_id: u64,
    /// A durable producer: stored messages not settled yet (their settlement not recorded),
    /// right now.
    pub unconfirmed: usize,
    /// A durable producer: how long the oldest of its [`unconfirmed`](Self::unconfirmed)
    /// messages has been waiting, in ms, when the stats were asked (`None` with none): since
    /// its store committed, or, for a message stored by an earlier process and sent again
    /// after its restart, since this process first opened the stream (a lower bound). Computed
    /// when asked, from one time per store.
    #[serde(default)]
    pub oldest_unconfirmed_ms: Option<u64>,
    /// A durable producer: its writes whose outcome the journal has not told, right now:
    /// messages whose store, and confirmations whose record, failed in a way that leaves open
    /// whether they committed (or were unanswered when the producer ended). The next opening
    /// of the stream settles each by what the journal holds.
    #[serde(default)]
    pub in_doubt: usize,
    /// A producer with `chunk_size`: chunked messages sent again from their first chunk,
    /// because their last chunk went unconfirmed for `resend_timeout` after every other chunk
    /// was ACKed (the consumer may have lost the chunks: a restart, an eviction, a failed
    /// handler). `sent`, `retransmitted` and `in_flight` count chunks there.
    pub chunk_rounds: u64,
    /// A durable producer with `chunk_size`: messages found partly stored when its stream was
    /// opened (the producer had ended while storing their chunks): dropped, never sent,
    /// reported to the sink as not stored.
    pub partially_stored: u64,
    /// A durable producer: openings of its stream that took it over from an earlier opening
    /// (its first opening, of a stream opened before). One per start of a restarted process;
    /// one more means a second instance, whose producer then stops with
    /// `Failure::TakenOver` (see
    /// `DurableOptions::new`).
    pub takeovers: u64,
}

/// A sent message waiting for its ACK (its seq is its key in the in-flight ring).
#[derive(Debug)]
struct InFlight<T, C> {
    body: T,
    confirm: C,
    attempts: u32,
    deadline: Instant,
}

/// The producer state machine. Pure: time is an argument, nothing sleeps or spawns.
///
/// `T` is the body, `C` a confirmation token the caller attaches to each message and gets back
/// exactly once, with the result, from [`poll_settled`](Self::poll_settled). After `handle_*`
/// calls, drain [`poll_transmit`](Self::poll_transmit) (which dispatches queued messages into
/// free window slots: seqs and deadlines are assigned there, so time is read once per batch of
/// events) and [`poll_settled`](Self::poll_settled), and arrange for
/// [`handle_timeout`](Self::handle_timeout) to be called at [`next_deadline`](Self::next_deadline).
#[derive(Debug)]
pub struct ProducerCore<T, C> {
    id: ProducerId,
    incarnation: Incarnation,
    next_seq: u64,
    window_size: usize,
    max_pending: usize,
    resend_timeout: Duration,
    backoff: Backoff,
    max_attempts: Option<u32>,
    /// Sent, un-ACKed messages by seq.
    in_flight: KeyedRing<InFlight<T, C>>,
    /// Messages numbered by the caller (resumed from an earlier life, or stored): dispatched
    /// first, under their own seqs.
    numbered: VecDeque<(u64, T, C)>,
    pending: VecDeque<(T, C)>,
    /// Every seq below this one is durably settled (`u64::MAX`: the producer is not durable,
    /// settled means settled in memory); `window_start` never exceeds it.
    durably_settled_below: u64,
    /// No in-flight deadline is earlier than this (it may be stale-early after ACKs, which
    /// costs one spurious timeout, never a missed one).
    earliest_deadline: Option<Instant>,
    transmit: VecDeque<u64>,
    settled: VecDeque<(C, Result<(), DeliveryError>)>,
    /// With [`keep_given_up`](Self::keep_given_up): the messages given up since
    /// [`take_given_up`](Self::take_given_up) was last called.
    given_up: Option<Vec<GivenUp<T>>>,
    jitter: SmallRng,
    stats: ProducerStats,
}

/// A message the producer gave up after `max_attempts` transmissions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GivenUp<T> {
    /// Its seq.
    pub seq: u64,
    /// How many times it was transmitted.
    pub attempts: u32,
    /// The message.
    pub body: T,
}

impl<T: Clone, C> ProducerCore<T, C> {
    /// A producer with the given (validated) settings and incarnation, its randomness drawn
    /// from `random` (the core reads no OS randomness: the shells pass the OS CSPRNG, the
    /// simulators a seeded generator). The id is `config.producer_id`, or `producer-` and 16 hex
    /// digits of one draw; the retransmission jitter is seeded by the next draw.
    pub fn seeded(
        config: &ProducerConfig,
        incarnation: Incarnation,
        mut random: impl FnMut() -> u64,
    ) -> Self {
        let id = config.producer_id.as_deref().map_or_else(
            || ProducerId::from(format!("producer-{:016x}", random())),
            ProducerId::from,
        );
        Self {
            id,
            incarnation,
            next_seq: 1,
            window_size: config.window_size,
            max_pending: config.max_pending,
            resend_timeout: config.resend_timeout,
            backoff: config.backoff,
            max_attempts: config.max_attempts.get(),
            in_flight: KeyedRing::default(),
            numbered: VecDeque::new(),
            pending: VecDeque::new(),
            durably_settled_below: u64::MAX,
            earliest_deadline: None,
            transmit: VecDeque::new(),
            settled: VecDeque::new(),
            given_up: None,
            // Not derived from the incarnation: retransmission timing must not reveal it.
            jitter: SmallRng::seed_from_u64(random()),
            stats: ProducerStats::default(),
        }
    }

    /// A durable producer's new life: it keeps `incarnation`, numbers new messages from
    /// `next_seq`, and first sends `resumed` (its stored, unsettled messages, ascending by seq,
    /// all below `next_seq`) again under their own seqs, through the window. Its
    /// `window_start` never passes the lowest seq not durably settled
    /// ([`set_durably_settled_below`](Self::set_durably_settled_below)), which starts at the
    /// first resumed seq: a consumer that saw the previous life may only have heard of seqs
    /// settled in its memory, not in the journal. Its randomness is drawn from `random` (see
    /// [`seeded`](Self::seeded)).
    ///
    /// # Panics
    /// If a resumed seq is 0, not ascending, or not below `next_seq`.
    pub fn resume(
        config: &ProducerConfig,
        incarnation: Incarnation,
        next_seq: u64,
        resumed: impl IntoIterator<Item = (u64, T, C)>,
        random: impl FnMut() -> u64,
    ) -> Self {
        let mut core = Self::seeded(config, incarnation, random);
        core.next_seq = next_seq;
        core.numbered = resumed.into_iter().collect();
        let mut previous = 0;
        for &(seq, _, _) in &core.numbered {
            assert!(
                previous < seq && seq < next_seq,
                "resumed seqs ascend below next_seq"
            );
            previous = seq;
        }
        core.durably_settled_below = core.numbered.front().map_or(next_seq, |&(seq, _, _)| seq);
        core
    }

    /// Every seq below `seq` is settled for good now (a durable producer recorded them; the
    /// chunks of a large message are settled with their message, see
    /// [`chunk`](crate::protocol::chunk)): the `window_start` of later transmissions may reach
    /// it, never pass it, and never a seq the core has not been given yet (a store still in
    /// flight may be settled in nobody's journal).
    pub fn set_durably_settled_below(&mut self, seq: u64) {
        self.durably_settled_below = seq.min(self.next_seq);
    }

    /// The seq the next message numbered by the core gets (or that
    /// [`handle_stored`](Self::handle_stored) expects).
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Takes `seq` back, in flight or queued for dispatch, without settling it: its token is
    /// handed back and nothing is counted (a message made of several seqs was settled as a
    /// whole). `None` if the core does not hold it.
    pub fn forget(&mut self, seq: u64) -> Option<(T, C)> {
        if let Some(m) = self.in_flight.remove(seq) {
            return Some((m.body, m.confirm));
        }
        // `numbered` ascends by seq.
        let index = self
            .numbered
            .binary_search_by_key(&seq, |(s, _, _)| *s)
            .ok()?;
        self.numbered
            .remove(index)
            .map(|(_, body, confirm)| (body, confirm))
    }

    /// Sends `seq` again, under its own seq, through the window (before anything numbered
    /// after it): a seq the core numbered and settled (its ACK came) that its owner needs
    /// transmitted once more. Hold `window_start` at or below it
    /// ([`set_durably_settled_below`](Self::set_durably_settled_below)) or the consumer takes
    /// it as stale.
    ///
    /// # Errors
    /// The message is handed back if `seq` was never numbered, or the core holds it still.
    pub fn handle_again(&mut self, seq: u64, body: T, confirm: C) -> Result<(), (T, C)> {
        let queued = self.numbered.binary_search_by_key(&seq, |(s, _, _)| *s);
        match queued {
            Err(at) if seq != 0 && seq < self.next_seq && self.in_flight.get(seq).is_none() => {
                self.numbered.insert(at, (seq, body, confirm));
                Ok(())
            }
            _ => Err((body, confirm)),
        }
    }

    /// Seeds the retransmission jitter (by default from the OS CSPRNG), for reproducible
    /// simulations.
    pub fn with_jitter_seed(mut self, seed: u64) -> Self {
        self.jitter = SmallRng::seed_from_u64(seed);
        self
    }

    /// Accepts a message. It is dispatched (numbered and sent) by the next
    /// [`poll_transmit`](Self::poll_transmit) if the window has room, else it waits in the
    /// queue.
    ///
    /// # Errors
    /// The body is handed back when `max_pending` messages already wait beyond the window;
    /// `confirm` is then settled with [`DeliveryError::QueueFull`].
    pub fn handle_send(&mut self, body: T, confirm: C) -> Result<(), T> {
        if self.room() == 0 {
            self.refuse(confirm);
            return Err(body);
        }
        self.pending.push_back((body, confirm));
        Ok(())
    }

    /// Accepts a message its caller numbered: a durable producer stored it under `seq`, an
    /// outbox recorded it. It is sent under `seq`, after everything accepted before it, and is
    /// never refused for room: it exists already, and its owner bounds what it stores. A core
    /// fed this way takes all its new messages this way.
    ///
    /// # Errors
    /// The message is handed back, untouched, if `seq` is not the seq the core would give next
    /// (or messages of [`handle_send`](Self::handle_send) wait): the numberings diverged.
    pub fn handle_stored(&mut self, seq: u64, body: T, confirm: C) -> Result<(), (T, C)> {
        if seq != self.next_seq || !self.pending.is_empty() {
            return Err((body, confirm));
        }
        self.next_seq += 1;
        self.numbered.push_back((seq, body, confirm));
        Ok(())
    }

    /// Accepts a batch of messages, in order, as [`handle_send`](Self::handle_send) would one
    /// by one; those beyond the room are refused with [`DeliveryError::QueueFull`] (their
    /// bodies dropped). `messages` is left empty. When nothing is queued yet the batch's buffer
    /// becomes the queue, so a burst is not copied (`messages` gets the old, empty buffer).
    pub fn handle_send_all(&mut self, messages: &mut VecDeque<(T, C)>) {
        let room = self.room();
        if messages.len() > room {
            for (_, confirm) in messages.split_off(room) {
                self.refuse(confirm);
            }
        }
        if self.pending.is_empty() {
            std::mem::swap(&mut self.pending, messages);
        } else {
            self.pending.append(messages);
        }
    }

    /// Acts on an ACK if it names this producer, mirrors its current incarnation and
    /// acknowledges a seq in flight: confirms that message and frees its window slot. Anything
    /// else is ignored (and counted). Returns whether the ACK was acted on.
    pub fn handle_ack(&mut self, ack: &Ack) -> bool {
        let Some(message) = self.take_acknowledged(ack) else {
            return false;
        };
        self.stats.confirmed += 1;
        self.settled.push_back((message.confirm, Ok(())));
        true
    }

    /// Acts on the word of an in-process consumer that gave the message `ack` names up (a
    /// work-pulling pool's `give_up_after`): the message is settled with `error`, counted in
    /// `given_up`, and never sent again. Validated as an ACK is (see
    /// [`handle_ack`](Self::handle_ack)); returns whether it was acted on.
    pub fn handle_given_up(&mut self, ack: &Ack, error: DeliveryError) -> bool {
        let Some(message) = self.take_acknowledged(ack) else {
            return false;
        };
        self.stats.given_up += 1;
        self.settled.push_back((message.confirm, Err(error)));
        true
    }

    /// Takes the in-flight message `ack` names, if it names this producer, mirrors its current
    /// incarnation and a seq in flight; counts it ignored otherwise.
    #[inline]
    fn take_acknowledged(&mut self, ack: &Ack) -> Option<InFlight<T, C>> {
        let message = (ack.producer_id == self.id && ack.incarnation == self.incarnation)
            .then(|| self.in_flight.remove(ack.seq))
            .flatten();
        if message.is_none() {
            self.stats.ignored_acks += 1;
            log::debug!("ignored an ACK that does not match a message in flight");
        }
        message
    }

    /// Retransmits every message whose deadline has passed, or gives it up after
    /// `max_attempts` transmissions (which frees its window slot).
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.earliest_deadline.is_none_or(|earliest| now < earliest) {
            return;
        }
        let mut earliest: Option<Instant> = None;
        let mut exhausted = Vec::new();
        for (seq, m) in self.in_flight.iter_mut() {
            if m.deadline <= now {
                if self.max_attempts.is_some_and(|max| m.attempts >= max) {
                    exhausted.push(seq);
                    continue;
                }
                m.attempts = m.attempts.saturating_add(1);
                let wait = retry_interval(
                    self.resend_timeout,
                    self.backoff,
                    m.attempts,
                    &mut self.jitter,
                );
                m.deadline = now + wait;
                self.transmit.push_back(seq);
                self.stats.retransmitted += 1;
            }
            earliest = Some(earliest.map_or(m.deadline, |e| e.min(m.deadline)));
        }
        self.earliest_deadline = earliest;
        for seq in exhausted {
            let m = self.in_flight.remove(seq).expect("found above");
            self.stats.given_up += 1;
            let error = DeliveryError::GaveUp {
                attempts: m.attempts,
            };
            self.settled.push_back((m.confirm, Err(error)));
            if let Some(given_up) = &mut self.given_up {
                given_up.push(GivenUp {
                    seq,
                    attempts: m.attempts,
                    body: m.body,
                });
            }
        }
    }

    /// Settles every in-flight and queued message: those sent, and those numbered by the caller
    /// (stored by a durable producer, or chunks of a started message), with
    /// [`DeliveryError::StoppedUnconfirmed`]; those never sent with
    /// [`DeliveryError::ProducerStopped`].
    pub fn stop(&mut self) {
        self.transmit.clear();
        self.earliest_deadline = None;
        let in_flight = self.in_flight.drain().map(|(_, m)| m.confirm);
        let numbered = self.numbered.drain(..).map(|(_, _, confirm)| confirm);
        for confirm in in_flight.chain(numbered) {
            self.settled
                .push_back((confirm, Err(DeliveryError::StoppedUnconfirmed)));
        }
        for (_, confirm) in self.pending.drain(..) {
            self.settled
                .push_back((confirm, Err(DeliveryError::ProducerStopped)));
        }
    }

    /// A new life: settles everything as [`stop`](Self::stop) does, then continues under a
    /// new incarnation with seqs from 1.
    pub fn restart(&mut self, incarnation: Incarnation) {
        self.stop();
        self.incarnation = incarnation;
        self.next_seq = 1;
    }

    /// The next delivery to put on the wire: first dispatches queued messages into free window
    /// slots (numbering them and setting their deadlines from `now`), then yields first
    /// transmissions and retransmissions in order.
    pub fn poll_transmit(&mut self, now: Instant) -> Option<Transmission<T>> {
        self.poll_transmit_with(now, |_| None)
    }

    /// [`poll_transmit`](Self::poll_transmit), with the trace context of each message read
    /// from its confirmation token by `trace_context` (for tokens that carry one).
    pub fn poll_transmit_with(
        &mut self,
        now: Instant,
        trace_context: impl FnOnce(&C) -> Option<TraceContext>,
    ) -> Option<Transmission<T>> {
        self.fill_window(now);
        while let Some(seq) = self.transmit.pop_front() {
            let Some(message) = self.in_flight.get(seq) else {
                continue; // settled after it was queued for transmission
            };
            let (first, _) = self.in_flight.front().expect("it holds `message`");
            return Some(Transmission {
                header: Header {
                    producer_id: self.id.clone(),
                    incarnation: self.incarnation,
                    seq,
                    window_start: first.min(self.durably_settled_below),
                    trace_context: trace_context(&message.confirm),
                    chunk: None,
                },
                body: message.body.clone(),
                attempt: message.attempts,
            });
        }
        None
    }

    /// The settled confirmation tokens not polled yet, in order, without taking them.
    pub fn settled(&self) -> impl Iterator<Item = &C> {
        self.settled.iter().map(|(token, _)| token)
    }

    /// Keeps the messages it gives up after `max_attempts` for
    /// [`take_given_up`](Self::take_given_up) (for a dead-letter store); off by default.
    pub fn keep_given_up(&mut self) {
        self.given_up.get_or_insert_with(Vec::new);
    }

    /// The messages given up since the last call (none unless
    /// [`keep_given_up`](Self::keep_given_up)).
    pub fn take_given_up(&mut self) -> Vec<GivenUp<T>> {
        self.given_up
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// The next settled confirmation token and its result.
    pub fn poll_settled(&mut self) -> Option<(C, Result<(), DeliveryError>)> {
        self.settled.pop_front()
    }

    /// When [`handle_timeout`](Self::handle_timeout) is due (`None`: nothing in flight).
    /// Never later than the true earliest deadline; after ACKs it may be earlier.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.earliest_deadline
            .filter(|_| !self.in_flight.is_empty())
    }

    /// This producer's id.
    pub fn id(&self) -> &ProducerId {
        &self.id
    }

    /// This producer's current incarnation.
    pub fn incarnation(&self) -> Incarnation {
        self.incarnation
    }

    /// Whether nothing is in flight, queued or waiting to be polled.
    pub fn is_idle(&self) -> bool {
        self.in_flight.is_empty()
            && self.numbered.is_empty()
            && self.pending.is_empty()
            && self.transmit.is_empty()
            && self.settled.is_empty()
    }

    /// Gives back the memory its queues keep from their largest size (a core that is idle
    /// now holds nothing in them): for the owner of many cores, most of them idle.
    pub fn shrink_to_fit(&mut self) {
        self.in_flight.shrink_to_fit();
        self.numbered.shrink_to_fit();
        self.pending.shrink_to_fit();
        self.transmit.shrink_to_fit();
        self.settled.shrink_to_fit();
    }

    /// Counters since start, with current `in_flight` and `queued`.
    pub fn stats(&self) -> ProducerStats {
        ProducerStats {
            in_flight: self.in_flight.len(),
            queued: self.numbered.len() + self.pending.len(),
            ..self.stats
        }
    }

    /// How many more messages may be queued: `max_pending` beyond the free window slots.
    fn room(&self) -> usize {
        let held = self.in_flight.len() + self.numbered.len() + self.pending.len();
        (self.window_size.saturating_add(self.max_pending)).saturating_sub(held)
    }

    fn refuse(&mut self, confirm: C) {
        self.stats.refused += 1;
        self.settled
            .push_back((confirm, Err(DeliveryError::QueueFull)));
    }

    fn fill_window(&mut self, now: Instant) {
        while !self.numbered.is_empty() && self.in_flight.len() < self.window_size {
            if let Some((seq, body, confirm)) = self.numbered.pop_front() {
                self.dispatch(seq, body, confirm, now);
            }
        }
        while self.in_flight.len() < self.window_size {
            let Some((body, confirm)) = self.pending.pop_front() else {
                break;
            };
            let seq = self.next_seq;
            self.next_seq += 1;
            self.dispatch(seq, body, confirm, now);
        }
    }

    #[inline]
    fn dispatch(&mut self, seq: u64, body: T, confirm: C, now: Instant) {
        let deadline = now + retry_interval(self.resend_timeout, self.backoff, 1, &mut self.jitter);
        self.earliest_deadline = Some(self.earliest_deadline.map_or(deadline, |e| e.min(deadline)));
        let entry = InFlight {
            body,
            confirm,
            attempts: 1,
            deadline,
        };
        // At the back, or in its place when sent again (`handle_again`).
        let replaced = self.in_flight.insert(seq, entry);
        debug_assert!(replaced.is_none(), "seq {seq} was in flight");
        self.transmit.push_back(seq);
        self.stats.sent += 1;
    }
}

/// How long to wait for an ACK after the `attempt`-th transmission (from 1).
fn retry_interval(base: Duration, backoff: Backoff, attempt: u32, rng: &mut SmallRng) -> Duration {
    match backoff {
        Backoff::Fixed => base,
        Backoff::Exponential {
            multiplier,
            max,
            jitter,
        } => {
            let exponent = i32::try_from(attempt - 1).unwrap_or(i32::MAX);
            let grown = (base.as_secs_f64() * multiplier.powi(exponent)).min(max.as_secs_f64());
            let shortened = grown * (1.0 - jitter * rng.random::<f64>());
            Duration::from_secs_f64(shortened).max(Duration::from_millis(1))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Limit;

    /// Bodies are numbers; confirmation tokens are the body's number too, so settlements can be
    /// matched to messages.
    type Core = ProducerCore<u32, u32>;

    const INCARNATION: Incarnation = Incarnation::from_u128(42);
    const TIMEOUT: Duration = Duration::from_millis(500);

    fn core(config: ProducerConfig) -> Core {
        ProducerCore::seeded(
            &ProducerConfig {
                producer_id: Some("p".into()),
                ..config
            },
            INCARNATION,
            || 7,
        )
    }

    fn window(size: usize) -> Core {
        core(ProducerConfig {
            window_size: size,
            ..Default::default()
        })
    }

    /// (seq, body) of every delivery the core puts on the wire at `now`.
    fn transmitted(c: &mut Core, now: Instant) -> Vec<(u64, u32)> {
        std::iter::from_fn(|| c.poll_transmit(now))
            .map(|t| (t.header.seq, t.body))
            .collect()
    }

    fn settled(c: &mut Core) -> Vec<(u32, Result<(), DeliveryError>)> {
        std::iter::from_fn(|| c.poll_settled()).collect()
    }

    fn ack(seq: u64) -> Ack {
        Ack {
            producer_id: ProducerId::from("p"),
            incarnation: INCARNATION,
            seq,
        }
    }

    #[test]
    fn seqs_start_at_one_and_are_assigned_at_dispatch() {
        let mut c = window(2);
        let now = Instant::now();
        for body in [10, 11, 12] {
            c.handle_send(body, body).unwrap();
        }
        assert_eq!(transmitted(&mut c, now), [(1, 10), (2, 11)]);
        assert_eq!(c.stats().queued, 1);
        assert!(c.handle_ack(&ack(2)));
        assert_eq!(settled(&mut c), [(11, Ok(()))]);
        assert_eq!(transmitted(&mut c, now), [(3, 12)]);
    }

    #[test]
    fn window_bounds_in_flight_and_acks_drain_the_queue_in_order() {
        let mut c = window(3);
        let now = Instant::now();
        for body in 0..10 {
            c.handle_send(body, body).unwrap();
        }
        let mut order = Vec::new();
        for seq in 1..=10 {
            order.extend(transmitted(&mut c, now).into_iter().map(|(_, body)| body));
            assert!(c.stats().in_flight <= 3);
            assert!(c.handle_ack(&ack(seq)));
        }
        assert_eq!(order, (0..10).collect::<Vec<_>>());
        assert_eq!(settled(&mut c).len(), 10);
        assert!(c.is_idle());
    }

    #[test]
    fn full_pending_queue_refuses_and_hands_the_body_back() {
        let mut c = core(ProducerConfig {
            window_size: 1,
            max_pending: 2,
            ..Default::default()
        });
        let now = Instant::now();
        // One message fits the window, two wait: whether or not the first was dispatched yet.
        for body in 0..3 {
            c.handle_send(body, body).unwrap();
        }
        assert_eq!(c.handle_send(3, 3), Err(3));
        transmitted(&mut c, now);
        assert_eq!(c.handle_send(4, 4), Err(4));
        assert_eq!(
            settled(&mut c),
            [
                (3, Err(DeliveryError::QueueFull)),
                (4, Err(DeliveryError::QueueFull))
            ]
        );
        assert_eq!(c.stats().refused, 2);
    }

    #[test]
    fn a_batch_of_sends_is_taken_in_order_up_to_the_room() {
        let mut c = core(ProducerConfig {
            window_size: 1,
            max_pending: 2,
            ..Default::default()
        });
        let now = Instant::now();
        let mut batch: VecDeque<(u32, u32)> = (0..2).map(|b| (b, b)).collect();
        c.handle_send_all(&mut batch);
        assert!(batch.is_empty());
        let mut batch: VecDeque<(u32, u32)> = (2..5).map(|b| (b, b)).collect();
        c.handle_send_all(&mut batch);
        assert_eq!(
            settled(&mut c),
            [
                (3, Err(DeliveryError::QueueFull)),
                (4, Err(DeliveryError::QueueFull))
            ]
        );
        assert_eq!(transmitted(&mut c, now), [(1, 0)]);
        assert_eq!(c.stats().queued, 2);
        assert_eq!(c.stats().refused, 2);
    }

    #[test]
    fn max_pending_of_usize_max_means_practically_unbounded() {
        let mut c = core(ProducerConfig {
            window_size: 16,
            max_pending: usize::MAX,
            ..Default::default()
        });
        for body in 0..100 {
            c.handle_send(body, body).unwrap();
        }
        assert_eq!(transmitted(&mut c, Instant::now()).len(), 16);
        assert_eq!((c.stats().queued, c.stats().refused), (84, 0));
    }

    #[test]
    fn unacked_messages_are_retransmitted_every_resend_timeout_with_the_same_seq() {
        let mut c = window(4);
        let t0 = Instant::now();
        c.handle_send(7, 7).unwrap();
        transmitted(&mut c, t0);
        assert_eq!(c.next_deadline(), Some(t0 + TIMEOUT));
        let early = t0 + TIMEOUT - Duration::from_millis(1);
        c.handle_timeout(early);
        assert!(transmitted(&mut c, early).is_empty(), "not due yet");
        c.handle_timeout(t0 + TIMEOUT);
        assert_eq!(transmitted(&mut c, t0 + TIMEOUT), [(1, 7)]);
        assert_eq!(c.next_deadline(), Some(t0 + 2 * TIMEOUT));
        c.handle_timeout(t0 + 2 * TIMEOUT);
        assert_eq!(transmitted(&mut c, t0 + 2 * TIMEOUT), [(1, 7)]);
        assert_eq!(c.stats().retransmitted, 2);
        assert!(c.handle_ack(&ack(1)));
        assert_eq!(c.next_deadline(), None);
    }

    #[test]
    fn one_deadline_covers_many_messages_and_only_due_ones_are_resent() {
        let mut c = window(4);
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_millis(100);
        c.handle_send(1, 1).unwrap();
        transmitted(&mut c, t0);
        c.handle_send(2, 2).unwrap();
        transmitted(&mut c, t1);
        assert_eq!(c.next_deadline(), Some(t0 + TIMEOUT));
        c.handle_timeout(t0 + TIMEOUT);
        assert_eq!(transmitted(&mut c, t0 + TIMEOUT), [(1, 1)]);
        assert_eq!(c.next_deadline(), Some(t1 + TIMEOUT));
    }

    #[test]
    fn forged_or_stale_acks_change_nothing() {
        let mut c = window(4);
        let now = Instant::now();
        c.handle_send(1, 1).unwrap();
        transmitted(&mut c, now);
        let forged = [
            Ack {
                incarnation: Incarnation::from_u128(41),
                ..ack(1)
            },
            Ack {
                producer_id: ProducerId::from("other"),
                ..ack(1)
            },
            ack(2),
            ack(0),
        ];
        for a in &forged {
            assert!(!c.handle_ack(a), "{a:?}");
        }
        assert!(settled(&mut c).is_empty());
        assert_eq!(c.stats().ignored_acks, 4);
        assert_eq!(c.stats().in_flight, 1);
        c.handle_timeout(now + TIMEOUT);
        assert_eq!(
            transmitted(&mut c, now + TIMEOUT),
            [(1, 1)],
            "retransmission continues"
        );
        assert!(c.handle_ack(&ack(1)));
        assert!(
            !c.handle_ack(&ack(1)),
            "a duplicate ACK confirms nothing twice"
        );
        assert_eq!(settled(&mut c), [(1, Ok(()))]);
    }

    #[test]
    fn out_of_order_acks_confirm_the_right_messages() {
        let mut c = window(4);
        let now = Instant::now();
        for body in 1..=4 {
            c.handle_send(body, body).unwrap();
        }
        transmitted(&mut c, now);
        for seq in [3, 1, 4, 2] {
            assert!(c.handle_ack(&ack(seq)));
        }
        let confirmed: Vec<u32> = settled(&mut c).into_iter().map(|(b, _)| b).collect();
        assert_eq!(confirmed, [3, 1, 4, 2]);
    }

    #[test]
    fn window_start_is_the_lowest_unacked_seq() {
        let mut c = window(4);
        let now = Instant::now();
        for body in 1..=3 {
            c.handle_send(body, body).unwrap();
        }
        let starts: Vec<u64> = std::iter::from_fn(|| c.poll_transmit(now))
            .map(|t| t.header.window_start)
            .collect();
        assert_eq!(starts, [1, 1, 1]);
        c.handle_ack(&ack(1));
        c.handle_ack(&ack(3));
        c.handle_timeout(now + TIMEOUT);
        let t = c.poll_transmit(now + TIMEOUT).unwrap();
        assert_eq!((t.header.seq, t.header.window_start), (2, 2));
    }

    #[test]
    fn max_attempts_gives_up_with_an_error_and_frees_the_slot() {
        let mut c = core(ProducerConfig {
            window_size: 1,
            max_attempts: Limit::At(2),
            ..Default::default()
        });
        let t0 = Instant::now();
        c.handle_send(1, 1).unwrap();
        c.handle_send(2, 2).unwrap();
        assert_eq!(transmitted(&mut c, t0), [(1, 1)]);
        c.handle_timeout(t0 + TIMEOUT);
        assert_eq!(transmitted(&mut c, t0 + TIMEOUT), [(1, 1)]);
        c.handle_timeout(t0 + 2 * TIMEOUT);
        assert_eq!(
            settled(&mut c),
            [(1, Err(DeliveryError::GaveUp { attempts: 2 }))]
        );
        assert_eq!(transmitted(&mut c, t0 + 2 * TIMEOUT), [(2, 2)]);
        assert_eq!(c.stats().given_up, 1);
    }

    #[test]
    fn a_message_given_up_by_its_consumer_is_settled_with_the_error_once_and_never_resent() {
        let mut c = window(1);
        let t0 = Instant::now();
        c.handle_send(1, 1).unwrap();
        c.handle_send(2, 2).unwrap();
        assert_eq!(transmitted(&mut c, t0), [(1, 1)]);
        let error = DeliveryError::HandlingFailed {
            attempts: 3,
            last_error: "no".into(),
        };
        let other_life = Ack {
            incarnation: Incarnation::from_u128(7),
            ..ack(1)
        };
        assert!(!c.handle_given_up(&other_life, error.clone()));
        assert!(!c.handle_given_up(&ack(2), error.clone()), "not in flight");
        assert!(c.handle_given_up(&ack(1), error.clone()));
        assert!(!c.handle_given_up(&ack(1), error.clone()), "settled once");
        assert!(!c.handle_ack(&ack(1)), "a late ACK changes nothing");
        assert_eq!(settled(&mut c), [(1, Err(error))]);
        c.handle_timeout(t0 + TIMEOUT);
        assert_eq!(
            transmitted(&mut c, t0 + TIMEOUT),
            [(2, 2)],
            "1 is not resent"
        );
        let stats = c.stats();
        assert_eq!((stats.given_up, stats.ignored_acks), (1, 4));
    }

    #[test]
    fn exponential_backoff_grows_to_the_cap_and_jitter_only_shortens() {
        let max = Duration::from_secs(3);
        let mut c = core(ProducerConfig {
            backoff: Backoff::Exponential {
                multiplier: 2.0,
                max,
                jitter: 0.0,
            },
            ..Default::default()
        });
        let mut now = Instant::now();
        c.handle_send(1, 1).unwrap();
        transmitted(&mut c, now);
        let mut waits = Vec::new();
        for _ in 0..5 {
            let deadline = c.next_deadline().unwrap();
            waits.push(deadline - now);
            now = deadline;
            c.handle_timeout(now);
        }
        let ms: Vec<u128> = waits.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, [500, 1000, 2000, 3000, 3000]);

        let mut rng = SmallRng::seed_from_u64(1);
        let jittered = Backoff::Exponential {
            multiplier: 2.0,
            max,
            jitter: 0.5,
        };
        let waits: Vec<Duration> = (0..100)
            .map(|_| retry_interval(TIMEOUT, jittered, 2, &mut rng))
            .collect();
        assert!(waits
            .iter()
            .all(|w| *w > Duration::from_millis(499) && *w <= Duration::from_secs(1)));
        assert!(
            waits.iter().any(|w| *w < Duration::from_millis(900)),
            "jitter varies the wait"
        );
    }

    #[test]
    fn stop_settles_what_was_sent_or_stored_unconfirmed_and_the_rest_stopped() {
        let mut c = window(2);
        let now = Instant::now();
        c.handle_stored(1, 10, 10).unwrap(); // numbered by a durable producer: stored
        for body in 0..5 {
            c.handle_send(body, body).unwrap();
        }
        assert_eq!(transmitted(&mut c, now), [(1, 10), (2, 0)]);
        c.stop();
        let unconfirmed = Err(DeliveryError::StoppedUnconfirmed);
        let stopped = Err(DeliveryError::ProducerStopped);
        assert_eq!(
            settled(&mut c),
            [
                (10, unconfirmed.clone()),
                (0, unconfirmed),
                (1, stopped.clone()),
                (2, stopped.clone()),
                (3, stopped.clone()),
                (4, stopped)
            ]
        );
        assert!(c.is_idle());
        assert_eq!(c.next_deadline(), None);
    }

    #[test]
    fn restart_takes_a_new_incarnation_and_reuses_seqs_from_one() {
        let mut c = window(2);
        let now = Instant::now();
        c.handle_send(1, 1).unwrap();
        transmitted(&mut c, now);
        c.restart(Incarnation::from_u128(43));
        assert_eq!(
            settled(&mut c),
            [(1, Err(DeliveryError::StoppedUnconfirmed))]
        );
        c.handle_send(2, 2).unwrap();
        let t = c.poll_transmit(now).unwrap();
        assert_eq!(
            (t.header.seq, t.header.incarnation),
            (1, Incarnation::from_u128(43))
        );
        assert!(
            !c.handle_ack(&ack(1)),
            "an ACK for the old incarnation is ignored"
        );
    }

    #[test]
    fn id_defaults_to_producer_and_the_hex_digits_of_one_draw() {
        let c: Core = ProducerCore::seeded(&ProducerConfig::default(), INCARNATION, || 0xabc);
        assert_eq!(c.id().as_str(), "producer-0000000000000abc");
    }

    #[test]
    fn a_resumed_life_sends_its_stored_messages_first_under_their_own_seqs_through_the_window() {
        let config = ProducerConfig {
            producer_id: Some("p".into()),
            window_size: 2,
            ..Default::default()
        };
        let mut c = Core::resume(
            &config,
            INCARNATION,
            10,
            [(3, 30, 30), (5, 50, 50), (7, 70, 70)],
            || 7,
        );
        c.handle_send(100, 100).unwrap();
        let now = Instant::now();
        let sent: Vec<(u64, u64, u32)> = std::iter::from_fn(|| c.poll_transmit(now))
            .map(|t| (t.header.seq, t.header.window_start, t.body))
            .collect();
        assert_eq!(sent, [(3, 3, 30), (5, 3, 50)], "window 2, the oldest first");
        assert!(c.handle_ack(&ack(3)));
        // 3 is settled in memory, not yet in the journal: window_start stays.
        assert_eq!(transmitted_starts(&mut c, now), [(7, 3)]);
        c.set_durably_settled_below(5);
        assert!(c.handle_ack(&ack(5)));
        assert_eq!(
            transmitted_starts(&mut c, now),
            [(10, 5)],
            "new messages from next_seq"
        );
        assert_eq!(c.stats().queued, 0);
    }

    #[test]
    fn resuming_with_nothing_stored_just_continues_the_seq() {
        let config = ProducerConfig {
            producer_id: Some("p".into()),
            ..Default::default()
        };
        let mut c = Core::resume(&config, INCARNATION, 42, [], || 7);
        assert!(c.is_idle());
        c.handle_send(1, 1).unwrap();
        let t = c.poll_transmit(Instant::now()).unwrap();
        assert_eq!(
            (t.header.seq, t.header.window_start, t.attempt),
            (42, 42, 1)
        );
    }

    #[test]
    fn stored_messages_keep_their_seqs_are_never_refused_and_follow_the_resumed_ones() {
        let config = ProducerConfig {
            producer_id: Some("p".into()),
            window_size: 1,
            max_pending: 1,
            ..Default::default()
        };
        let mut c = Core::resume(&config, INCARNATION, 4, [(2, 20, 20), (3, 30, 30)], || 7);
        for seq in 4..=7 {
            let body = u32::try_from(seq).unwrap() * 10;
            assert!(c.handle_stored(seq, body, body).is_ok(), "seq {seq}");
        }
        assert_eq!(
            c.stats().queued,
            6,
            "beyond window + max_pending: nothing refused"
        );
        assert_eq!(c.handle_stored(9, 90, 90), Err((90, 90)), "a gap");
        assert_eq!(
            c.handle_stored(7, 70, 70),
            Err((70, 70)),
            "a seq given already"
        );
        let now = Instant::now();
        let mut sent = Vec::new();
        for seq in 2..=7 {
            let t = c.poll_transmit(now).unwrap();
            sent.push((t.header.seq, t.body));
            assert!(c.handle_ack(&ack(seq)));
        }
        assert_eq!(sent, [(2, 20), (3, 30), (4, 40), (5, 50), (6, 60), (7, 70)]);
        assert!(settled(&mut c).iter().all(|(_, result)| result.is_ok()));
        c.handle_send(80, 80).unwrap();
        assert_eq!(c.handle_stored(8, 81, 81), Err((81, 81)), "not mixed");
        assert_eq!(c.poll_transmit(now).map(|t| t.header.seq), Some(8));
    }
    #[test]
    fn a_settled_seq_is_sent_again_in_order_and_a_forgotten_one_settles_nothing() {
        let mut c = window(2);
        let now = Instant::now();
        for body in 1..=3 {
            c.handle_send(body, body).unwrap();
        }
        assert_eq!(transmitted(&mut c, now), [(1, 1), (2, 2)]);
        assert!(c.handle_ack(&ack(1)));
        assert_eq!(transmitted(&mut c, now), [(3, 3)]);
        assert_eq!(c.handle_again(1, 10, 10), Ok(()));
        assert_eq!(c.handle_again(2, 20, 20), Err((20, 20)), "in flight still");
        assert_eq!(c.handle_again(4, 40, 40), Err((40, 40)), "never numbered");
        assert!(c.handle_ack(&ack(2)));
        assert_eq!(transmitted(&mut c, now), [(1, 10)], "through the window");
        assert_eq!(c.forget(3), Some((3, 3)));
        assert_eq!(c.forget(3), None);
        assert!(!c.handle_ack(&ack(3)), "forgotten: not in flight");
        assert!(c.handle_ack(&ack(1)));
        assert_eq!(
            settled(&mut c),
            [(1, Ok(())), (2, Ok(())), (10, Ok(()))],
            "the forgotten seq settles nothing"
        );
        assert_eq!(c.stats().confirmed, 3);
        assert!(c.is_idle());
    }

    #[test]
    fn a_seq_sent_again_below_those_in_flight_keeps_them_in_seq_order() {
        let mut c = window(4);
        let now = Instant::now();
        for body in 1..=3 {
            c.handle_send(body, body).unwrap();
        }
        transmitted(&mut c, now);
        assert!(c.handle_ack(&ack(1)));
        c.handle_again(1, 10, 10).unwrap();
        assert_eq!(transmitted(&mut c, now), [(1, 10)]);
        // Found again by seq: ACKs in any order settle the right tokens.
        for seq in [3, 1, 2] {
            assert!(c.handle_ack(&ack(seq)));
        }
        let tokens: Vec<u32> = settled(&mut c).into_iter().map(|(t, _)| t).collect();
        assert_eq!(tokens, [1, 3, 10, 2]);
    }

    #[test]
    fn a_seq_sent_again_into_the_place_its_ack_left_is_found_and_settled() {
        let mut c = window(4);
        let now = Instant::now();
        for body in 1..=3 {
            c.handle_send(body, body).unwrap();
        }
        transmitted(&mut c, now);
        assert!(
            c.handle_ack(&ack(2)),
            "out of order: 2 leaves a hole behind 1"
        );
        c.handle_again(2, 20, 20).unwrap();
        assert_eq!(transmitted(&mut c, now), [(2, 20)]);
        assert_eq!(c.stats().in_flight, 3);
        for seq in [2, 1, 3] {
            assert!(c.handle_ack(&ack(seq)));
        }
        let tokens: Vec<u32> = settled(&mut c).into_iter().map(|(t, _)| t).collect();
        assert_eq!(tokens, [2, 20, 1, 3]);
        assert!(c.is_idle());
    }

    #[test]
    fn acks_behind_a_stuck_message_free_their_slots_and_keep_the_window_start() {
        let mut c = window(16);
        let now = Instant::now();
        c.handle_send(0, 0).unwrap();
        transmitted(&mut c, now); // seq 1: never ACKed
        for body in 1..20_000 {
            c.handle_send(body, body).unwrap();
            let sent = std::iter::from_fn(|| c.poll_transmit(now)).collect::<Vec<_>>();
            let [sent] = sent.as_slice() else {
                panic!("one transmission per message, not {}", sent.len());
            };
            assert_eq!(sent.header.window_start, 1, "held at the stuck message");
            assert!(c.handle_ack(&ack(sent.header.seq)));
        }
        assert_eq!(c.stats().in_flight, 1);
        assert!(c.in_flight.slot_count() <= 34, "no buffer grows behind it");
        assert_eq!(c.stats().confirmed, 19_999);
        for seq in [0, 1 << 63, u64::MAX, 2] {
            assert!(!c.handle_ack(&ack(seq)), "seq {seq} is not in flight");
        }
        assert!(c.handle_ack(&ack(1)));
        assert_eq!(settled(&mut c).len(), 20_000);
        assert!(c.is_idle());
    }

    /// (seq, window_start) of what the core puts on the wire at `now`.
    fn transmitted_starts(c: &mut Core, now: Instant) -> Vec<(u64, u64)> {
        std::iter::from_fn(|| c.poll_transmit(now))
            .map(|t| (t.header.seq, t.header.window_start))
            .collect()
    }
}
