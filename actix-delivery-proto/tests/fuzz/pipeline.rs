//! The receiving pipeline of a TCP node as one function, for fuzzing: the length-delimited
//! codec the node reads with, and the core's frame and body decoding.

use bytes::BytesMut;
use tokio_util::codec::{Decoder, LengthDelimitedCodec};

use actix_delivery_proto::codec::schema::BodySchema;
use actix_delivery_proto::codec::Codec;
use actix_delivery_proto::protocol::chunk::ChunkHeader;
use actix_delivery_proto::protocol::envelope::Incarnation;
use actix_delivery_proto::protocol::trace_context::TraceContext;
use actix_delivery_proto::tcp::auth::{NodeId, Opener, Sealer};
use actix_delivery_proto::tcp::frame::{
    AckBatch, Challenge, DeliveryBatch, Frame, Hello, Proof, WireDelivery, MAGIC,
    MIN_PROTOCOL_VERSION, PROTOCOL_VERSION,
};

/// Feeds `bytes` to what a node runs on received bytes, without authentication so that every
/// byte reaches the decoders: the length-delimited codec limited to `max_frame_length`, the
/// frame decoder at each protocol version a node speaks (one after the other, as a connection
/// of either version would), and with `bodies` the reading of delivery bodies: their codec and
/// version header, then the value (as `String` at version 1, and as `(u64, Vec<u8>)` at
/// version 2 with an upcaster from version 1). Returns how many frames decoded at some version;
/// stops at the first that decodes at none, as a connection closes there.
pub fn receive(bytes: &[u8], max_frame_length: usize, bodies: bool) -> usize {
    let mut codec = LengthDelimitedCodec::builder()
        .max_frame_length(max_frame_length)
        .new_codec();
    let mut opener = Opener::new(None);
    let mut buf = BytesMut::from(bytes);
    let mut decoded = 0;
    while let Ok(Some(frame)) = codec.decode(&mut buf) {
        let Some(payload) = opener.open(&frame) else {
            break;
        };
        let mut any = false;
        for version in MIN_PROTOCOL_VERSION..=PROTOCOL_VERSION {
            let Ok(frame) = Frame::decode_versioned(payload, version) else {
                continue;
            };
            if let (true, Frame::Deliveries(batch)) = (bodies, &frame) {
                for item in &batch.items {
                    read_body(item.body);
                }
            }
            any = true;
        }
        if !any {
            break;
        }
        decoded += 1;
    }
    decoded
}

/// Reads one delivery body as a receiver does, header first, with the schemas of
/// [`receive`]; returns how many of the two read it.
pub fn read_body(body: &[u8]) -> usize {
    let text = BodySchema::<String>::new().read(body).is_ok();
    let pair = BodySchema::<(u64, Vec<u8>)>::new()
        .version(2)
        .upcast(|old| old.decode::<u64>().map(|n| (n, Vec::new())))
        .read(body)
        .is_ok();
    usize::from(text) + usize::from(pair)
}

/// Valid bodies, to mutate: a `String` at version 1 in each codec, a `(u64, Vec<u8>)` at
/// version 2, and a `u64` at version 1 (read by the upcaster).
pub fn sample_bodies() -> Vec<Vec<u8>> {
    fn body<T: serde::Serialize>(schema: BodySchema<T>, value: &T) -> Vec<u8> {
        let mut out = Vec::new();
        schema.write(value, &mut out).expect("encodes");
        out
    }
    vec![
        body(BodySchema::new(), &"grüße".to_owned()),
        body(BodySchema::new().codec(Codec::Bincode), &"grüße".to_owned()),
        body(BodySchema::new().version(2), &(7u64, vec![1u8, 2, 3])),
        body(BodySchema::new(), &7u64),
    ]
}

/// A valid stream of one frame of every kind (untagged), to mutate, and a `Deliveries` frame
/// at protocol version 3.
pub fn sample_stream() -> Vec<u8> {
    let bodies = sample_bodies();
    let frames = [
        Frame::Hello(Hello {
            magic: MAGIC,
            version: PROTOCOL_VERSION,
            node_id: NodeId::from_bytes([1; 16]),
            nonce: [2; 32],
            authenticated: false,
            max_frame_length: 1 << 20,
        }),
        Frame::Challenge(Challenge {
            version: PROTOCOL_VERSION,
            node_id: NodeId::from_bytes([3; 16]),
            nonce: [4; 32],
            max_frame_length: 1 << 20,
            proof: Some([5; 32]),
        }),
        Frame::Proof(Proof { proof: None }),
        Frame::Accepted,
        Frame::Deliveries(DeliveryBatch {
            consumer: "orders",
            producer_id: "producer-1",
            incarnation: Incarnation::from_u128(u128::MAX / 3),
            items: bodies
                .iter()
                .zip([1, 2, 300, 301])
                .map(|(body, seq)| WireDelivery {
                    seq,
                    window_start: 1,
                    // Half of them traced, so that mutations reach a context too.
                    trace_context: TraceContext::new([7; 16], [8; 8], 1)
                        .filter(|_| seq.is_multiple_of(2)),
                    // One is a chunk, so that mutations reach a chunk header too.
                    chunk: (seq == 300).then_some(ChunkHeader {
                        first_seq: 300,
                        chunks: 2,
                        message_len: 64,
                    }),
                    body,
                })
                .collect(),
        }),
        Frame::Acks(AckBatch {
            producer_id: "producer-1",
            incarnation: Incarnation::from_u128(5),
            seqs: vec![1, 2, 70_000],
        }),
        Frame::Ping,
    ];
    let mut out = Vec::new();
    let mut sealer = Sealer::new(None);
    for frame in &frames {
        frame.encode(&mut sealer, &mut out, 1 << 20).expect("fits");
    }
    let Frame::Deliveries(mut batch) = frames[4].clone() else {
        unreachable!("the fifth frame is the deliveries")
    };
    batch.items.retain(|item| item.chunk.is_none()); // version 3 has no chunks
    Frame::Deliveries(batch)
        .encode_versioned(3, &mut sealer, &mut out, 1 << 20)
        .expect("fits");
    out
}
