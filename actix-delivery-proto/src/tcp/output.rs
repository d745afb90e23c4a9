//! One connection's output: frames encoded, tagged and queued for the writer. At most `limit`
//! bytes of frames are held at any moment, counting both those queued and those the writer
//! took and has not written yet; when full, what does not fit is dropped, never buffered beyond
//! the limit (the producer retransmits a dropped delivery; a dropped ACK is recovered the same
//! way). A frame is encoded before its length is known, so for a moment one more frame (at
//! most the peer's frame limit) may be held, then dropped if it does not fit; the buffer's
//! capacity never grows beyond `limit` plus one frame. Frames are encoded at the output's
//! protocol version (its connection's): what that version cannot express (a chunk below
//! version 4) is held back, not sent, and counted (its producer retransmits it, and it goes out
//! once a connection speaks a version that has it). Pure: no I/O, no runtime.

use crate::protocol::chunk::ChunkHeader;
use crate::protocol::envelope::{Ack, Incarnation};
use crate::protocol::trace_context::TraceContext;
use crate::tcp::auth::Sealer;
use crate::tcp::body::Body;
use crate::tcp::frame::{
    bytes_len, carries_chunks, deliveries_overhead, varint_len, wire_delivery_len, AckBatch,
    DeliveryBatch, Frame, FrameError, WireDelivery, LENGTH_PREFIX, MAX_BATCH,
};

/// What became of the messages offered to [`Output`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pushed {
    /// Frames queued.
    pub frames: u64,
    /// Messages (deliveries or ACKs) queued.
    pub queued: u64,
    /// Messages dropped because the output was full.
    pub full: u64,
    /// Deliveries dropped because they cannot fit any frame the peer accepts.
    pub too_large: u64,
    /// Chunks not sent because the output's protocol version has no chunks (below 4): their
    /// producers retransmit them.
    pub held_for_version: u64,
}

/// What a frame without items (a `Ping`) takes at most: kind, tag.
const SMALL_FRAME: usize = 32;

/// A delivery ready for the wire.
#[derive(Clone, Debug)]
pub struct Item {
    /// The delivery's seq.
    pub seq: u64,
    /// The producer's window start when it was sent.
    pub window_start: u64,
    /// The encoded body.
    pub body: Body,
    /// The trace context it carries, if traced.
    pub trace_context: Option<TraceContext>,
    /// Where the delivery sits in its message, if it is a chunk of one.
    pub chunk: Option<ChunkHeader>,
}

impl Item {
    /// An item of a whole message without trace context.
    pub fn new(seq: u64, window_start: u64, body: Body) -> Self {
        Self {
            seq,
            window_start,
            body,
            trace_context: None,
            chunk: None,
        }
    }
}

/// The queue of encoded frames of one connection.
pub struct Output {
    buf: Vec<u8>,
    /// Bytes the writer took ([`take`](Self::take)) and has not reported written.
    writing: usize,
    limit: usize,
    max_frame: usize,
    sealer: Sealer,
    /// The protocol version frames are encoded at.
    version: u16,
    high_water: usize,
    /// Frames queued since the writer last took them.
    frames: usize,
}

impl Output {
    /// An output of at most `limit` queued bytes whose frames are at most `max_frame` long (the
    /// peer's limit), tagged by `sealer`, encoded at protocol `version` (the connection's).
    pub fn new(limit: usize, max_frame: usize, sealer: Sealer, version: u16) -> Self {
        Self {
            buf: Vec::new(),
            writing: 0,
            limit,
            max_frame,
            sealer,
            version,
            high_water: 0,
            frames: 0,
        }
    }

    /// The protocol version its frames are encoded at.
    pub fn version(&self) -> u16 {
        self.version
    }

    /// Queues one small frame (a `Ping`).
    ///
    /// # Errors
    /// [`FrameError::TooLong`] if it does not fit, the frame or the queue.
    pub fn push(&mut self, frame: &Frame<'_>) -> Result<(), FrameError> {
        self.push_sized(frame, SMALL_FRAME)
    }

    /// Queues one frame whose payload and tag take at most about `estimate` bytes.
    fn push_sized(&mut self, frame: &Frame<'_>, estimate: usize) -> Result<(), FrameError> {
        let room = self
            .limit
            .saturating_sub(self.held() + LENGTH_PREFIX)
            .min(self.max_frame);
        self.reserve(LENGTH_PREFIX + estimate.min(room));
        frame.encode_versioned(self.version, &mut self.sealer, &mut self.buf, room)?;
        {
            self.frames += 1;
        }
        self.high_water = self.high_water.max(self.held());
        Ok(())
    }

    /// Bytes held: queued, and taken by the writer but not written yet.
    fn held(&self) -> usize {
        self.buf.len() + self.writing
    }

    /// Makes room for `additional` bytes before a frame is encoded, so that its encoding does
    /// not reallocate (when the estimate holds): capacity grows geometrically, but never
    /// beyond the limit plus one frame.
    fn reserve(&mut self, additional: usize) {
        let need = self.buf.len() + additional;
        if self.buf.capacity() < need {
            let most = (self.limit + LENGTH_PREFIX + self.max_frame).max(need);
            let target = (2 * self.buf.capacity()).clamp(need, most);
            self.buf.reserve_exact(target - self.buf.len());
        }
    }

    /// Queues deliveries of one producer incarnation to `consumer`, in as few frames as the
    /// peer's frame limit and `MAX_BATCH` allow; chunks are held back if the output's version
    /// has none.
    pub fn push_deliveries(
        &mut self,
        consumer: &str,
        producer_id: &str,
        incarnation: Incarnation,
        items: &[Item],
    ) -> Pushed {
        if !carries_chunks(self.version) && items.iter().any(|item| item.chunk.is_some()) {
            let sendable: Vec<Item> = items
                .iter()
                .filter(|item| item.chunk.is_none())
                .cloned()
                .collect();
            let mut pushed = self.push_sendable(consumer, producer_id, incarnation, &sendable);
            pushed.held_for_version = (items.len() - sendable.len()) as u64;
            return pushed;
        }
        self.push_sendable(consumer, producer_id, incarnation, items)
    }

    /// Queues deliveries that the output's version can express, as
    /// [`push_deliveries`](Self::push_deliveries) says. Sizes are counted as version 4 encodes
    /// them: at version 3, a byte per delivery too many, on the safe side.
    fn push_sendable(
        &mut self,
        consumer: &str,
        producer_id: &str,
        incarnation: Incarnation,
        items: &[Item],
    ) -> Pushed {
        let overhead =
            deliveries_overhead(consumer, producer_id, incarnation) + self.sealer.overhead();
        let budget = self.max_frame.saturating_sub(overhead);
        let mut pushed = Pushed::default();
        let mut rest = items;
        while !rest.is_empty() {
            let (mut size, mut take) = (0, 0);
            for item in rest.iter().take(MAX_BATCH) {
                let len = wire_delivery_len(
                    item.seq,
                    item.window_start,
                    item.trace_context.is_some(),
                    item.chunk,
                    item.body.as_slice().len(),
                );
                if size + len > budget {
                    break;
                }
                size += len;
                take += 1;
            }
            if take == 0 {
                pushed.too_large += 1; // this one fits no frame on its own
                rest = &rest[1..];
                continue;
            }
            let (chunk, later) = rest.split_at(take);
            rest = later;
            let frame = Frame::Deliveries(DeliveryBatch {
                consumer,
                producer_id,
                incarnation,
                items: chunk
                    .iter()
                    .map(|item| WireDelivery {
                        seq: item.seq,
                        window_start: item.window_start,
                        trace_context: item.trace_context.clone(),
                        chunk: item.chunk,
                        body: item.body.as_slice(),
                    })
                    .collect(),
            });
            let result = self.push_sized(&frame, overhead + size);
            self.account(result, take, &mut pushed);
        }
        pushed
    }

    /// Queues ACKs, one frame per run of ACKs for the same producer incarnation (split where a
    /// frame would be too long).
    pub fn push_acks(&mut self, acks: &[Ack]) -> Pushed {
        let mut pushed = Pushed::default();
        let mut rest = acks;
        while let Some(first) = rest.first() {
            let id = first.producer_id.as_str();
            let overhead = 1
                + bytes_len(id.len())
                + varint_len((first.incarnation.as_u128() >> 64) as u64)
                + varint_len(first.incarnation.as_u128() as u64)
                + 3
                + self.sealer.overhead();
            let budget = self.max_frame.saturating_sub(overhead);
            let (mut size, mut take) = (0, 0);
            for ack in rest.iter().take(MAX_BATCH) {
                let len = varint_len(ack.seq);
                if ack.producer_id != first.producer_id
                    || ack.incarnation != first.incarnation
                    || size + len > budget
                {
                    break;
                }
                size += len;
                take += 1;
            }
            let (run, later) = rest.split_at(take.max(1));
            rest = later;
            let frame = Frame::Acks(AckBatch {
                producer_id: id,
                incarnation: first.incarnation,
                seqs: run.iter().map(|ack| ack.seq).collect(),
            });
            let result = self.push_sized(&frame, overhead + size.max(varint_len(first.seq)));
            self.account(result, run.len(), &mut pushed);
        }
        pushed
    }

    fn account(&self, result: Result<(), FrameError>, messages: usize, pushed: &mut Pushed) {
        match result {
            Ok(()) => {
                pushed.frames += 1;
                pushed.queued += messages as u64;
            }
            Err(FrameError::TooLong { len, .. }) if len <= self.max_frame => {
                pushed.full += messages as u64;
            }
            Err(_) => pushed.too_large += messages as u64,
        }
    }

    /// Hands the queued bytes to the writer: swaps them with `spare` (which must be empty).
    /// They count against the limit until the writer reports them [`written`](Self::written).
    pub fn take(&mut self, spare: &mut Vec<u8>) {
        debug_assert!(spare.is_empty());
        std::mem::swap(&mut self.buf, spare);
        self.writing += spare.len();
    }

    /// The frames queued since the last call (those the writer just took).
    pub fn take_frames(&mut self) -> usize {
        std::mem::take(&mut self.frames)
    }

    /// The writer wrote `n` more of the bytes it took: room for as many.
    pub fn written(&mut self, n: usize) {
        debug_assert!(n <= self.writing);
        self.writing = self.writing.saturating_sub(n);
    }

    /// Whether nothing is queued.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// The most bytes ever held at once (queued and being written).
    pub fn high_water(&self) -> usize {
        self.high_water
    }
}

#[cfg(test)]
mod tests {
    use bytes::BytesMut;
    use tokio_util::codec::{Decoder, LengthDelimitedCodec};

    use super::*;
    use crate::protocol::envelope::ProducerId;
    use crate::tcp::auth::Opener;
    use crate::tcp::frame::PROTOCOL_VERSION;

    const KEY: [u8; 32] = [3; 32];

    fn frames(bytes: &[u8], max: usize) -> Vec<Vec<u8>> {
        let mut codec = LengthDelimitedCodec::builder()
            .max_frame_length(max)
            .new_codec();
        let mut buf = BytesMut::from(bytes);
        let mut out = Vec::new();
        while let Some(frame) = codec.decode(&mut buf).unwrap() {
            out.push(frame.to_vec());
        }
        assert!(buf.is_empty());
        out
    }

    fn items(n: u64, body: usize) -> Vec<Item> {
        (1..=n)
            .map(|seq| Item::new(seq, 1, Body::new(&vec![seq as u8; body])))
            .collect()
    }

    #[test]
    fn deliveries_are_split_into_frames_the_peer_accepts() {
        let max = 4096;
        let mut output = Output::new(1 << 20, max, Sealer::new(Some(&KEY)), PROTOCOL_VERSION);
        let inc = Incarnation::from_u128(u128::MAX);
        let pushed = output.push_deliveries("orders", "producer", inc, &items(100, 500));
        assert_eq!(pushed.queued, 100);
        assert_eq!(pushed.full + pushed.too_large, 0);
        let mut taken = Vec::new();
        output.take(&mut taken);
        let frames = frames(&taken, max);
        assert_eq!(frames.len() as u64, pushed.frames);
        assert!(frames.len() >= 100 * 500 / max);
        let mut opener = Opener::new(Some(&KEY));
        let mut seqs = Vec::new();
        for frame in &frames {
            assert!(frame.len() <= max);
            let Frame::Deliveries(batch) = Frame::decode(opener.open(frame).unwrap()).unwrap()
            else {
                panic!("a deliveries frame");
            };
            assert_eq!((batch.consumer, batch.producer_id), ("orders", "producer"));
            seqs.extend(batch.items.iter().map(|item| item.seq));
        }
        assert_eq!(seqs, (1..=100).collect::<Vec<_>>());
    }

    #[test]
    fn a_batch_holds_at_most_max_batch_deliveries() {
        let mut output = Output::new(1 << 24, 1 << 20, Sealer::new(None), PROTOCOL_VERSION);
        let n = MAX_BATCH as u64 * 2 + 1;
        let pushed = output.push_deliveries("c", "p", Incarnation::from_u128(1), &items(n, 1));
        assert_eq!((pushed.frames, pushed.queued), (3, n));
    }

    #[test]
    fn a_body_too_large_for_any_frame_is_dropped_alone() {
        let mut output = Output::new(1 << 20, 4096, Sealer::new(None), PROTOCOL_VERSION);
        let mut batch = items(3, 10);
        batch[1].body = Body::new(&[0; 5000]);
        let pushed = output.push_deliveries("c", "p", Incarnation::from_u128(1), &batch);
        assert_eq!((pushed.queued, pushed.too_large), (2, 1));
    }

    #[test]
    fn a_full_output_drops_and_never_exceeds_its_limit() {
        let limit = 10_000;
        let mut output = Output::new(limit, 4096, Sealer::new(Some(&KEY)), PROTOCOL_VERSION);
        let pushed = output.push_deliveries("c", "p", Incarnation::from_u128(1), &items(100, 300));
        assert!(pushed.queued > 0 && pushed.full > 0, "{pushed:?}");
        assert_eq!(pushed.queued + pushed.full, 100);
        assert!(output.high_water() <= limit);
        // What was queued still opens in order: dropped frames were never tagged.
        let mut taken = Vec::new();
        output.take(&mut taken);
        let mut opener = Opener::new(Some(&KEY));
        for frame in frames(&taken, 4096) {
            assert!(Frame::decode(opener.open(&frame).unwrap()).is_ok());
        }
        // Taken: room again.
        assert!(output.is_empty());
        assert_eq!(output.push(&Frame::Ping), Ok(()));
    }

    #[test]
    fn bytes_in_the_writers_hands_count_against_the_limit() {
        let limit = 10_000;
        let mut output = Output::new(limit, 4096, Sealer::new(None), PROTOCOL_VERSION);
        let inc = Incarnation::from_u128(1);
        assert!(output.push_deliveries("c", "p", inc, &items(100, 300)).full > 0);
        // The writer takes what is queued and is slow to write it (a peer that reads slowly).
        let mut writing = Vec::new();
        output.take(&mut writing);
        assert!(writing.len() > limit / 2);
        let pushed = output.push_deliveries("c", "p", inc, &items(100, 300));
        let mut queued = Vec::new();
        output.take(&mut queued);
        assert!(
            writing.len() + queued.len() <= limit,
            "{} bytes being written and {} queued: more than the limit {limit}",
            writing.len(),
            queued.len()
        );
        assert_eq!(pushed.queued, 0, "no room while the writer holds the limit");
        assert!(output.high_water() <= limit);
        // Written: room again.
        output.written(writing.len());
        let pushed = output.push_deliveries("c", "p", inc, &items(10, 300));
        assert_eq!(pushed.queued, 10);
        assert!(output.high_water() <= limit);
    }

    #[test]
    fn the_buffer_never_grows_beyond_the_limit_and_one_frame() {
        let (limit, max_frame) = (100_000, 4096);
        let mut output = Output::new(limit, max_frame, Sealer::new(Some(&KEY)), PROTOCOL_VERSION);
        let inc = Incarnation::from_u128(1);
        for round in 0..50u64 {
            let batch: Vec<Item> = (1..=40)
                .map(|seq| {
                    Item::new(
                        seq,
                        1,
                        Body::new(&vec![0; 50 + (seq * round) as usize % 900]),
                    )
                })
                .collect();
            output.push_deliveries("c", "p", inc, &batch);
            output.push(&Frame::Ping).ok();
            assert!(output.held() <= limit);
            assert!(
                output.buf.capacity() <= limit + LENGTH_PREFIX + max_frame,
                "capacity {}",
                output.buf.capacity()
            );
        }
    }

    #[test]
    fn at_version_3_chunks_are_held_back_and_the_rest_is_sent_in_order() {
        let mut batch = items(5, 10);
        for item in &mut batch[1..3] {
            item.chunk = Some(ChunkHeader {
                first_seq: 2,
                chunks: 2,
                message_len: 20,
            });
            item.body = Body::Chunk(bytes::Bytes::from_static(&[7; 10]));
        }
        let inc = Incarnation::from_u128(1);
        let mut output = Output::new(1 << 20, 4096, Sealer::new(None), 3);
        let pushed = output.push_deliveries("c", "p", inc, &batch);
        assert_eq!((pushed.queued, pushed.held_for_version), (3, 2));
        assert_eq!(pushed.full + pushed.too_large, 0);
        output.push(&Frame::Ping).unwrap();
        let mut taken = Vec::new();
        output.take(&mut taken);
        let frames = frames(&taken, 4096);
        let Frame::Deliveries(sent) = Frame::decode_versioned(&frames[0], 3).unwrap() else {
            panic!("a deliveries frame");
        };
        let seqs: Vec<u64> = sent.items.iter().map(|item| item.seq).collect();
        assert_eq!(seqs, [1, 4, 5]);
        assert_eq!(Frame::decode_versioned(&frames[1], 3), Ok(Frame::Ping));
        // At version 4 the chunks go out with the rest.
        let mut output = Output::new(1 << 20, 4096, Sealer::new(None), 4);
        let pushed = output.push_deliveries("c", "p", inc, &batch);
        assert_eq!((pushed.queued, pushed.held_for_version), (5, 0));
    }

    #[test]
    fn acks_are_grouped_per_producer_run() {
        let mut output = Output::new(1 << 20, 4096, Sealer::new(None), PROTOCOL_VERSION);
        let ack = |id: &str, i: u128, seq| Ack {
            producer_id: ProducerId::from(id),
            incarnation: Incarnation::from_u128(i),
            seq,
        };
        let mut acks: Vec<Ack> = (1..=2000).map(|s| ack("a", 1, 1 << 40 | s)).collect();
        acks.push(ack("b", 1, 1));
        acks.push(ack("a", 2, 1));
        let pushed = output.push_acks(&acks);
        assert_eq!(pushed.queued, 2002);
        let mut taken = Vec::new();
        output.take(&mut taken);
        let mut seen = Vec::new();
        for frame in frames(&taken, 4096) {
            let Frame::Acks(batch) = Frame::decode(&frame).unwrap() else {
                panic!("an acks frame");
            };
            for seq in batch.seqs {
                seen.push(ack(batch.producer_id, batch.incarnation.as_u128(), seq));
            }
        }
        assert_eq!(seen, acks);
        assert!(
            pushed.frames >= 4,
            "2000 six-byte seqs need several 4 KiB frames"
        );
    }
}
