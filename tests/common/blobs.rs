//! Large messages for the chunking tests: bodies that say which they are, a consumer that
//! records what it handled of them, and a sink of a durable producer's confirmations.

use actix::prelude::*;
use actix_delivery::durable::{DurableConfirmation, MessageId};
use actix_delivery::{
    ConsumerHandle, ConsumerOptions, DeliveryError, DeliveryHandler, ReliableDelivery,
};
use bytes::Bytes;

use super::Log;

/// A body of `len` bytes (a multiple of 8) that says which it is, and its checksum.
pub fn blob(seed: u64, len: usize) -> (Bytes, u64) {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut bytes = vec![0u8; len];
    for word in bytes.chunks_exact_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        word.copy_from_slice(&x.to_le_bytes());
    }
    let sum = checksum(&bytes);
    (Bytes::from(bytes), sum)
}

/// A checksum of whole 8-byte words, position-dependent.
pub fn checksum(bytes: &[u8]) -> u64 {
    bytes.chunks_exact(8).fold(0u64, |sum, word| {
        let word = u64::from_le_bytes(word.try_into().expect("8 bytes"));
        sum.rotate_left(5) ^ word
    }) ^ bytes.len() as u64
}

/// A consumer of blobs that records (length, checksum) of each message handled.
pub fn blob_consumer(max_message_bytes: u64) -> (ConsumerHandle<Bytes>, Log<(usize, u64)>) {
    let handled = Log::default();
    let log = handled.clone();
    let handler = DeliveryHandler::from_fn(move |body: Bytes| {
        log.push((body.len(), checksum(&body)));
        async { Ok::<(), String>(()) }
    });
    let options = ConsumerOptions::builder(handler)
        .max_message_bytes(max_message_bytes)
        .max_reassembly_bytes(2 * max_message_bytes)
        .build()
        .unwrap();
    (ReliableDelivery::consumer(options), handled)
}

/// What a durable producer's sink was told.
pub type Reported = Log<(MessageId, Result<(), DeliveryError>)>;

/// The sink of a durable producer's confirmations after a restart.
pub fn durable_sink() -> (Recipient<DurableConfirmation>, Reported) {
    struct Sink(Reported);
    impl Actor for Sink {
        type Context = Context<Self>;
    }
    impl Handler<DurableConfirmation> for Sink {
        type Result = ();
        fn handle(&mut self, confirmation: DurableConfirmation, _: &mut Context<Self>) {
            self.0.push((confirmation.id, confirmation.result));
        }
    }
    let log = Log::default();
    (Sink(log.clone()).start().recipient(), log)
}
