//! What a stored event costs to encode and decode in each codec, and in CBOR (`ciborium`), the
//! other self-describing candidate, for comparison:
//!
//! - `codec/encode/<codec>` and `codec/decode/<codec>`: one event of an account (an enum
//!   variant with a string and two integers, as applications store them), into a reused
//!   buffer and back.
//!
//! `cargo bench -p actix-delivery-benches --bench codec`; the README's "Changing your types" quotes the ratios.

use std::hint::black_box;

use actix_delivery_proto::codec::{Codec, MAX_ENCODED_BYTES};
use criterion::{criterion_group, criterion_main, Criterion};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
enum AccountEvent {
    Deposited {
        account: String,
        amount: i64,
        at_ms: u64,
    },
    Closed,
}

fn event() -> AccountEvent {
    AccountEvent::Deposited {
        account: "account-000042".into(),
        amount: 12_345,
        at_ms: 1_764_633_600_000,
    }
}

fn codecs(c: &mut Criterion) {
    let mut group = c.benchmark_group("codec");
    let event = event();
    for codec in [Codec::Bincode, Codec::MessagePack] {
        let mut out = Vec::with_capacity(128);
        group.bench_function(format!("encode/{codec}"), |b| {
            b.iter(|| {
                out.clear();
                codec
                    .encode_into(black_box(&event), &mut out, MAX_ENCODED_BYTES)
                    .unwrap();
            })
        });
        let bytes = codec.encode(&event, MAX_ENCODED_BYTES).unwrap();
        group.bench_function(format!("decode/{codec}"), |b| {
            b.iter(|| {
                codec
                    .decode::<AccountEvent>(black_box(&bytes), MAX_ENCODED_BYTES)
                    .unwrap()
            })
        });
    }
    let mut out = Vec::with_capacity(128);
    group.bench_function("encode/cbor", |b| {
        b.iter(|| {
            out.clear();
            ciborium::into_writer(black_box(&event), &mut out).unwrap();
        })
    });
    let mut bytes = Vec::new();
    ciborium::into_writer(&event, &mut bytes).unwrap();
    group.bench_function("decode/cbor", |b| {
        b.iter(|| ciborium::from_reader::<AccountEvent, _>(black_box(&bytes[..])).unwrap())
    });
    group.finish();
}

criterion_group!(benches, codecs);
criterion_main!(benches);
