//! The consumer's protocol: admission → dedup → decide (run the handler, re-ACK, or hold), one
//! handler at a time, and what a handler's outcome means; chunks of large messages are
//! reassembled first (see [`chunk`](crate::protocol::chunk) for their rules).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::config::ConsumerConfig;
use crate::protocol::chunk::reassembly::Reassembly;
use crate::protocol::dedup::{DedupTable, Lookup, ProducerWindow, WindowRef};
use crate::protocol::envelope::{admit, Ack, DeadLetterReason, Header};
use crate::protocol::keyed_ring::KeyedRing;
use crate::protocol::rate_limit::RateLimited;

mod chunks;

pub use chunks::ChunkStep;

/// A delivery as it reaches the consumer. `B` is the body, `R` the address ACKs go to.
#[derive(Debug)]
pub struct Inbound<B, R> {
    /// Identity and window of the message.
    pub header: Header,
    /// The message.
    pub body: B,
    /// Where the ACK goes; a delivery without one is a dead letter.
    pub reply_to: Option<R>,
}

/// What the consumer must do about a delivery right now.
#[derive(Debug)]
pub enum Step<B, R> {
    /// Start the handler for this message (nothing else is running); which message it is:
    /// [`running`](ConsumerCore::running).
    Run(B),
    /// A duplicate of a handled message: send this ACK again.
    Ack(R, Ack),
    /// Nothing now: the delivery waits for the running handler, is already waiting or running,
    /// was refused by the out-of-order bound (the producer will retransmit it), or is stale
    /// (its producer had declared it settled).
    Hold,
    /// A malformed delivery: record it as a dead letter. No handler, no ACK.
    DeadLetter(DeadLetterReason, Header),
}

impl<B, R> Step<B, R> {
    /// Whether nothing is to be done now.
    pub fn is_hold(&self) -> bool {
        matches!(self, Step::Hold)
    }
}

/// What became of a handler run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HandlerOutcome {
    /// The handler resolved `Ok`: the message is handled and gets its ACK.
    Succeeded,
    /// The handler returned an error (its text): no ACK, the producer retransmits.
    Failed(String),
    /// The handler panicked (the panic message): treated like an error.
    Panicked(String),
    /// A pipelined handler handed the message off: the next message may run, and the
    /// message's own outcome follows through
    /// [`handle_deferred`](ConsumerCore::handle_deferred) (only in unordered mode).
    Deferred,
    /// The handler refused the message before running anything: its body breaks a rule that
    /// admission could not check (it names an origin that is not its sender's, see
    /// [`check_origin`](crate::protocol::origin::check_origin)). A dead letter: counted, no
    /// ACK, handed out by [`poll_refused`](ConsumerCore::poll_refused).
    Refused(DeadLetterReason),
}

/// The consequences of a finished (or abandoned) handler run.
#[derive(Debug)]
pub struct Completion<B, R> {
    /// The ACK to send, if the handler succeeded.
    pub ack: Option<(R, Ack)>,
    /// The next waiting message to start the handler for (described by
    /// [`running`](ConsumerCore::running)).
    pub next: Option<B>,
    /// The run was [`HandlerOutcome::Deferred`]: report its outcome under this id.
    pub deferred: Option<u64>,
}

/// Counters of a consumer since it started (`tracked_producers`, `tracked_incarnations` and
/// `waiting` are current values).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ConsumerStats {
    /// Messages whose handler succeeded (and were ACKed).
    pub delivered: u64,
    /// Deliveries of already-handled messages: re-ACKed without running the handler.
    pub duplicates: u64,
    /// Deliveries of messages whose handler was running or queued: dropped, the ACK follows
    /// the handler.
    pub in_progress: u64,
    /// Deliveries, and waiting messages, of seqs their producer had declared settled (below its
    /// `window_start`: ACKed or given up): dropped without a handler run or an ACK.
    pub stale: u64,
    /// Malformed deliveries refused as dead letters.
    pub dead_letters: u64,
    /// Deliveries refused by the out-of-order bound or ordered mode, or dropped while waiting
    /// because their producer's window was lost (all retransmitted later).
    pub refused: u64,
    /// Handler runs that returned an error.
    pub handler_failures: u64,
    /// Handler runs that panicked.
    pub handler_panics: u64,
    /// Handler runs (and deferred outcomes of pipelined handlers) abandoned after
    /// `handler_timeout`.
    pub handler_timeouts: u64,
    /// Producers evicted, with their windows, to make room for a new one (`max_producers`).
    pub evictions: u64,
    /// Dedup windows removed by the idle sweep (`producer_idle_ttl`).
    pub swept: u64,
    /// Dedup windows dropped because their producer id had more incarnations
    /// ([`MAX_INCARNATIONS_PER_ID`](crate::protocol::dedup::MAX_INCARNATIONS_PER_ID)).
    pub replaced_incarnations: u64,
    /// New messages that switched a producer id's incarnation while its new messages had been
    /// alternating between incarnations for [`SHARED_ID_GRACE`](crate::protocol::dedup::SHARED_ID_GRACE)
    /// or longer: a sign that several live producers share one id (ids should be unique).
    pub shared_id_messages: u64,
    /// Producer ids tracked right now.
    pub tracked_producers: usize,
    /// Dedup windows (producer incarnations) tracked right now.
    pub tracked_incarnations: usize,
    /// Admitted messages waiting for the running handler right now.
    pub waiting: usize,
    /// Messages handed off by a pipelined handler, awaiting their outcome right now.
    pub deferred: usize,
    /// Chunked messages reassembled whole (each runs the handler once, or is a dead letter
    /// if it does not decode).
    pub assembled: u64,
    /// Chunks not buffered: one of a newer message while an older one of the same producer
    /// is being reassembled or waits, or no room within `max_reassembly_bytes` (their
    /// producers retransmit them; see [`reassembly`](crate::protocol::chunk::reassembly)).
    pub chunks_refused: u64,
    /// Partial messages dropped: for an older message of their producer, for room (they keep
    /// their place in line), at the end of their lifetime (`reassembly_grace` + their length
    /// at `min_reassembly_rate`), with their producer's window, settled by their producer, or
    /// contradicted by a chunk. Their producers send them again.
    pub partial_messages_dropped: u64,
    /// Messages being reassembled right now.
    pub partial_messages: usize,
    /// Chunked messages refused for room that keep their place in line right now.
    pub messages_waiting_for_room: usize,
    /// Bytes of chunked messages held right now: reserved by partial messages (each its whole
    /// length, at least 128 bytes a chunk), and held by reassembled messages waiting for the
    /// handler.
    pub reassembly_bytes: u64,
}

#[derive(Debug)]
struct Running<R> {
    header: Header,
    reply_to: R,
    window: WindowRef,
    /// When the run started. Its `handler_timeout` deadline is computed from it only when
    /// asked for: most runs end before anyone asks, so they never pay for the addition.
    started: Instant,
}

/// A message handed off by a pipelined handler.
#[derive(Debug)]
struct Deferred<R> {
    header: Header,
    reply_to: R,
    window: WindowRef,
    deadline: Option<Instant>,
}

#[derive(Debug)]
struct Waiting<B, R> {
    header: Header,
    body: B,
    reply_to: R,
    window: WindowRef,
    /// What a reassembled message holds of `max_reassembly_bytes` until it runs (0 for
    /// others).
    charge: u64,
}

/// Rate limiters, one per kind of warning.
#[derive(Debug, Default)]
struct Warnings {
    dead_letters: RateLimited,
    evictions: RateLimited,
    refusals: RateLimited,
    failures: RateLimited,
    shared_ids: RateLimited,
}

/// The consumer state machine. Pure: time is an argument, nothing sleeps or spawns.
///
/// Feed it deliveries ([`handle_delivery`](Self::handle_delivery)), handler outcomes
/// ([`handle_outcome`](Self::handle_outcome)) and timer ticks
/// ([`handle_timeout`](Self::handle_timeout) at [`next_deadline`](Self::next_deadline)); carry
/// out the [`Step`]s and [`Completion`]s it returns. It runs one handler at a time and queues
/// admitted deliveries meanwhile (bounded per producer by `max_out_of_order`).
#[derive(Debug)]
pub struct ConsumerCore<B, R> {
    table: DedupTable,
    max_out_of_order: Option<usize>,
    ordered: bool,
    handler_timeout: Option<Duration>,
    running: Option<Running<R>>,
    waiting: VecDeque<Waiting<B, R>>,
    /// Waiting messages whose window was dropped or whose seq became stale: they never run
    /// (their producers retransmit them, or settled them) and are purged once they are half of
    /// the queue.
    orphans: usize,
    /// Messages handed off by pipelined handlers, by id (ascending ids: by deadline too).
    deferred: KeyedRing<Deferred<R>>,
    next_deferred: u64,
    /// Deferred outcomes abandoned after `handler_timeout`, for the shell to cancel.
    expired: VecDeque<u64>,
    /// Messages the handler refused as dead letters, for the shell's dead-letter sink.
    refused: VecDeque<(DeadLetterReason, Header)>,
    /// Chunks of large messages, per producer (its slot in the table) and incarnation window,
    /// until their message is whole.
    chunks: Reassembly<usize, WindowRef>,
    max_message_bytes: u64,
    stats: ConsumerStats,
    warnings: Warnings,
}

impl<B, R> ConsumerCore<B, R> {
    /// A consumer with the given (validated) settings.
    ///
    /// # Panics
    /// If `config` breaks a rule of [`ConsumerConfig::validate`].
    pub fn new(config: &ConsumerConfig) -> Self {
        Self {
            table: DedupTable::new(config.max_producers.get(), config.producer_idle_ttl.get()),
            max_out_of_order: config.max_out_of_order.get(),
            ordered: config.ordered,
            handler_timeout: config.handler_timeout.get(),
            running: None,
            waiting: VecDeque::new(),
            orphans: 0,
            deferred: KeyedRing::default(),
            next_deferred: 0,
            expired: VecDeque::new(),
            refused: VecDeque::new(),
            chunks: Reassembly::new(config.max_reassembly_bytes, config.reassembly_lifetime()),
            max_message_bytes: config.max_message_bytes,
            stats: ConsumerStats::default(),
            warnings: Warnings::default(),
        }
    }

    /// Admission, dedup and the decision for one delivery.
    pub fn handle_delivery(&mut self, inbound: Inbound<B, R>, now: Instant) -> Step<B, R> {
        self.purge_orphans();
        let Inbound {
            header,
            body,
            reply_to,
        } = inbound;
        let reply_to = match admitted(&header, reply_to) {
            Ok(reply_to) => reply_to,
            Err(reason) => return self.dead_letter(reason, header, now),
        };
        let step = self.decide(header, body, reply_to, now);
        // The lookup may have orphaned waiting messages (made stale, or their window dropped).
        self.collect_orphans();
        step
    }

    /// A delivery whose body a transport could not decode as the consumer's message type: a
    /// dead letter like a malformed envelope (counted, warned about), touching no state; its
    /// producer gets no ACK.
    pub fn handle_undecodable(&mut self, header: Header, now: Instant) -> Step<B, R> {
        self.handle_unreadable(header, DeadLetterReason::UndecodableBody, now)
    }

    /// As [`handle_undecodable`](Self::handle_undecodable), for `reason`
    /// ([`DeadLetterReason::UndecodableBody`], or [`DeadLetterReason::IncompatibleBody`] for a
    /// body in a codec or schema version the consumer's type cannot read).
    pub fn handle_unreadable(
        &mut self,
        header: Header,
        reason: DeadLetterReason,
        now: Instant,
    ) -> Step<B, R> {
        self.dead_letter(reason, header, now)
    }

    /// Dedup and the decision for an admitted delivery.
    fn decide(&mut self, header: Header, body: B, reply_to: R, now: Instant) -> Step<B, R> {
        let (window, at, lookup) = self.table.window_for(
            &header.producer_id,
            header.incarnation,
            header.window_start,
            now,
        );
        count_lookup(&mut self.stats, &mut self.warnings, lookup, now);
        let seq = header.seq;
        if window.is_stale(seq) {
            self.stats.stale += 1;
            return Step::Hold;
        }
        if window.is_handled(seq) {
            self.stats.duplicates += 1;
            let ack = Ack {
                producer_id: header.producer_id,
                incarnation: header.incarnation,
                seq,
            };
            return Step::Ack(reply_to, ack);
        }
        let running = running_of(&self.running, &header);
        if in_hand(window, running, seq) {
            self.stats.in_progress += 1;
            return Step::Hold;
        }
        if !admissible(
            window,
            at,
            running,
            seq,
            self.ordered,
            self.max_out_of_order,
        ) {
            self.refuse(now);
            return Step::Hold;
        }
        window.note_admitted_through(seq);
        // As `start_or_wait` (chunks.rs) for a reassembled message, written out here: sharing
        // it cost the plain path 5-7% in the cores bench.
        let step = if self.running.is_none() {
            self.running = Some(Running {
                header,
                reply_to,
                window: at,
                started: now,
            });
            Step::Run(body)
        } else {
            window.begin_waiting(seq);
            self.waiting.push_back(Waiting {
                header,
                body,
                reply_to,
                window: at,
                charge: 0,
            });
            Step::Hold
        };
        self.note_admitted(at, now);
        step
    }

    /// Counts (and now and then warns about) a delivery refused by the out-of-order bound or
    /// ordered mode.
    fn refuse(&mut self, now: Instant) {
        self.stats.refused += 1;
        if let Some(n) = self.warnings.refusals.record(now, 1) {
            log::warn!(
                "refused {n} out-of-order deliveries (max_out_of_order or ordered mode); \
                 their producers will retransmit them"
            );
        }
    }

    /// Notes that the window `at` admitted a new message, and warns when several live
    /// producers seem to share its id.
    fn note_admitted(&mut self, at: WindowRef, now: Instant) {
        if self.table.note_admitted(at, now) {
            self.stats.shared_id_messages += 1;
            if let Some(n) = self.warnings.shared_ids.record(now, 1) {
                log::warn!(
                    "{n} new message(s) of a producer id whose incarnations keep alternating: \
                     several live producers seem to share an id (ids must be unique per live \
                     producer)"
                );
            }
        }
    }

    /// Records how the running handler ended and says what follows: the ACK on success, and
    /// the next waiting message to run. Without a running handler this does nothing.
    pub fn handle_outcome(&mut self, outcome: &HandlerOutcome, now: Instant) -> Completion<B, R> {
        let Some(running) = self.running.take() else {
            debug_assert!(false, "an outcome arrived while no handler was running");
            return Completion {
                ack: None,
                next: None,
                deferred: None,
            };
        };
        if *outcome == HandlerOutcome::Deferred {
            debug_assert!(!self.ordered, "ordered mode awaits every handler");
            let id = self.next_deferred;
            self.next_deferred += 1;
            if let Some(window) = self.table.window(running.window) {
                window.begin_deferred(running.header.seq);
            }
            self.deferred.insert(
                id,
                Deferred {
                    header: running.header,
                    reply_to: running.reply_to,
                    window: running.window,
                    deadline: self.handler_timeout.map(|timeout| now + timeout),
                },
            );
            return Completion {
                ack: None,
                next: self.start_next(now),
                deferred: Some(id),
            };
        }
        let ack = match outcome {
            HandlerOutcome::Succeeded => {
                // A window evicted or replaced meanwhile is not recreated: the ACK still goes
                // out, the worst case is one more handler run for a late retransmit.
                if let Some(window) = self.table.window(running.window) {
                    window.complete_range(running.header.first_seq(), running.header.seq);
                }
                self.stats.delivered += 1;
                Some((running.reply_to, Ack::from(running.header)))
            }
            HandlerOutcome::Deferred => unreachable!("handled above"),
            HandlerOutcome::Refused(reason) => {
                self.refuse_as_dead_letter(*reason, running.header, running.window, now);
                None
            }
            HandlerOutcome::Failed(_) | HandlerOutcome::Panicked(_) => {
                self.count_failure(outcome);
                self.not_handled(&running.header, running.window, &describe(outcome), now);
                None
            }
        };
        let next = self.start_next(now);
        Completion {
            ack,
            next,
            deferred: None,
        }
    }

    /// The outcome of a message a pipelined handler handed off (`id` from its
    /// [`Completion`]): the ACK to send if it succeeded. An unknown id (abandoned after
    /// `handler_timeout`, or from before [`clear`](Self::clear)) changes nothing.
    pub fn handle_deferred(
        &mut self,
        id: u64,
        outcome: &HandlerOutcome,
        now: Instant,
    ) -> Option<(R, Ack)> {
        let deferred = self.deferred.remove(id)?;
        let window = self.table.window(deferred.window);
        let seq = deferred.header.seq;
        if *outcome == HandlerOutcome::Succeeded {
            if let Some(window) = window {
                window.end_deferred(seq);
                window.complete_range(deferred.header.first_seq(), seq);
            }
            self.stats.delivered += 1;
            return Some((deferred.reply_to, Ack::from(deferred.header)));
        }
        if let Some(window) = window {
            window.end_deferred(seq);
        }
        if let HandlerOutcome::Refused(reason) = outcome {
            self.refuse_as_dead_letter(*reason, deferred.header, deferred.window, now);
            return None;
        }
        self.count_failure(outcome);
        self.not_handled(&deferred.header, deferred.window, &describe(outcome), now);
        None
    }

    /// The next message the handler refused as a dead letter, for the shell's sink.
    pub fn poll_refused(&mut self) -> Option<(DeadLetterReason, Header)> {
        self.refused.pop_front()
    }

    /// A deferred outcome abandoned after `handler_timeout` (its id): cancel its future.
    pub fn poll_expired(&mut self) -> Option<u64> {
        self.expired.pop_front()
    }

    /// Runs what is due at `now`: the idle sweep, the end of partial messages' lifetimes (and
    /// of waiting ones' places), and the abandonment of a handler run (or a deferred outcome,
    /// see [`poll_expired`](Self::poll_expired)) older than `handler_timeout`. `Some` when the running handler was abandoned: drop its future and
    /// carry out the completion (it has no ACK: the producer retransmits the message).
    pub fn handle_timeout(&mut self, now: Instant) -> Option<Completion<B, R>> {
        let swept = self.table.sweep(now);
        if swept > 0 {
            self.stats.swept += swept as u64;
            log::debug!("swept {swept} idle producer dedup window(s)");
        }
        let table = &mut self.table;
        let dropped = self.chunks.sweep(now, |key| table.is_live(*key));
        if dropped > 0 {
            log::debug!("dropped {dropped} partial message(s) at the end of their lifetime");
        }
        while let Some((_, front)) = self.deferred.front() {
            if front.deadline.is_none_or(|deadline| now < deadline) {
                break;
            }
            let (id, expired) = self.deferred.pop_front().expect("checked above");
            if let Some(window) = self.table.window(expired.window) {
                window.end_deferred(expired.header.seq);
            }
            self.stats.handler_timeouts += 1;
            let (header, window) = (&expired.header, expired.window);
            self.not_handled(header, window, "timed out (handler_timeout)", now);
            self.expired.push_back(id);
        }
        let expired = self
            .running_deadline()
            .is_some_and(|deadline| deadline <= now);
        let completion = expired.then(|| {
            let running = self.running.take().expect("checked above");
            self.stats.handler_timeouts += 1;
            let timed_out = "timed out (handler_timeout)";
            self.not_handled(&running.header, running.window, timed_out, now);
            Completion {
                ack: None,
                next: self.start_next(now),
                deferred: None,
            }
        });
        self.purge_orphans();
        completion
    }

    /// When [`handle_timeout`](Self::handle_timeout) should be called next (`None`: no timer
    /// needed).
    pub fn next_deadline(&self) -> Option<Instant> {
        let running = self.running_deadline();
        let deferred = self.deferred.front().and_then(|(_, d)| d.deadline);
        let partial = self.chunks.next_deadline();
        [self.table.next_sweep(), running, deferred, partial]
            .into_iter()
            .flatten()
            .min()
    }

    /// When the running handler is abandoned (`handler_timeout`), if one runs and has a limit.
    fn running_deadline(&self) -> Option<Instant> {
        let started = self.running.as_ref()?.started;
        self.handler_timeout.map(|timeout| started + timeout)
    }

    /// The message whose handler is running, if any.
    pub fn running(&self) -> Option<&Header> {
        self.running.as_ref().map(|r| &r.header)
    }

    /// When the running handler started, if one runs.
    pub fn running_since(&self) -> Option<Instant> {
        self.running.as_ref().map(|r| r.started)
    }

    /// Whether a handler is running.
    pub fn is_running(&self) -> bool {
        self.running.is_some()
    }

    /// Number of producers with a dedup window.
    pub fn tracked_producers(&self) -> usize {
        self.table.len()
    }

    /// Seqs handled out of order above the contiguous mark for producer `id`, in its most
    /// recently used incarnation (`None` if the producer is not tracked).
    pub fn out_of_order_for(&self, id: &str) -> Option<usize> {
        self.table.get(id).map(|window| window.out_of_order())
    }

    /// Counters since start, with the current `tracked_producers`, `tracked_incarnations` and
    /// `waiting`.
    pub fn stats(&self) -> ConsumerStats {
        let chunks = self.chunks.stats();
        ConsumerStats {
            tracked_producers: self.table.len(),
            tracked_incarnations: self.table.windows(),
            waiting: self.waiting.len() - self.orphans,
            deferred: self.deferred.len(),
            assembled: chunks.assembled,
            chunks_refused: chunks.refused,
            partial_messages_dropped: chunks.dropped,
            partial_messages: self.chunks.len(),
            messages_waiting_for_room: self.chunks.waiting(),
            reassembly_bytes: self.chunks.charged(),
            ..self.stats
        }
    }

    /// Forgets all dedup state and waiting messages (the consumer stopped).
    pub fn clear(&mut self) {
        self.table.clear();
        self.chunks.clear();
        self.waiting.clear();
        self.orphans = 0;
        self.running = None;
        self.deferred.clear();
        self.expired.clear();
        self.refused.clear();
    }

    fn count_failure(&mut self, outcome: &HandlerOutcome) {
        if matches!(outcome, HandlerOutcome::Panicked(_)) {
            self.stats.handler_panics += 1;
        } else {
            self.stats.handler_failures += 1;
        }
    }

    /// A run ended without success: warn (rate-limited), and in ordered mode drop the waiting
    /// successors of the message (they must not overtake it; all are retransmitted).
    fn not_handled(&mut self, failed: &Header, at: WindowRef, what: &str, now: Instant) {
        if let Some(n) = self.warnings.failures.record(now, 1) {
            log::warn!(
                "{n} handler run(s) failed and were not ACKed (latest: {what}); their producers \
                 will retransmit"
            );
        }
        self.drop_successors(failed, at);
    }

    /// The handler refused a message as a dead letter: counted and warned about like the
    /// dead letters of admission, queued for the sink, not ACKed, nothing recorded.
    fn refuse_as_dead_letter(
        &mut self,
        reason: DeadLetterReason,
        header: Header,
        at: WindowRef,
        now: Instant,
    ) {
        self.stats.dead_letters += 1;
        if let Some(n) = self.warnings.dead_letters.record(now, 1) {
            log::warn!("refused {n} deliveries as dead letters (latest: {reason})");
        }
        self.drop_successors(&header, at);
        self.refused.push_back((reason, header));
    }

    /// In ordered mode, drops the waiting successors of a message that was not handled (they
    /// must not overtake it; all are retransmitted).
    fn drop_successors(&mut self, failed: &Header, at: WindowRef) {
        if !self.ordered {
            return;
        }
        self.collect_orphans();
        if let Some(window) = self.table.window(at) {
            window.reset_admitted();
        }
        let (before, table, chunks) = (self.waiting.len(), &mut self.table, &mut self.chunks);
        let mut orphans_removed = 0;
        self.waiting.retain(|w| {
            let same = w.header.producer_id == failed.producer_id
                && w.header.incarnation == failed.incarnation;
            if !same {
                return true;
            }
            chunks.release(w.charge);
            let window = table.window(w.window);
            let was_waiting = window.is_some_and(|win| {
                win.reset_admitted();
                win.end_waiting(w.header.seq)
            });
            if !was_waiting {
                orphans_removed += 1;
            }
            false
        });
        self.orphans -= orphans_removed;
        self.stats.refused += (before - self.waiting.len() - orphans_removed) as u64;
    }

    /// Makes the next waiting message that may still run the running one, and returns its body.
    #[inline]
    fn start_next(&mut self, now: Instant) -> Option<B> {
        self.purge_orphans();
        while let Some(w) = self.waiting.pop_front() {
            self.chunks.release(w.charge);
            let was_waiting = self
                .table
                .window(w.window)
                .is_some_and(|window| window.end_waiting(w.header.seq));
            if !was_waiting {
                self.orphans -= 1; // counted when it was orphaned
                continue;
            }
            self.running = Some(Running {
                header: w.header,
                reply_to: w.reply_to,
                window: w.window,
                started: now,
            });
            return Some(w.body);
        }
        None
    }

    /// Keeps the queue bounded when windows are dropped, or seqs become stale, while their
    /// messages wait: once at least half of it is orphaned, it is compacted (amortised O(1)
    /// per message).
    fn purge_orphans(&mut self) {
        self.collect_orphans();
        if self.orphans == 0 || self.orphans * 2 < self.waiting.len() {
            return;
        }
        let (before, table, chunks) = (self.waiting.len(), &mut self.table, &mut self.chunks);
        self.waiting.retain(|w| {
            let keep = table
                .window(w.window)
                .is_some_and(|window| window.is_waiting(w.header.seq));
            if !keep {
                chunks.release(w.charge);
            }
            keep
        });
        debug_assert_eq!(before - self.waiting.len(), self.orphans, "counted exactly");
        self.orphans = 0;
    }

    /// Counts the waiting messages the table orphaned since the last call: stale ones, and
    /// those whose window was dropped (refused: their producers retransmit them).
    fn collect_orphans(&mut self) {
        let orphaned = self.table.take_orphaned();
        self.orphans += orphaned.total();
        self.stats.stale += orphaned.stale as u64;
        self.stats.refused += orphaned.dropped as u64;
    }

    fn dead_letter(
        &mut self,
        reason: DeadLetterReason,
        header: Header,
        now: Instant,
    ) -> Step<B, R> {
        self.stats.dead_letters += 1;
        if let Some(n) = self.warnings.dead_letters.record(now, 1) {
            log::warn!("refused {n} malformed deliveries as dead letters (latest: {reason})");
        }
        Step::DeadLetter(reason, header)
    }
}

/// Counts what a dedup lookup did: an eviction (warned about, rate-limited), a replaced
/// incarnation.
fn count_lookup(stats: &mut ConsumerStats, warnings: &mut Warnings, lookup: Lookup, now: Instant) {
    match lookup {
        Lookup::Existing
        | Lookup::Created { evicted: false }
        | Lookup::NewIncarnation { replaced: false } => {}
        Lookup::Created { evicted: true } => {
            stats.evictions += 1;
            if let Some(n) = warnings.evictions.record(now, 1) {
                log::warn!(
                    "evicted {n} producer(s) from the dedup table to stay within \
                     max_producers; a retransmit from an evicted producer may run its \
                     handler twice"
                );
            }
        }
        Lookup::NewIncarnation { replaced: true } => stats.replaced_incarnations += 1,
    }
}

/// Where to ACK a delivery whose header is admitted; why not, if it is not (or has nowhere
/// to ACK).
fn admitted<R>(header: &Header, reply_to: Option<R>) -> Result<R, DeadLetterReason> {
    admit(header, reply_to.is_some())?;
    reply_to.ok_or(DeadLetterReason::MissingReplyTo)
}

/// The running message, if it is of `header`'s producer incarnation.
fn running_of<'a, R>(running: &'a Option<Running<R>>, header: &Header) -> Option<&'a Running<R>> {
    running.as_ref().filter(|r| {
        r.header.incarnation == header.incarnation && r.header.producer_id == header.producer_id
    })
}

/// Whether the message of (last) seq `seq` is in hand: waiting, deferred or running (`running`
/// as [`running_of`] gives it). Its ACK follows the handler.
fn in_hand<R>(window: &ProducerWindow, running: Option<&Running<R>>, seq: u64) -> bool {
    window.is_waiting(seq)
        || window.is_deferred(seq)
        || running.is_some_and(|r| r.header.seq == seq)
}

/// Whether a new message starting at `first` may run or wait now: in ordered mode only the
/// next one in order; otherwise the gap-closing one always, others while the producer's
/// handled-above-contiguous plus in-progress messages stay below `max_out_of_order`.
#[inline]
fn admissible<R>(
    window: &ProducerWindow,
    at: WindowRef,
    running: Option<&Running<R>>,
    first: u64,
    ordered: bool,
    max_out_of_order: Option<usize>,
) -> bool {
    if ordered && first != window.next_in_order() {
        return false;
    }
    // The running message counts as retained above the mark only in its own window (not in
    // a fresh one that replaced a dropped window), and only while above the mark
    // (`window_start` may have moved past it).
    let running_above =
        running.is_some_and(|r| r.window == at && r.header.seq > window.contiguous());
    let in_progress = window.waiting() + window.deferred() + usize::from(running_above);
    first == window.contiguous() + 1
        || max_out_of_order.is_none_or(|max| window.out_of_order() + in_progress < max)
}

fn describe(outcome: &HandlerOutcome) -> String {
    match outcome {
        HandlerOutcome::Succeeded => "succeeded".into(),
        HandlerOutcome::Failed(error) => format!("error: {error}"),
        HandlerOutcome::Panicked(panic) => format!("panic: {panic}"),
        HandlerOutcome::Deferred => "deferred".into(),
        HandlerOutcome::Refused(reason) => format!("refused: {reason}"),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::Limit;
    use crate::protocol::dedup::MAX_INCARNATIONS_PER_ID;
    use crate::protocol::envelope::{Incarnation, ProducerId, MAX_SEQ};

    /// Bodies are strings, reply addresses are numbers.
    type Core = ConsumerCore<&'static str, u32>;

    fn core(config: ConsumerConfig) -> Core {
        ConsumerCore::new(&config)
    }

    fn inbound(id: &str, incarnation: u128, seq: u64) -> Inbound<&'static str, u32> {
        Inbound {
            header: Header {
                producer_id: ProducerId::from(id),
                incarnation: Incarnation::from_u128(incarnation),
                seq,
                window_start: 1,
                trace_context: None,
                chunk: None,
            },
            body: "body",
            reply_to: Some(7),
        }
    }

    fn ack(id: &str, incarnation: u128, seq: u64) -> Ack {
        Ack {
            producer_id: ProducerId::from(id),
            incarnation: Incarnation::from_u128(incarnation),
            seq,
        }
    }

    /// Delivers; the seq the handler is started for, if it is.
    fn run_seq(c: &mut Core, delivery: Inbound<&'static str, u32>, now: Instant) -> Option<u64> {
        match c.handle_delivery(delivery, now) {
            Step::Run(_) => c.running().map(|info| info.seq),
            _ => None,
        }
    }

    /// The message a completion starts next, if any.
    fn next_of(c: &Core, done: Completion<&'static str, u32>) -> Option<Header> {
        done.next.map(|_| c.running().expect("next runs").clone())
    }

    fn succeed(core: &mut Core, now: Instant) -> Completion<&'static str, u32> {
        core.handle_outcome(&HandlerOutcome::Succeeded, now)
    }

    fn fail(core: &mut Core, now: Instant) -> Completion<&'static str, u32> {
        core.handle_outcome(&HandlerOutcome::Failed("boom".into()), now)
    }

    #[test]
    fn new_message_runs_the_handler_and_success_acks_mirroring_the_incarnation() {
        let mut c = core(ConsumerConfig::default());
        let now = Instant::now();
        assert_eq!(run_seq(&mut c, inbound("p", 9, 1), now), Some(1));
        assert!(c.is_running());
        let done = succeed(&mut c, now);
        assert_eq!(done.ack, Some((7, ack("p", 9, 1))));
        assert!(done.next.is_none() && !c.is_running());
        assert_eq!(c.stats().delivered, 1);
    }

    #[test]
    fn duplicate_is_re_acked_without_running_the_handler() {
        let mut c = core(ConsumerConfig::default());
        let now = Instant::now();
        c.handle_delivery(inbound("p", 9, 1), now);
        succeed(&mut c, now);
        match c.handle_delivery(inbound("p", 9, 1), now) {
            Step::Ack(7, a) => assert_eq!(a, ack("p", 9, 1)),
            other => panic!("expected a re-ACK, got {other:?}"),
        }
        assert_eq!(c.stats().duplicates, 1);
        assert_eq!(c.stats().delivered, 1);
    }

    #[test]
    fn failed_or_panicked_handler_gets_no_ack_and_runs_again_on_retransmit() {
        let mut c = core(ConsumerConfig::default());
        let now = Instant::now();
        c.handle_delivery(inbound("p", 9, 1), now);
        assert!(fail(&mut c, now).ack.is_none());
        assert_eq!(run_seq(&mut c, inbound("p", 9, 1), now), Some(1));
        let done = c.handle_outcome(&HandlerOutcome::Panicked("oops".into()), now);
        assert!(done.ack.is_none());
        assert_eq!(run_seq(&mut c, inbound("p", 9, 1), now), Some(1));
        assert_eq!(succeed(&mut c, now).ack, Some((7, ack("p", 9, 1))));
        let stats = c.stats();
        assert_eq!(
            (
                stats.handler_failures,
                stats.handler_panics,
                stats.delivered
            ),
            (1, 1, 1)
        );
    }

    #[test]
    fn retransmit_of_a_running_or_waiting_seq_does_not_start_it_again() {
        let mut c = core(ConsumerConfig::default());
        let now = Instant::now();
        c.handle_delivery(inbound("p", 9, 1), now);
        c.handle_delivery(inbound("p", 9, 2), now);
        assert!(matches!(
            c.handle_delivery(inbound("p", 9, 1), now),
            Step::Hold
        ));
        assert!(matches!(
            c.handle_delivery(inbound("p", 9, 2), now),
            Step::Hold
        ));
        assert_eq!(c.stats().in_progress, 2);
        assert_eq!(c.stats().waiting, 1);
        let done = succeed(&mut c, now);
        assert_eq!(next_of(&c, done).map(|info| info.seq), Some(2));
        assert!(succeed(&mut c, now).next.is_none());
        assert_eq!(c.stats().delivered, 2);
    }

    #[test]
    fn admitted_deliveries_queue_and_run_one_at_a_time_in_arrival_order() {
        let mut c = core(ConsumerConfig::default());
        let now = Instant::now();
        assert_eq!(run_seq(&mut c, inbound("p", 9, 3), now), Some(3));
        for seq in [1, 2, 5] {
            assert!(matches!(
                c.handle_delivery(inbound("p", 9, seq), now),
                Step::Hold
            ));
        }
        let mut order = vec![3];
        while let Some(info) = {
            let done = succeed(&mut c, now);
            next_of(&c, done)
        } {
            order.push(info.seq);
        }
        assert_eq!(order, [3, 1, 2, 5]);
        let window = c.table.get("p").unwrap();
        assert_eq!((window.contiguous(), window.out_of_order()), (3, 1));
    }

    #[test]
    fn malformed_deliveries_are_dead_letters_that_touch_no_state() {
        let mut c = core(ConsumerConfig::default());
        let now = Instant::now();
        let mut no_reply = inbound("p", 1, 1);
        no_reply.reply_to = None;
        let cases = [
            (no_reply, DeadLetterReason::MissingReplyTo),
            (inbound("p", 1, 0), DeadLetterReason::SeqOutOfRange(0)),
            (
                inbound("p", 1, MAX_SEQ + 1),
                DeadLetterReason::SeqOutOfRange(MAX_SEQ + 1),
            ),
            (inbound("", 1, 1), DeadLetterReason::EmptyProducerId),
            (
                inbound(&"x".repeat(257), 1, 1),
                DeadLetterReason::ProducerIdTooLong(257),
            ),
        ];
        for (delivery, expected) in cases {
            match c.handle_delivery(delivery, now) {
                Step::DeadLetter(reason, _) => assert_eq!(reason, expected),
                other => panic!("expected a dead letter for {expected:?}, got {other:?}"),
            }
        }
        let undecodable = inbound("p", 1, 1).header;
        match c.handle_undecodable(undecodable, now) {
            Step::DeadLetter(reason, header) => {
                assert_eq!(reason, DeadLetterReason::UndecodableBody);
                assert_eq!(header.seq, 1);
            }
            other => panic!("expected a dead letter, got {other:?}"),
        }
        assert_eq!(c.stats().dead_letters, 6);
        assert_eq!(c.tracked_producers(), 0);
        assert!(!c.is_running());
        // Exactly 256 bytes is admitted, and the consumer keeps serving.
        let long = "x".repeat(256);
        assert_eq!(run_seq(&mut c, inbound(&long, 1, 1), now), Some(1));
    }

    #[test]
    fn out_of_order_bound_refuses_above_the_cap_but_always_admits_the_gap_closer() {
        let mut c = core(ConsumerConfig {
            max_out_of_order: Limit::At(2),
            ..Default::default()
        });
        let now = Instant::now();
        for seq in [3, 4] {
            c.handle_delivery(inbound("p", 1, seq), now);
            succeed(&mut c, now);
        }
        assert_eq!(c.out_of_order_for("p"), Some(2));
        assert!(matches!(
            c.handle_delivery(inbound("p", 1, 5), now),
            Step::Hold
        ));
        assert_eq!(c.stats().refused, 1);
        assert_eq!(run_seq(&mut c, inbound("p", 1, 1), now), Some(1));
        succeed(&mut c, now);
        assert_eq!(
            c.out_of_order_for("p"),
            Some(2),
            "1 does not close the gap at 2"
        );
        assert_eq!(run_seq(&mut c, inbound("p", 1, 2), now), Some(2));
        succeed(&mut c, now);
        assert_eq!(c.out_of_order_for("p"), Some(0));
        assert_eq!(run_seq(&mut c, inbound("p", 1, 5), now), Some(5));
    }

    #[test]
    fn waiting_messages_count_against_the_out_of_order_bound() {
        let mut c = core(ConsumerConfig {
            max_out_of_order: Limit::At(2),
            ..Default::default()
        });
        let now = Instant::now();
        c.handle_delivery(inbound("p", 1, 1), now); // running
        c.handle_delivery(inbound("p", 1, 3), now); // waiting
        assert!(matches!(
            c.handle_delivery(inbound("p", 1, 4), now),
            Step::Hold
        ));
        assert_eq!(
            c.stats().refused,
            1,
            "1 and 3 retained: the cap of 2 is reached"
        );
        assert_eq!(c.stats().waiting, 1);
    }

    #[test]
    fn ordered_mode_runs_each_producer_in_seq_order_and_pipelines_the_next_seqs() {
        let mut c = core(ConsumerConfig {
            ordered: true,
            ..Default::default()
        });
        let now = Instant::now();
        assert!(matches!(
            c.handle_delivery(inbound("p", 1, 2), now),
            Step::Hold
        ));
        assert_eq!(c.stats().refused, 1);
        assert_eq!(run_seq(&mut c, inbound("p", 1, 1), now), Some(1));
        assert!(matches!(
            c.handle_delivery(inbound("p", 1, 2), now),
            Step::Hold
        ));
        assert!(matches!(
            c.handle_delivery(inbound("p", 1, 4), now),
            Step::Hold
        ));
        assert!(matches!(
            c.handle_delivery(inbound("p", 1, 3), now),
            Step::Hold
        ));
        assert_eq!(c.stats().refused, 2, "4 arrived before 3");
        assert_eq!(c.stats().waiting, 2);
        let mut order = vec![1];
        while let Some(info) = {
            let done = succeed(&mut c, now);
            next_of(&c, done)
        } {
            order.push(info.seq);
        }
        assert_eq!(order, [1, 2, 3]);
    }

    #[test]
    fn ordered_mode_drops_the_waiting_successors_of_a_failed_message() {
        let mut c = core(ConsumerConfig {
            ordered: true,
            ..Default::default()
        });
        let now = Instant::now();
        c.handle_delivery(inbound("p", 1, 1), now);
        c.handle_delivery(inbound("p", 1, 2), now);
        c.handle_delivery(inbound("q", 1, 1), now);
        let done = fail(&mut c, now);
        assert_eq!(
            next_of(&c, done).map(|info| info.producer_id),
            Some("q".into())
        );
        assert_eq!(c.stats().refused, 1, "p's seq 2 must not overtake seq 1");
        assert!(matches!(
            c.handle_delivery(inbound("p", 1, 2), now),
            Step::Hold
        ));
        succeed(&mut c, now);
        assert_eq!(run_seq(&mut c, inbound("p", 1, 1), now), Some(1));
        assert!(matches!(
            c.handle_delivery(inbound("p", 1, 2), now),
            Step::Hold
        ));
        let done = succeed(&mut c, now);
        assert_eq!(next_of(&c, done).map(|info| info.seq), Some(2));
    }

    #[test]
    fn ordered_failure_after_eviction_still_drops_the_waiting_successors() {
        let mut c = core(ConsumerConfig {
            ordered: true,
            max_producers: Limit::At(1),
            ..Default::default()
        });
        let now = Instant::now();
        c.handle_delivery(inbound("p", 1, 1), now); // runs
        c.handle_delivery(inbound("p", 1, 2), now); // waits
        c.handle_delivery(inbound("q", 1, 1), now); // evicts p's window, waits
        let done = fail(&mut c, now);
        let next = next_of(&c, done).map(|info| info.producer_id);
        assert_eq!(
            next,
            Some("q".into()),
            "p's seq 2 must not overtake the failed seq 1"
        );
    }

    #[test]
    fn ordered_running_seq_below_the_window_does_not_let_a_later_seq_jump_the_gap() {
        let mut c = core(ConsumerConfig {
            ordered: true,
            ..Default::default()
        });
        let now = Instant::now();
        c.handle_delivery(inbound("p", 1, 1), now); // runs
                                                    // The producer settled seq 1 meanwhile (given up): window_start moves past it.
        let mut d = inbound("p", 1, 2);
        d.header.window_start = 2;
        assert!(
            matches!(c.handle_delivery(d, now), Step::Hold),
            "2 waits for the handler"
        );
        let mut d = inbound("p", 1, 4);
        d.header.window_start = 2;
        assert!(matches!(c.handle_delivery(d, now), Step::Hold));
        assert_eq!(c.stats().refused, 1, "4 must not be admitted before 3");
        succeed(&mut c, now);
        assert!(succeed(&mut c, now).next.is_none());
    }

    #[test]
    fn new_incarnation_gets_a_fresh_window_instead_of_being_absorbed_as_duplicates() {
        let mut c = core(ConsumerConfig::default());
        let now = Instant::now();
        for seq in 1..=3 {
            c.handle_delivery(inbound("p", 1, seq), now);
            succeed(&mut c, now);
        }
        assert_eq!(run_seq(&mut c, inbound("p", 2, 1), now), Some(1));
        assert_eq!(succeed(&mut c, now).ack, Some((7, ack("p", 2, 1))));
        let stats = c.stats();
        assert_eq!(
            (stats.tracked_producers, stats.tracked_incarnations),
            (1, 2)
        );
        // A straggler of incarnation 1 is still recognised, and resets nothing.
        assert!(matches!(
            c.handle_delivery(inbound("p", 1, 2), now),
            Step::Ack(..)
        ));
        assert!(matches!(
            c.handle_delivery(inbound("p", 2, 1), now),
            Step::Ack(..)
        ));
        assert_eq!(c.stats().replaced_incarnations, 0);
    }

    #[test]
    fn producers_have_separate_seq_spaces() {
        let mut c = core(ConsumerConfig::default());
        let now = Instant::now();
        c.handle_delivery(inbound("a", 1, 1), now);
        succeed(&mut c, now);
        assert_eq!(run_seq(&mut c, inbound("b", 1, 1), now), Some(1));
        assert_eq!(succeed(&mut c, now).ack, Some((7, ack("b", 1, 1))));
        assert_eq!(c.tracked_producers(), 2);
    }

    #[test]
    fn evicted_window_costs_a_duplicate_run_never_a_message_or_a_deadlock() {
        let mut c = core(ConsumerConfig {
            max_producers: Limit::At(1),
            max_out_of_order: Limit::At(4),
            ..Default::default()
        });
        let now = Instant::now();
        let mut d = inbound("p", 1, 1);
        c.handle_delivery(d, now);
        succeed(&mut c, now);
        c.handle_delivery(inbound("q", 1, 1), now);
        succeed(&mut c, now);
        assert_eq!(c.stats().evictions, 1);
        assert_eq!(c.out_of_order_for("p"), None);
        // p's ACK for 1 was lost: the retransmit runs the handler again (allowed duplicate).
        assert_eq!(run_seq(&mut c, inbound("p", 1, 1), now), Some(1));
        succeed(&mut c, now);
        // Later, p is far ahead. Its window_start tells the fresh window where to begin, so
        // even many more seqs than max_out_of_order are admitted.
        c.handle_delivery(inbound("q", 1, 2), now);
        succeed(&mut c, now);
        for seq in 50..60 {
            d = inbound("p", 1, seq);
            d.header.window_start = 50;
            assert_eq!(run_seq(&mut c, d, now), Some(seq), "seq {seq}");
            succeed(&mut c, now);
        }
    }

    #[test]
    fn messages_waiting_for_a_dropped_window_never_run_and_do_not_pile_up() {
        let mut c = core(ConsumerConfig {
            max_producers: Limit::At(1),
            ..Default::default()
        });
        let now = Instant::now();
        c.handle_delivery(inbound("busy", 1, 1), now); // runs (slowly)
        for _round in 0..10 {
            // Retransmissions while the handler runs: each evicts the other's window.
            c.handle_delivery(inbound("a", 1, 1), now);
            c.handle_delivery(inbound("b", 1, 1), now);
            assert!(c.stats().waiting <= 2, "waiting {}", c.stats().waiting);
        }
        let mut runs = Vec::new();
        while let Some(info) = {
            let done = succeed(&mut c, now);
            next_of(&c, done)
        } {
            runs.push(info.producer_id.to_string());
        }
        assert_eq!(
            runs,
            ["b"],
            "only the message whose window survived runs, once"
        );
    }

    #[test]
    fn incarnation_flips_while_the_handler_runs_keep_the_queue_bounded() {
        let mut c = core(ConsumerConfig::default());
        let now = Instant::now();
        c.handle_delivery(inbound("busy", 1, 1), now);
        for incarnation in 2..10_002 {
            c.handle_delivery(inbound("p", incarnation, 1), now);
        }
        let most = MAX_INCARNATIONS_PER_ID;
        assert!(
            c.waiting.len() <= 2 * most + 1,
            "queued {}",
            c.waiting.len()
        );
        assert!(c.stats().waiting <= most, "waiting {}", c.stats().waiting);
        let kept = MAX_INCARNATIONS_PER_ID as u64;
        assert_eq!(c.stats().replaced_incarnations, 10_000 - kept);
        assert_eq!(c.stats().tracked_incarnations, 1 + MAX_INCARNATIONS_PER_ID);
    }

    /// Delivers seq `seq` of producer `id` with `window_start`.
    fn at(id: &str, incarnation: u128, seq: u64, window_start: u64) -> Inbound<&'static str, u32> {
        let mut d = inbound(id, incarnation, seq);
        d.header.window_start = window_start;
        d
    }

    #[test]
    fn a_window_start_raised_by_one_per_delivery_keeps_the_waiting_queue_bounded() {
        let max = 4;
        let mut c = core(ConsumerConfig {
            max_out_of_order: Limit::At(max),
            ..Default::default()
        });
        let now = Instant::now();
        c.handle_delivery(inbound("busy", 1, 1), now); // runs and never finishes
        for seq in 1..=1_000 {
            c.handle_delivery(at("p", 1, seq, seq), now);
            let window = c.table.get("p").unwrap();
            assert!(window.out_of_order() + window.waiting() <= max, "seq {seq}");
            assert!(
                c.waiting.len() <= 3,
                "seq {seq}: {} queued",
                c.waiting.len()
            );
        }
        assert_eq!(c.stats().waiting, 1, "only seq 1000 may still run");
        assert_eq!(
            c.stats().stale,
            999,
            "every earlier one went stale, counted"
        );
        let done = succeed(&mut c, now);
        assert_eq!(next_of(&c, done).map(|h| h.seq), Some(1_000));
        assert!(succeed(&mut c, now).next.is_none());
    }

    #[test]
    fn messages_an_honest_producer_gave_up_while_they_waited_never_run() {
        let window = 8;
        let mut c = core(ConsumerConfig {
            max_out_of_order: Limit::At(window),
            ..Default::default()
        });
        let now = Instant::now();
        c.handle_delivery(inbound("stuck", 1, 1), now);
        // Each cycle: a window of 8 fresh seqs waits behind the stuck handler, then the
        // producer gives them up and its next window starts after them.
        for cycle in 0..1_000u64 {
            let first = cycle * window as u64 + 1;
            for seq in first..first + window as u64 {
                c.handle_delivery(at("p", 1, seq, first), now);
            }
            assert!(c.stats().waiting <= window, "cycle {cycle}");
            assert!(c.waiting.len() <= 2 * window + 1, "cycle {cycle}");
        }
        let mut ran = Vec::new();
        let mut done = succeed(&mut c, now);
        while let Some(header) = next_of(&c, done) {
            ran.push(header.seq);
            done = succeed(&mut c, now);
        }
        assert_eq!(
            ran,
            (7_993..=8_000).collect::<Vec<_>>(),
            "only the last window runs"
        );
    }

    #[test]
    fn a_forged_window_start_never_gets_unhandled_seqs_confirmed() {
        let mut c = core(ConsumerConfig::default());
        let now = Instant::now();
        for seq in 1..=10 {
            c.handle_delivery(inbound("p", 1, seq), now);
            succeed(&mut c, now);
        }
        // Someone holding the incarnation claims everything below 100 settled.
        assert_eq!(run_seq(&mut c, at("p", 1, 100, 100), now), Some(100));
        succeed(&mut c, now);
        // The producer's genuine retransmissions of 11..=13 are neither run nor ACKed.
        for seq in 11..=13 {
            assert!(matches!(
                c.handle_delivery(at("p", 1, seq, 11), now),
                Step::Hold
            ));
        }
        assert_eq!(c.stats().stale, 3);
        assert_eq!(c.stats().duplicates, 0, "nothing re-ACKed as handled");
        assert_eq!(c.stats().delivered, 11);
    }

    #[test]
    fn two_live_producers_sharing_an_id_are_deduplicated_and_warned_about() {
        let mut c = core(ConsumerConfig::default());
        let t0 = Instant::now();
        let mut runs = Vec::new();
        // Interleaved, every delivery twice (retransmissions after lost ACKs).
        for seq in 1..=40 {
            let now = t0 + Duration::from_millis(500 * seq);
            for incarnation in [1, 2, 1, 2] {
                if let Step::Run(_) = c.handle_delivery(inbound("same", incarnation, seq), now) {
                    runs.push((incarnation, seq));
                    succeed(&mut c, now);
                }
            }
        }
        assert_eq!(runs.len(), 80, "each incarnation's seq runs once");
        let stats = c.stats();
        assert_eq!(stats.duplicates, 80);
        assert_eq!(stats.tracked_incarnations, 2);
        // Both incarnations admit new messages, seq n at n × 0.5 s (incarnation 1's activity is
        // tracked from seq 2, once the id has two windows). Once they overlap by 10 s, every
        // new message counts: incarnation 2 from seq 22, 1 from seq 23 (19 + 18).
        assert_eq!(stats.shared_id_messages, 37);
    }

    #[test]
    fn a_stuck_handler_is_abandoned_after_handler_timeout_and_retried() {
        let timeout = Duration::from_secs(30);
        let mut c = core(ConsumerConfig {
            handler_timeout: Limit::At(timeout),
            producer_idle_ttl: Limit::Unbounded,
            ..Default::default()
        });
        let t0 = Instant::now();
        assert_eq!(run_seq(&mut c, inbound("p", 1, 1), t0), Some(1));
        let t1 = t0 + Duration::from_secs(1);
        c.handle_delivery(inbound("q", 1, 1), t1); // waits
        assert_eq!(c.next_deadline(), Some(t0 + timeout));
        assert!(c
            .handle_timeout(t0 + timeout - Duration::from_millis(1))
            .is_none());
        let done = c
            .handle_timeout(t0 + timeout)
            .expect("the run is abandoned");
        assert!(done.ack.is_none(), "no ACK for an abandoned run");
        assert_eq!(next_of(&c, done).map(|h| h.producer_id), Some("q".into()));
        assert_eq!(
            c.next_deadline(),
            Some(t0 + 2 * timeout),
            "q's run has its own"
        );
        assert_eq!(c.stats().handler_timeouts, 1);
        succeed(&mut c, t0 + timeout);
        // The producer retransmits seq 1: it runs again, and this time succeeds.
        assert_eq!(run_seq(&mut c, inbound("p", 1, 1), t0 + timeout), Some(1));
        assert_eq!(succeed(&mut c, t0 + timeout).ack, Some((7, ack("p", 1, 1))));
    }

    #[test]
    fn without_handler_timeout_a_slow_handler_is_never_abandoned() {
        let mut c = core(ConsumerConfig {
            handler_timeout: Limit::Unbounded,
            producer_idle_ttl: Limit::Unbounded,
            ..Default::default()
        });
        let t0 = Instant::now();
        c.handle_delivery(inbound("p", 1, 1), t0);
        assert_eq!(c.next_deadline(), None);
        assert!(c
            .handle_timeout(t0 + Duration::from_secs(1 << 30))
            .is_none());
        assert!(c.is_running());
    }

    #[test]
    fn completion_for_an_evicted_window_still_acks() {
        let mut c = core(ConsumerConfig {
            max_producers: Limit::At(1),
            ..Default::default()
        });
        let now = Instant::now();
        c.handle_delivery(inbound("p", 1, 1), now);
        c.handle_delivery(inbound("q", 1, 1), now); // evicts p while p's handler runs
        assert_eq!(succeed(&mut c, now).ack, Some((7, ack("p", 1, 1))));
        assert_eq!(succeed(&mut c, now).ack, Some((7, ack("q", 1, 1))));
    }

    #[test]
    fn idle_sweep_follows_next_deadline() {
        let ttl = Duration::from_secs(30);
        let mut c = core(ConsumerConfig {
            producer_idle_ttl: Limit::At(ttl),
            ..Default::default()
        });
        let t0 = Instant::now();
        assert_eq!(c.next_deadline(), None);
        c.handle_delivery(inbound("p", 1, 1), t0);
        succeed(&mut c, t0);
        assert_eq!(c.next_deadline(), Some(t0 + ttl));
        assert!(c.handle_timeout(t0 + ttl).is_none(), "no handler ran long");
        assert_eq!((c.tracked_producers(), c.stats().swept), (0, 1));
        assert_eq!(c.next_deadline(), None);
    }

    #[test]
    fn clear_forgets_everything() {
        let mut c = core(ConsumerConfig::default());
        let now = Instant::now();
        c.handle_delivery(inbound("p", 1, 1), now);
        c.handle_delivery(inbound("p", 1, 2), now);
        c.clear();
        assert_eq!((c.tracked_producers(), c.stats().waiting), (0, 0));
        assert!(!c.is_running());
        assert_eq!(run_seq(&mut c, inbound("p", 1, 1), now), Some(1));
    }

    fn defer(c: &mut Core, now: Instant) -> (u64, Option<Header>) {
        let done = c.handle_outcome(&HandlerOutcome::Deferred, now);
        let id = done.deferred.expect("deferred");
        (id, next_of(c, done))
    }

    #[test]
    fn a_pipelined_handler_lets_the_next_message_run_and_acks_when_its_outcome_comes() {
        let mut c = core(ConsumerConfig::default());
        let now = Instant::now();
        c.handle_delivery(inbound("p", 1, 1), now);
        c.handle_delivery(inbound("p", 1, 2), now);
        let (first, next) = defer(&mut c, now);
        assert_eq!(next.map(|h| h.seq), Some(2), "2 runs before 1's outcome");
        let (second, _) = defer(&mut c, now);
        assert_eq!(c.stats().deferred, 2);
        // A retransmission of a deferred seq neither runs nor is re-ACKed.
        assert!(matches!(
            c.handle_delivery(inbound("p", 1, 1), now),
            Step::Hold
        ));
        assert_eq!(c.stats().in_progress, 1);
        // Outcomes in any order: 2 succeeds, 1 fails.
        let ack = c.handle_deferred(second, &HandlerOutcome::Succeeded, now);
        assert_eq!(ack, Some((7, self::ack("p", 1, 2))));
        assert!(c
            .handle_deferred(first, &HandlerOutcome::Failed("no".into()), now)
            .is_none());
        assert!(
            c.handle_deferred(first, &HandlerOutcome::Succeeded, now)
                .is_none(),
            "once"
        );
        // 1 runs again when retransmitted; 2 is a duplicate.
        assert_eq!(run_seq(&mut c, inbound("p", 1, 1), now), Some(1));
        assert!(matches!(
            c.handle_delivery(inbound("p", 1, 2), now),
            Step::Ack(..)
        ));
        let stats = c.stats();
        assert_eq!(
            (stats.delivered, stats.handler_failures, stats.deferred),
            (1, 1, 0)
        );
    }

    #[test]
    fn deferred_messages_count_against_the_out_of_order_bound() {
        let mut c = core(ConsumerConfig {
            max_out_of_order: Limit::At(2),
            ..Default::default()
        });
        let now = Instant::now();
        c.handle_delivery(inbound("p", 1, 1), now);
        defer(&mut c, now);
        c.handle_delivery(inbound("p", 1, 3), now);
        defer(&mut c, now);
        assert!(matches!(
            c.handle_delivery(inbound("p", 1, 4), now),
            Step::Hold
        ));
        assert_eq!(c.stats().refused, 1, "1 and 3 are retained");
    }

    #[test]
    fn a_deferred_outcome_that_never_comes_is_abandoned_after_handler_timeout() {
        let timeout = Duration::from_secs(30);
        let mut c = core(ConsumerConfig {
            handler_timeout: Limit::At(timeout),
            producer_idle_ttl: Limit::Unbounded,
            ..Default::default()
        });
        let t0 = Instant::now();
        c.handle_delivery(inbound("p", 1, 1), t0);
        let (id, _) = defer(&mut c, t0);
        assert_eq!(c.next_deadline(), Some(t0 + timeout));
        assert!(
            c.handle_timeout(t0 + timeout).is_none(),
            "nothing was running"
        );
        assert_eq!(c.poll_expired(), Some(id));
        assert_eq!(c.poll_expired(), None);
        assert!(c
            .handle_deferred(id, &HandlerOutcome::Succeeded, t0 + timeout)
            .is_none());
        assert_eq!(c.next_deadline(), None);
        assert_eq!(c.stats().handler_timeouts, 1);
        assert_eq!(
            run_seq(&mut c, inbound("p", 1, 1), t0 + timeout),
            Some(1),
            "retried"
        );
    }

    #[test]
    fn ordered_a_dropped_windows_running_message_is_no_predecessor_in_a_fresh_window() {
        // Found by the simulator: a forger's seq 16 of p runs; q evicts p's window, p's real
        // seq 2 then makes a fresh window. Seq 1 never ran: 2 must not be admitted.
        let mut c = core(ConsumerConfig {
            ordered: true,
            max_producers: Limit::At(1),
            ..Default::default()
        });
        let now = Instant::now();
        let mut forged = inbound("p", 1, 16);
        forged.header.window_start = 16;
        assert_eq!(run_seq(&mut c, forged, now), Some(16));
        assert!(matches!(
            c.handle_delivery(inbound("q", 9, 1), now),
            Step::Hold
        ));
        assert!(matches!(
            c.handle_delivery(inbound("p", 1, 2), now),
            Step::Hold
        ));
        let done = succeed(&mut c, now);
        assert_eq!(
            next_of(&c, done).map(|h| h.producer_id),
            None,
            "q's window was evicted by p's: only p's seq 2 could run, and it must not"
        );
        assert_eq!(
            c.stats().refused,
            2,
            "p's 2 refused at arrival, q's dropped with its window"
        );
    }
}
