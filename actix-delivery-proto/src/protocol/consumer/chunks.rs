//! The consumer's side of chunking: a chunk of a large message judged by its message (its
//! last seq is the message's identity, its first seq its place in the window), buffered until
//! the message is whole, then run like any message. See [`chunk`](crate::protocol::chunk) for
//! the rules.

use std::time::Instant;

use bytes::Bytes;

use crate::protocol::chunk::reassembly::Inserted;
use crate::protocol::chunk::{self, Assembled, ChunkFault, ChunkHeader};
use crate::protocol::consumer::{
    admissible, admitted, count_lookup, in_hand, running_of, ConsumerCore, Inbound, Running, Step,
    Waiting,
};
use crate::protocol::dedup::WindowRef;
use crate::protocol::envelope::{Ack, DeadLetterReason, Header};

/// What to do about one chunk of a large message ([`ConsumerCore::handle_chunk`]).
#[derive(Debug)]
pub struct ChunkStep<B, R> {
    /// The chunk's ACK: it is buffered (or its message is in hand, or handled). The last
    /// chunk of a message is ACKed only after the handler succeeded on the whole message.
    pub ack: Option<(R, Ack)>,
    /// What its message asks for: [`Step::Run`] when this chunk completed it and it runs now,
    /// [`Step::DeadLetter`] for a chunk (or reassembled message) that can never be handled,
    /// otherwise [`Step::Hold`].
    pub step: Step<B, R>,
}

impl<B, R> ChunkStep<B, R> {
    fn hold() -> Self {
        Self::from(Step::Hold)
    }

    fn ack(reply_to: R, ack: Ack) -> Self {
        Self {
            ack: Some((reply_to, ack)),
            step: Step::Hold,
        }
    }
}

impl<B, R> From<Step<B, R>> for ChunkStep<B, R> {
    fn from(step: Step<B, R>) -> Self {
        Self { ack: None, step }
    }
}

impl<B, R> ConsumerCore<B, R> {
    /// Admission, dedup and reassembly for one chunk of a large message (its header's
    /// `chunk` says where it sits; see [`chunk`] for the rules). The
    /// chunk is checked, then judged by its message (its last seq is the message's identity,
    /// its first seq its place in the window): a chunk of a handled message is ACKed again, of
    /// a message in hand ACKed (the last chunk held: its ACK follows the handler), of a new
    /// message buffered (and ACKed, unless it is the last chunk). The chunk that completes a
    /// message is admitted like a delivery first (out-of-order bound, ordered mode); then the
    /// message is handed to `decode` and runs or waits like any message, with `seq` its last
    /// chunk's. A message that does not decode is a dead letter.
    pub fn handle_chunk(
        &mut self,
        inbound: Inbound<Bytes, R>,
        decode: impl FnOnce(Assembled) -> Result<B, DeadLetterReason>,
        now: Instant,
    ) -> ChunkStep<B, R>
    where
        R: Clone,
    {
        self.purge_orphans();
        let Inbound {
            header,
            body: bytes,
            reply_to,
        } = inbound;
        let reply_to = match admitted(&header, reply_to) {
            Ok(reply_to) => reply_to,
            Err(reason) => return self.dead_letter(reason, header, now).into(),
        };
        let checked = header
            .chunk
            .ok_or(DeadLetterReason::InvalidChunk(ChunkFault::NoChunks));
        let max_held = self.chunks.max_bytes();
        let checked = checked.and_then(|c| {
            chunk::check(&header, &c, bytes.len(), self.max_message_bytes, max_held).map(|()| c)
        });
        let chunk = match checked {
            Ok(chunk) => chunk,
            Err(reason) => return self.dead_letter(reason, header, now).into(),
        };
        let step = self.decide_chunk(header, chunk, bytes, reply_to, decode, now);
        self.collect_orphans();
        step
    }

    /// Dedup and reassembly for an admitted chunk (`chunk` its checked chunk header).
    fn decide_chunk(
        &mut self,
        header: Header,
        chunk: ChunkHeader,
        bytes: Bytes,
        reply_to: R,
        decode: impl FnOnce(Assembled) -> Result<B, DeadLetterReason>,
        now: Instant,
    ) -> ChunkStep<B, R>
    where
        R: Clone,
    {
        let (seq, first, last) = (header.seq, chunk.first_seq, chunk.last_seq());
        let (window, at, lookup) = self.table.window_for(
            &header.producer_id,
            header.incarnation,
            header.window_start,
            now,
        );
        count_lookup(&mut self.stats, &mut self.warnings, lookup, now);
        let key = at.producer_slot();
        self.chunks.drop_settled(key, at, window.floor());
        if window.is_stale(first) {
            self.stats.stale += 1;
            return ChunkStep::hold();
        }
        let ack = Ack {
            producer_id: header.producer_id.clone(),
            incarnation: header.incarnation,
            seq,
        };
        if window.is_handled(last) {
            self.stats.duplicates += 1;
            return ChunkStep::ack(reply_to, ack);
        }
        let running = running_of(&self.running, &header);
        if in_hand(window, running, last) {
            // The last chunk's ACK follows the handler.
            self.stats.in_progress += 1;
            return if seq == last {
                ChunkStep::hold()
            } else {
                ChunkStep::ack(reply_to, ack)
            };
        }
        let index = u32::try_from(seq - first).expect("checked: one of its message's chunks");
        if self.chunks.completes(key, at, &chunk, index)
            && !admissible(
                window,
                at,
                running,
                first,
                self.ordered,
                self.max_out_of_order,
            )
        {
            self.refuse(now);
            return ChunkStep::hold();
        }
        let table = &mut self.table;
        let inserted = self
            .chunks
            .insert(key, at, chunk, index, bytes, now, |owner| {
                table.is_live(*owner)
            });
        let buffered = || {
            if seq == last {
                ChunkStep::hold()
            } else {
                ChunkStep::ack(reply_to.clone(), ack.clone())
            }
        };
        match inserted {
            Inserted::Buffered | Inserted::Duplicate => buffered(),
            Inserted::Refused => ChunkStep::hold(),
            Inserted::Conflicting => {
                let conflicting = DeadLetterReason::InvalidChunk(ChunkFault::Conflicting);
                self.dead_letter(conflicting, header, now).into()
            }
            Inserted::Completed { message, charge } => {
                let chunk_ack = (seq != last).then(|| (reply_to.clone(), ack));
                let header = Header {
                    seq: last,
                    ..header
                };
                let step = match decode(message) {
                    Ok(body) => self.start_or_wait(header, body, reply_to, at, charge, now),
                    Err(reason) => {
                        self.chunks.release(charge);
                        self.dead_letter(reason, header, now)
                    }
                };
                ChunkStep {
                    ack: chunk_ack,
                    step,
                }
            }
        }
    }

    /// A reassembled message (`header.seq` its last chunk's) runs now or waits for the
    /// running handler, holding `charge` of the reassembly bound until it runs.
    fn start_or_wait(
        &mut self,
        header: Header,
        body: B,
        reply_to: R,
        at: WindowRef,
        charge: u64,
        now: Instant,
    ) -> Step<B, R> {
        let seq = header.seq;
        let step = if self.running.is_none() {
            self.chunks.release(charge);
            self.running = Some(Running {
                header,
                reply_to,
                window: at,
                started: now,
            });
            Step::Run(body)
        } else {
            if let Some(window) = self.table.window(at) {
                window.begin_waiting(seq);
            }
            self.waiting.push_back(Waiting {
                header,
                body,
                reply_to,
                window: at,
                charge,
            });
            Step::Hold
        };
        if let Some(window) = self.table.window(at) {
            window.note_admitted_through(seq);
        }
        self.note_admitted(at, now);
        step
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::time::Duration;

    use super::*;
    use crate::config::{ConsumerConfig, Limit, ProducerConfig};
    use crate::protocol::chunk::producer::ChunkedProducer;
    use crate::protocol::chunk::reassembly::MIN_PART_CHARGE;
    use crate::protocol::chunk::{split, ChunkHeader};
    use crate::protocol::consumer::{ConsumerStats, HandlerOutcome};
    use crate::protocol::envelope::{DeliveryInfo, Incarnation, ProducerId};

    /// Bodies are the reassembled bytes, reply addresses numbers.
    type Core = ConsumerCore<Vec<u8>, u32>;

    fn core(config: ConsumerConfig) -> Core {
        ConsumerCore::new(&config)
    }

    /// Seq `seq` of the message of `parts` starting at `first`, from producer `id`.
    fn chunk_in(
        id: &str,
        incarnation: u128,
        first: u64,
        parts: &[&'static [u8]],
        seq: u64,
        window_start: u64,
    ) -> Inbound<Bytes, u32> {
        let header = ChunkHeader {
            first_seq: first,
            chunks: parts.len() as u32,
            message_len: parts.iter().map(|p| p.len() as u64).sum(),
        };
        Inbound {
            header: Header {
                producer_id: ProducerId::from(id),
                incarnation: Incarnation::from_u128(incarnation),
                seq,
                window_start,
                trace_context: None,
                chunk: Some(header),
            },
            body: Bytes::from_static(parts[(seq - first) as usize]),
            reply_to: Some(7),
        }
    }

    /// The message "aa" "bb" "c" from seq `first` of producer p.
    fn abc(first: u64, seq: u64) -> Inbound<Bytes, u32> {
        chunk_in("p", 1, first, &[b"aa", b"bb", b"c"], seq, first)
    }

    fn read_all(mut message: Assembled) -> Result<Vec<u8>, DeadLetterReason> {
        let mut out = Vec::new();
        message.read_to_end(&mut out).expect("in memory");
        Ok(out)
    }

    fn offer(c: &mut Core, inbound: Inbound<Bytes, u32>, now: Instant) -> ChunkStep<Vec<u8>, u32> {
        c.handle_chunk(inbound, read_all, now)
    }

    /// The seq the chunk's ACK names, if it is ACKed now.
    fn acked(step: &ChunkStep<Vec<u8>, u32>) -> Option<u64> {
        step.ack.as_ref().map(|(_, ack)| ack.seq)
    }

    fn ran(step: ChunkStep<Vec<u8>, u32>) -> Option<Vec<u8>> {
        match step.step {
            Step::Run(body) => Some(body),
            _ => None,
        }
    }

    fn succeed(c: &mut Core, now: Instant) -> Option<u64> {
        let done = c.handle_outcome(&HandlerOutcome::Succeeded, now);
        done.ack.map(|(_, ack)| ack.seq)
    }

    fn stats(c: &Core) -> ConsumerStats {
        c.stats()
    }

    /// Partial messages held, partial messages dropped, reassembly bytes held.
    fn partials(c: &Core) -> (usize, u64, u64) {
        let s = c.stats();
        (
            s.partial_messages,
            s.partial_messages_dropped,
            s.reassembly_bytes,
        )
    }

    #[test]
    fn chunks_are_acked_as_buffered_and_the_last_only_after_the_handler_ran_once_on_the_whole() {
        let mut c = core(ConsumerConfig::default());
        let now = Instant::now();
        let second = offer(&mut c, abc(1, 2), now);
        assert_eq!((acked(&second), second.step.is_hold()), (Some(2), true));
        assert_eq!(acked(&offer(&mut c, abc(1, 1), now)), Some(1));
        assert_eq!(
            acked(&offer(&mut c, abc(1, 2), now)),
            Some(2),
            "a duplicate"
        );
        let last = offer(&mut c, abc(1, 3), now);
        assert_eq!(acked(&last), None, "the last chunk waits for the handler");
        assert_eq!(ran(last).as_deref(), Some(&b"aabbc"[..]));
        let running = c.running().expect("it runs").clone();
        assert_eq!(running.seq, 3, "the message's seq is its last chunk's");
        assert_eq!(DeliveryInfo::from(&running).seqs(), 1..=3);
        assert_eq!(
            succeed(&mut c, now),
            Some(3),
            "its ACK confirms the message"
        );
        assert_eq!(
            c.out_of_order_for("p"),
            Some(0),
            "the whole range is marked"
        );
        let again = offer(&mut c, abc(1, 1), now);
        assert_eq!((acked(&again), stats(&c).duplicates), (Some(1), 1));
        let s = stats(&c);
        assert_eq!(
            (
                s.assembled,
                s.delivered,
                s.partial_messages,
                s.reassembly_bytes
            ),
            (1, 1, 0, 0)
        );
    }

    #[test]
    fn a_message_in_hand_gets_its_chunks_acked_and_holds_its_bytes_until_it_runs() {
        let mut c = core(ConsumerConfig::default());
        let now = Instant::now();
        for seq in 1..=3 {
            offer(&mut c, abc(1, seq), now);
        }
        for seq in 4..=6 {
            offer(
                &mut c,
                chunk_in("p", 1, 4, &[b"dd", b"ee", b"f"], seq, 1),
                now,
            );
        }
        assert_eq!(
            stats(&c).waiting,
            1,
            "the second message waits for the first"
        );
        assert_eq!(
            stats(&c).reassembly_bytes,
            3 * MIN_PART_CHARGE,
            "and holds its charge (three tiny chunks)"
        );
        let resent = offer(
            &mut c,
            chunk_in("p", 1, 4, &[b"dd", b"ee", b"f"], 5, 1),
            now,
        );
        assert_eq!(
            acked(&resent),
            Some(5),
            "a chunk of a waiting message is ACKed"
        );
        let last = offer(
            &mut c,
            chunk_in("p", 1, 4, &[b"dd", b"ee", b"f"], 6, 1),
            now,
        );
        assert!(
            last.ack.is_none() && last.step.is_hold(),
            "its last chunk is held"
        );
        let resent = offer(&mut c, abc(1, 3), now);
        assert!(
            resent.ack.is_none(),
            "nor is the running message's last chunk ACKed"
        );
        assert_eq!(stats(&c).in_progress, 3);
        let done = c.handle_outcome(&HandlerOutcome::Succeeded, now);
        assert_eq!(done.next.as_deref(), Some(&b"ddeef"[..]));
        assert_eq!(stats(&c).reassembly_bytes, 0, "released when it runs");
        assert_eq!(succeed(&mut c, now), Some(6));
    }

    #[test]
    fn a_failed_run_or_a_lost_consumer_state_is_recovered_by_a_round_of_the_chunks() {
        let mut c = core(ConsumerConfig::default());
        let now = Instant::now();
        for seq in 1..=3 {
            offer(&mut c, abc(1, seq), now);
        }
        let failed = c.handle_outcome(&HandlerOutcome::Failed("boom".into()), now);
        assert!(failed.ack.is_none());
        // The producer's last chunk goes unconfirmed: it sends every chunk again.
        assert!(
            ran(offer(&mut c, abc(1, 3), now)).is_none(),
            "not on a part"
        );
        assert_eq!(acked(&offer(&mut c, abc(1, 1), now)), Some(1));
        assert_eq!(
            ran(offer(&mut c, abc(1, 2), now)).as_deref(),
            Some(&b"aabbc"[..])
        );
        // A consumer that lost everything (a restart) admits the round likewise.
        c.clear();
        offer(&mut c, abc(1, 2), now);
        offer(&mut c, abc(1, 3), now);
        assert_eq!(
            ran(offer(&mut c, abc(1, 1), now)).as_deref(),
            Some(&b"aabbc"[..])
        );
    }

    #[test]
    fn impossible_chunks_and_messages_over_max_message_bytes_are_dead_letters() {
        let mut c = core(ConsumerConfig {
            max_message_bytes: 4,
            max_reassembly_bytes: 4,
            ..Default::default()
        });
        let now = Instant::now();
        let too_large = offer(&mut c, abc(1, 1), now);
        assert!(matches!(
            too_large.step,
            Step::DeadLetter(DeadLetterReason::MessageTooLarge { len: 5, max: 4 }, _)
        ));
        let mut outside = chunk_in("p", 1, 1, &[b"a", b"b"], 2, 1);
        outside.header.seq = 3;
        let outside = offer(&mut c, outside, now);
        assert!(matches!(
            outside.step,
            Step::DeadLetter(
                DeadLetterReason::InvalidChunk(ChunkFault::OutsideMessage),
                _
            )
        ));
        assert!(outside.ack.is_none());
        assert_eq!(
            (stats(&c).dead_letters, stats(&c).tracked_producers),
            (2, 0)
        );
    }

    #[test]
    fn a_chunk_that_contradicts_its_message_is_a_dead_letter_and_drops_the_partial_message() {
        let mut c = core(ConsumerConfig::default());
        let now = Instant::now();
        offer(&mut c, abc(1, 1), now);
        let other = offer(
            &mut c,
            chunk_in("p", 1, 1, &[b"aa", b"bbbb", b"c"], 2, 1),
            now,
        );
        assert!(matches!(
            other.step,
            Step::DeadLetter(DeadLetterReason::InvalidChunk(ChunkFault::Conflicting), _)
        ));
        assert_eq!(partials(&c), (0, 1, 0));
    }

    #[test]
    fn a_message_that_does_not_decode_is_a_dead_letter_without_an_ack_for_its_last_chunk() {
        let mut c = core(ConsumerConfig::default());
        let now = Instant::now();
        offer(&mut c, abc(1, 1), now);
        offer(&mut c, abc(1, 3), now);
        let step = c.handle_chunk(abc(1, 2), |_| Err(DeadLetterReason::UndecodableBody), now);
        assert_eq!(acked(&step), Some(2), "the middle chunk was received");
        match step.step {
            Step::DeadLetter(DeadLetterReason::UndecodableBody, header) => {
                assert_eq!(header.seq, 3, "named by the message's seq");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(stats(&c).reassembly_bytes, 0);
        assert!(!c.is_running());
    }

    #[test]
    fn chunks_of_a_message_its_producer_settled_are_stale_and_its_partial_message_dropped() {
        let mut c = core(ConsumerConfig::default());
        let now = Instant::now();
        offer(&mut c, abc(1, 1), now);
        // The producer gave message 1..=3 up: its next message says so.
        offer(&mut c, chunk_in("p", 1, 4, &[b"d", b"e"], 4, 4), now);
        let late = offer(&mut c, abc(1, 2), now);
        assert!(late.ack.is_none() && late.step.is_hold());
        let s = stats(&c);
        assert_eq!(
            (s.stale, s.partial_messages, s.partial_messages_dropped),
            (1, 1, 1)
        );
    }

    #[test]
    fn ordered_mode_pipelines_chunked_messages_in_order_and_refuses_a_completion_ahead() {
        let mut c = core(ConsumerConfig {
            ordered: true,
            ..Default::default()
        });
        let now = Instant::now();
        let second = |seq| chunk_in("p", 1, 3, &[b"c", b"d"], seq, 1);
        assert_eq!(acked(&offer(&mut c, second(3), now)), Some(3));
        let ahead = offer(&mut c, second(4), now);
        assert!(
            ahead.ack.is_none() && ahead.step.is_hold(),
            "refused, not buffered"
        );
        assert_eq!(stats(&c).refused, 1);
        offer(&mut c, chunk_in("p", 1, 1, &[b"a", b"b"], 1, 1), now);
        let first = offer(&mut c, chunk_in("p", 1, 1, &[b"a", b"b"], 2, 1), now);
        assert_eq!(ran(first).as_deref(), Some(&b"ab"[..]));
        assert!(offer(&mut c, second(3), now).ack.is_some());
        let next = offer(&mut c, second(4), now);
        assert!(
            next.step.is_hold() && stats(&c).waiting == 1,
            "pipelined behind the first"
        );
        let done = c.handle_outcome(&HandlerOutcome::Succeeded, now);
        assert_eq!(done.next.as_deref(), Some(&b"cd"[..]));
    }

    #[test]
    fn an_out_of_order_message_marks_its_whole_range_above_the_mark_until_the_gap_closes() {
        let mut c = core(ConsumerConfig::default());
        let now = Instant::now();
        offer(&mut c, chunk_in("p", 1, 3, &[b"c", b"d"], 3, 1), now);
        assert!(ran(offer(&mut c, chunk_in("p", 1, 3, &[b"c", b"d"], 4, 1), now)).is_some());
        assert_eq!(succeed(&mut c, now), Some(4));
        assert_eq!(c.out_of_order_for("p"), Some(2));
        offer(&mut c, chunk_in("p", 1, 1, &[b"a", b"b"], 1, 1), now);
        offer(&mut c, chunk_in("p", 1, 1, &[b"a", b"b"], 2, 1), now);
        assert_eq!(succeed(&mut c, now), Some(2));
        assert_eq!(
            c.out_of_order_for("p"),
            Some(0),
            "contiguous passed every chunk seq"
        );
    }

    #[test]
    fn a_new_incarnation_of_a_producer_drops_the_partial_messages_of_its_earlier_life() {
        let mut c = core(ConsumerConfig::default());
        let now = Instant::now();
        offer(&mut c, abc(1, 1), now);
        offer(&mut c, chunk_in("p", 2, 1, &[b"x", b"y"], 1, 1), now);
        let s = stats(&c);
        assert_eq!((s.partial_messages, s.partial_messages_dropped), (1, 1));
    }

    #[test]
    fn reassembly_is_bounded_in_bytes_and_what_does_not_fit_is_refused_and_counted() {
        let mut c = core(ConsumerConfig {
            max_message_bytes: 256,
            max_reassembly_bytes: 300,
            ..Default::default()
        });
        let now = Instant::now();
        let big: &'static [u8] = &[1; 200];
        offer(
            &mut c,
            chunk_in("p", 1, 1, &[big, big[..50].as_ref()], 1, 1),
            now,
        );
        let refused = offer(&mut c, chunk_in("q", 1, 1, &[big, b"z"], 1, 1), now);
        assert!(refused.ack.is_none() && refused.step.is_hold());
        let s = stats(&c);
        assert_eq!(
            (
                s.chunks_refused,
                s.reassembly_bytes,
                s.partial_messages,
                s.messages_waiting_for_room
            ),
            (1, 2 * MIN_PART_CHARGE, 1, 1),
            "p's whole message is reserved (250 bytes, at least 128 a chunk); q's waits"
        );
    }

    #[test]
    fn a_partial_message_is_dropped_at_the_end_of_its_lifetime_whatever_arrives_meanwhile() {
        let mut c = core(ConsumerConfig {
            producer_idle_ttl: Limit::Unbounded,
            reassembly_grace: Duration::from_secs(2),
            min_reassembly_rate: 1,
            ..Default::default()
        });
        let t0 = Instant::now();
        offer(&mut c, abc(1, 1), t0);
        let end = t0 + Duration::from_secs(2 + 5); // 5 bytes at one a second
        assert_eq!(c.next_deadline(), Some(end));
        offer(&mut c, abc(1, 3), end - Duration::from_millis(1));
        assert_eq!(c.next_deadline(), Some(end), "not extended");
        c.handle_timeout(end);
        assert_eq!(partials(&c), (0, 1, 0));
        assert_eq!(c.next_deadline(), None);
    }

    #[test]
    fn a_flood_of_first_chunks_keeps_one_partial_message_per_producer_within_the_bound() {
        let mut c = core(ConsumerConfig {
            max_message_bytes: 1 << 20,
            max_reassembly_bytes: 1 << 20,
            ..Default::default()
        });
        let now = Instant::now();
        let big: &'static [u8] = &[7; 4096];
        // Thousands of messages started and never finished, by two producers, newest first
        // and oldest first.
        for n in 0..2000u64 {
            let (first, id) = if n % 2 == 0 {
                (1 + 2 * (2000 - n), "down")
            } else {
                (1 + 2 * n, "up")
            };
            let chunk = chunk_in(id, 1, first, &[big, big], first, 1);
            let step = offer(&mut c, chunk, now);
            assert!(step.step.is_hold(), "no message runs on one chunk");
            let s = stats(&c);
            assert!(s.partial_messages <= 2, "one per producer: {s:?}");
            assert!(s.reassembly_bytes <= 2 * 8192, "{s:?}");
        }
        let s = stats(&c);
        assert_eq!((s.assembled, s.delivered), (0, 0));
        assert!(
            s.partial_messages_dropped > 900,
            "the oldest kept, the rest dropped: {s:?}"
        );
        assert!(s.chunks_refused > 900, "newer ones refused: {s:?}");
    }

    /// The siege of issue 32: `ATTACKERS` forged producer ids each start a message of
    /// `ATTACK_LEN` bytes (announced in `ATTACK_CHUNKS` chunks) with a first chunk of 126 KiB,
    /// together filling `SIEGE_BOUND` of `max_reassembly_bytes`, and never finish it; in the
    /// trickle each adds a one-byte chunk every `TRICKLE`, in the burst they fall silent.
    /// Honest producers send through their own cores (chunks of 16 KiB, a window of 16,
    /// `resend_timeout` 500 ms) meanwhile; time is virtual.
    struct Siege {
        core: Core,
        now: Instant,
        trickle: Option<Instant>,
        /// The chunk each attacker sends next.
        next_index: u32,
        honest: Vec<Honest>,
        /// The most `reassembly_bytes` ever were.
        most_held: u64,
    }

    /// An honest producer of the siege, and when its message was confirmed.
    struct Honest {
        producer: ChunkedProducer<()>,
        sent: Instant,
        confirmed: Option<Duration>,
    }

    const ATTACKERS: usize = 32;
    const SIEGE_BOUND: u64 = 4 << 20;
    const ATTACK_LEN: u64 = 128 << 10;
    const ATTACK_CHUNKS: u32 = 1024;
    const TRICKLE: Duration = Duration::from_millis(300);
    const RESEND: Duration = Duration::from_millis(500);

    /// Chunk `index` of attacker `attacker`'s message: `len` bytes.
    fn forged(attacker: usize, index: u32, len: usize) -> Inbound<Bytes, u32> {
        Inbound {
            header: Header {
                producer_id: ProducerId::from(format!("attacker-{attacker}").as_str()),
                incarnation: Incarnation::from_u128(7),
                seq: 1 + u64::from(index),
                window_start: 1,
                trace_context: None,
                chunk: Some(ChunkHeader {
                    first_seq: 1,
                    chunks: ATTACK_CHUNKS,
                    message_len: ATTACK_LEN,
                }),
            },
            body: Bytes::from(vec![0xa; len]),
            reply_to: Some(u32::MAX),
        }
    }

    impl Siege {
        fn new(trickle: bool) -> Self {
            let mut core = core(ConsumerConfig {
                max_message_bytes: 1 << 20,
                max_reassembly_bytes: SIEGE_BOUND,
                ..Default::default()
            });
            let start = Instant::now();
            for attacker in 0..ATTACKERS {
                let step = offer(&mut core, forged(attacker, 0, 126 << 10), start);
                assert_eq!(acked(&step), Some(1), "the attack is buffered");
            }
            let mut siege = Self {
                core,
                now: start,
                trickle: trickle.then_some(start + TRICKLE),
                next_index: 1,
                honest: Vec::new(),
                most_held: 0,
            };
            siege.note_held();
            siege
        }

        /// An honest producer sends a message of `len` bytes now.
        fn send(&mut self, id: &str, len: usize) {
            let config = ProducerConfig {
                producer_id: Some(id.into()),
                window_size: 16,
                resend_timeout: RESEND,
                ..Default::default()
            };
            let mut producer = ChunkedProducer::seeded(&config, Incarnation::from_u128(1), || 7);
            let message = Bytes::from(vec![0x5; len]);
            producer.handle_send(split(&message, 16 << 10), ()).unwrap();
            self.honest.push(Honest {
                producer,
                sent: self.now,
                confirmed: None,
            });
            self.exchange();
        }

        fn note_held(&mut self) {
            let held = self.core.stats().reassembly_bytes;
            assert!(held <= SIEGE_BOUND, "{held} bytes held");
            self.most_held = self.most_held.max(held);
        }

        /// Delivers what the honest producers transmit, and the ACKs back, until quiet.
        fn exchange(&mut self) {
            loop {
                let mut acks = Vec::new();
                for (to, honest) in self.honest.iter_mut().enumerate() {
                    while let Some(t) = honest.producer.poll_transmit(self.now) {
                        let inbound = Inbound {
                            header: t.header,
                            body: t.body,
                            reply_to: Some(to as u32),
                        };
                        let step = self.core.handle_chunk(inbound, read_all, self.now);
                        acks.extend(step.ack);
                        let mut running = matches!(step.step, Step::Run(_));
                        while running {
                            let done = self
                                .core
                                .handle_outcome(&HandlerOutcome::Succeeded, self.now);
                            acks.extend(done.ack);
                            running = done.next.is_some();
                        }
                    }
                }
                self.note_held();
                if acks.is_empty() {
                    return;
                }
                for (to, ack) in acks {
                    self.honest[to as usize].producer.handle_ack(&ack);
                }
                for honest in &mut self.honest {
                    while let Some(((), result)) = honest.producer.poll_settled() {
                        assert_eq!(result, Ok(()));
                        honest.confirmed = Some(self.now - honest.sent);
                    }
                }
            }
        }

        /// Runs the siege for `span` of virtual time: timers, the trickle, the exchange.
        fn run_for(&mut self, span: Duration) {
            let end = self.now + span;
            loop {
                let producers = self
                    .honest
                    .iter()
                    .filter_map(|h| h.producer.next_deadline());
                let next = [self.core.next_deadline(), self.trickle]
                    .into_iter()
                    .flatten()
                    .chain(producers)
                    .min()
                    .filter(|next| *next <= end);
                let Some(next) = next else {
                    self.now = end;
                    return;
                };
                self.now = self.now.max(next);
                let now = self.now;
                if self.core.next_deadline().is_some_and(|at| at <= now) {
                    self.core.handle_timeout(now);
                }
                if self.trickle.is_some_and(|at| at <= now) {
                    for attacker in 0..ATTACKERS {
                        offer(&mut self.core, forged(attacker, self.next_index, 1), now);
                    }
                    self.next_index += 1;
                    self.trickle = Some(now + TRICKLE);
                }
                for honest in &mut self.honest {
                    if honest.producer.next_deadline().is_some_and(|at| at <= now) {
                        honest.producer.handle_timeout(now);
                    }
                }
                self.note_held();
                self.exchange();
            }
        }
    }

    /// Partial messages, waiting ones, partial messages dropped, chunks refused.
    fn siege_counts(c: &Core) -> (usize, usize, u64, u64) {
        let s = stats(c);
        (
            s.partial_messages,
            s.messages_waiting_for_room,
            s.partial_messages_dropped,
            s.chunks_refused,
        )
    }

    /// An honest message within its share (100 KiB of the 4 MiB shared by 33 producers less
    /// the oldest's 128 KiB: 124 KiB) is buffered at once, whatever the attackers hold, and
    /// confirmed at once. One attacker's message gives way (the youngest of the largest). In
    /// the trickle the others are dropped at the end of their lifetime (5.125 s), the one
    /// that gave way 5.125 s after it was started again with its next chunk (1.2 s); in the
    /// burst it is never retransmitted and loses its place after the grace.
    #[test]
    fn a_patient_sender_keeps_no_honest_message_within_its_share_out() {
        // Partial messages held at the end, and dropped: by the honest one, at their lifetime.
        for (trickle, held, dropped) in [(true, 32, 1 + 32), (false, 0, 1 + 31)] {
            let mut siege = Siege::new(trickle);
            siege.run_for(Duration::from_secs(1));
            siege.send("honest", 100 << 10);
            assert_eq!(siege.honest[0].confirmed, Some(Duration::ZERO), "{trickle}");
            siege.run_for(Duration::from_secs(9));
            assert_eq!(
                siege_counts(&siege.core),
                (held, 0, dropped, 0),
                "trickle {trickle}: {:?}",
                stats(&siege.core)
            );
            assert_eq!(siege.most_held, SIEGE_BOUND, "never beyond it");
        }
    }

    /// An honest message beyond its share (1 MiB) waits until it is the oldest: the attackers'
    /// messages, seen before it, reach their lifetime 4.125 s after it was sent, and its next
    /// retransmission (every 500 ms) is buffered, whatever the attackers started since (the
    /// trickle restarts them at 5.4 s: they are younger, and the youngest 8 give way to its
    /// 1 MiB). Meanwhile its window of 16 chunks is refused 9 times. The documented bound: its
    /// wait is at most the attackers' lifetime and one retransmission interval.
    #[test]
    fn a_patient_sender_keeps_a_larger_honest_message_out_no_longer_than_its_partial_messages_live()
    {
        let lifetime = ConsumerConfig::default()
            .reassembly_lifetime()
            .of(ATTACK_LEN);
        assert_eq!(
            lifetime,
            Duration::from_millis(5125),
            "5 s, and 128 KiB at 1 MiB/s"
        );
        // Partial messages held at the end (the trickle started them again, and those that
        // gave way once more after the honest message ran), and dropped: at their lifetime,
        // and for the honest one.
        for (trickle, held, dropped) in [(true, 32, 32 + 8), (false, 0, 32)] {
            let mut siege = Siege::new(trickle);
            siege.run_for(Duration::from_secs(1));
            siege.send("honest", 1 << 20);
            siege.run_for(Duration::from_secs(9));
            let confirmed = siege.honest[0].confirmed.expect("confirmed");
            assert_eq!(confirmed, Duration::from_millis(4500), "trickle {trickle}");
            let bound = lifetime - Duration::from_secs(1) + RESEND;
            assert!(confirmed <= bound, "{confirmed:?} beyond {bound:?}");
            assert_eq!(
                siege_counts(&siege.core),
                (held, 0, dropped, 9 * 16),
                "trickle {trickle}: {:?}",
                stats(&siege.core)
            );
            assert_eq!(siege.most_held, SIEGE_BOUND, "never beyond it");
        }
    }

    proptest::proptest! {
        /// Arbitrary chunk deliveries (headers, seqs, window starts, lengths, producers), as a
        /// hostile peer could send them: nothing panics, the bound holds, and a message runs
        /// only whole (its body as long as its header says, made of chunks that all
        /// announced it).
        #[test]
        fn whatever_chunks_arrive_only_whole_messages_run_and_the_bound_holds(
            chunks in proptest::collection::vec(
                (0u8..3, 1u128..3, 1u64..12, 1u32..5, 0u64..6, 0u64..12, 0usize..300, 1u64..700),
                1..300,
            ),
        ) {
            let max = 2048;
            let mut c = core(ConsumerConfig {
                max_message_bytes: 1024,
                max_reassembly_bytes: max,
                max_out_of_order: Limit::At(3),
                ..Default::default()
            });
            let now = Instant::now();
            for (producer, incarnation, first, count, offset, window_start, len, message_len) in chunks {
                // Every chunk's bytes name the message it announces.
                let tag = (first as u8) ^ (count as u8).rotate_left(3) ^ (message_len as u8).rotate_left(5);
                let header = Header {
                    producer_id: ProducerId::from(format!("p{producer}").as_str()),
                    incarnation: Incarnation::from_u128(incarnation),
                    seq: first + offset,
                    window_start: window_start.max(1),
                    trace_context: None,
                    chunk: Some(ChunkHeader { first_seq: first, chunks: count, message_len }),
                };
                let inbound = Inbound { header, body: Bytes::from(vec![tag; len]), reply_to: Some(7) };
                let step = offer(&mut c, inbound, now);
                if let Step::Run(body) = step.step {
                    let running = c.running().expect("it runs").clone();
                    let announced = running.chunk.expect("a chunked message");
                    proptest::prop_assert_eq!(body.len() as u64, announced.message_len);
                    let tag = (announced.first_seq as u8)
                        ^ (announced.chunks as u8).rotate_left(3)
                        ^ (announced.message_len as u8).rotate_left(5);
                    proptest::prop_assert!(body.iter().all(|b| *b == tag), "chunks of one message");
                    c.handle_outcome(&HandlerOutcome::Succeeded, now);
                }
                let s = stats(&c);
                proptest::prop_assert!(s.reassembly_bytes <= max, "{:?}", s);
                proptest::prop_assert!(s.partial_messages <= 3, "{:?}", s);
            }
        }
    }
}
