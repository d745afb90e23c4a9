//! The receiving pipeline (length-delimited frames, frame decoder, body headers and decoding) fed
//! arbitrary and mutated bytes: it never panics; the transport's own decoding allocates at
//! most a small multiple of its input plus one `max_frame_length`, measured by a counting
//! allocator; oversize length prefixes are refused before anything is reserved for them.
//!
//! Decoding a body adds what its type's decoder reserves: serde reserves up to 1 MiB up front
//! for each sequence whose length prefix claims that much (`Vec<u8>` in the body type here),
//! freed when the bytes turn out to be missing. Found by this test; documented in the
//! `tcp` module of actix-delivery.
//!
//! `ACTIX_DELIVERY_FUZZ_CASES` sets the number of cases per property (default 4 000; CI runs 100
//! 000).
//!
//! A test binary of its own: the counting allocator is the process's global allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

mod pipeline;

use pipeline::{read_body, receive, sample_bodies, sample_stream};
use proptest::prelude::*;

/// Counts this thread's live heap bytes and their peak.
struct Counting;

thread_local! {
    static LIVE: Cell<usize> = const { Cell::new(0) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

fn track(grow: usize, shrink: usize) {
    let _ = LIVE.try_with(|live| {
        let now = live.get().saturating_add(grow).saturating_sub(shrink);
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

// SAFETY: every call is forwarded to the system allocator unchanged; the bookkeeping only
// touches const-initialised thread-locals (no allocation, no destructor).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        track(layout.size(), 0);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        track(0, layout.size());
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        track(new_size, layout.size());
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const MAX_FRAME: usize = 64 * 1024;

/// Runs the pipeline on `bytes`; returns the frames decoded and the peak extra heap bytes.
fn measured(bytes: &[u8], bodies: bool) -> (usize, usize) {
    let base = LIVE.with(Cell::get);
    PEAK.with(|peak| peak.set(base));
    let decoded = receive(bytes, MAX_FRAME, bodies);
    (decoded, PEAK.with(Cell::get) - base)
}

/// What the transport may allocate: copies and decodings of the input, item vectors of at
/// most 1 024 entries, and one frame buffer of at most `max_frame_length`.
fn bound(input: usize) -> usize {
    4 * input + MAX_FRAME + 64 * 1024
}

/// Serde's cautious preallocation for one sequence of the body type.
const SERDE_PREALLOCATION: usize = 1 << 20;

/// Checks both bounds: the transport alone, and with the bodies decoded.
fn check(bytes: &[u8]) -> Result<(), TestCaseError> {
    let (_, peak) = measured(bytes, false);
    prop_assert!(
        peak <= bound(bytes.len()),
        "{peak} bytes for {} of input",
        bytes.len()
    );
    let (_, peak) = measured(bytes, true);
    let with_bodies = bound(bytes.len()) + SERDE_PREALLOCATION;
    prop_assert!(
        peak <= with_bodies,
        "{peak} bytes for {} of input, bodies decoded",
        bytes.len()
    );
    Ok(())
}

fn cases() -> u32 {
    std::env::var("ACTIX_DELIVERY_FUZZ_CASES").map_or(4000, |n| n.parse().expect("a number"))
}

#[derive(Clone, Debug)]
enum Mutation {
    Flip(usize, u8),
    Set(usize, u8),
    Insert(usize, Vec<u8>),
    Delete(usize, usize),
    Truncate(usize),
    /// Overwrites 4 bytes (a length prefix, when it lands on one) with a value.
    Length(usize, u32),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 1..=255u8).prop_map(|(i, b)| Mutation::Flip(i, b)),
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Set(i, b)),
        (
            any::<usize>(),
            proptest::collection::vec(any::<u8>(), 1..16)
        )
            .prop_map(|(i, b)| Mutation::Insert(i, b)),
        (any::<usize>(), 1..32usize).prop_map(|(i, n)| Mutation::Delete(i, n)),
        any::<usize>().prop_map(Mutation::Truncate),
        (
            any::<usize>(),
            prop_oneof![
                any::<u32>(),
                0..300u32,
                Just(u32::MAX),
                Just(MAX_FRAME as u32 + 1)
            ]
        )
            .prop_map(|(i, n)| Mutation::Length(i, n)),
    ]
}

fn apply(bytes: &mut Vec<u8>, mutation: &Mutation) {
    let at = |i: usize, len: usize| if len == 0 { 0 } else { i % len };
    match mutation {
        Mutation::Flip(i, b) if !bytes.is_empty() => {
            let i = at(*i, bytes.len());
            bytes[i] ^= b;
        }
        Mutation::Set(i, b) if !bytes.is_empty() => {
            let i = at(*i, bytes.len());
            bytes[i] = *b;
        }
        Mutation::Insert(i, new) => {
            let i = at(*i, bytes.len() + 1);
            bytes.splice(i..i, new.iter().copied());
        }
        Mutation::Delete(i, n) if !bytes.is_empty() => {
            let i = at(*i, bytes.len());
            let end = (i + n).min(bytes.len());
            bytes.drain(i..end);
        }
        Mutation::Truncate(i) => bytes.truncate(at(*i, bytes.len() + 1)),
        Mutation::Length(i, n) if bytes.len() >= 4 => {
            let i = at(*i, bytes.len() - 3);
            bytes[i..i + 4].copy_from_slice(&n.to_be_bytes());
        }
        _ => {}
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic_and_allocate_boundedly(
        bytes in proptest::collection::vec(any::<u8>(), 0..2048)
    ) {
        check(&bytes)?;
    }

    #[test]
    fn mutated_frames_never_panic_and_allocate_boundedly(
        mutations in proptest::collection::vec(mutation(), 1..6)
    ) {
        let mut bytes = sample_stream();
        for m in &mutations {
            apply(&mut bytes, m);
        }
        check(&bytes)?;
    }
}

/// Reads a body (its codec and version header, then the value, maybe upcast) and checks what
/// that allocated: a small multiple of the body, plus serde's preallocation for a sequence.
fn check_body(body: &[u8]) -> Result<usize, TestCaseError> {
    let base = LIVE.with(Cell::get);
    PEAK.with(|peak| peak.set(base));
    let read = read_body(body);
    let peak = PEAK.with(Cell::get) - base;
    prop_assert!(
        peak <= 4 * body.len() + 1024 + SERDE_PREALLOCATION,
        "{peak} bytes for a body of {}",
        body.len()
    );
    Ok(read)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn mutated_and_arbitrary_bodies_never_panic_and_allocate_boundedly(
        which in 0..5usize,
        mutations in proptest::collection::vec(mutation(), 0..4),
        arbitrary in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        let mut body = sample_bodies().get(which).cloned().unwrap_or(arbitrary);
        for m in &mutations {
            apply(&mut body, m);
        }
        check_body(&body)?;
    }
}

#[test]
fn the_sample_bodies_read_so_mutations_start_from_valid_headers() {
    let read: Vec<usize> = sample_bodies().iter().map(|b| read_body(b)).collect();
    // Each `String` is read as one (not as the pair); the pair at its version; the `u64`
    // at version 1 through the pair's upcaster (and not as a `String`).
    assert_eq!(read, [1, 1, 1, 1]);
}

#[test]
fn a_hostile_sequence_length_in_a_body_costs_one_serde_preallocation_and_no_more() {
    // The case the fuzzer found: `0, 252` inserted into a body claims a `Vec<u8>` of
    // 2^32 - 1 bytes (varint tag 252: a u32 follows) with a handful behind it.
    let body = [7u8, 252, 0xff, 0xff, 0xff, 0xff, 1, 2, 3];
    assert!(actix_delivery_proto::codec::decode::<(u64, Vec<u8>)>(&body).is_err());
    let header = [1u8, 2]; // bincode, version 2: read as `(u64, Vec<u8>)`
    assert_eq!(read_body(&[&header[..], &body].concat()), 0);
    let mut bytes = sample_stream();
    let at = bytes.len() / 2;
    bytes.splice(at..at, [0, 252]);
    check(&bytes).unwrap();
}

#[test]
fn the_sample_decodes_whole_so_mutations_start_from_valid_frames() {
    assert_eq!(receive(&sample_stream(), MAX_FRAME, true), 8);
}

#[test]
fn oversize_length_prefixes_are_refused_before_allocation() {
    for claim in [u32::MAX, 1 << 30, MAX_FRAME as u32 + 1] {
        let mut bytes = claim.to_be_bytes().to_vec();
        bytes.extend_from_slice(&[0; 8]);
        let (decoded, peak) = measured(&bytes, true);
        assert_eq!(decoded, 0);
        assert!(peak < 1024, "{peak} bytes allocated for a claim of {claim}");
    }
    // A valid frame first, then the hostile prefix: the first one still decodes.
    let mut bytes = sample_stream();
    bytes.extend_from_slice(&u32::MAX.to_be_bytes());
    let (decoded, peak) = measured(&bytes, false);
    assert_eq!(decoded, 8);
    assert!(peak <= bound(bytes.len()) - MAX_FRAME);
}
