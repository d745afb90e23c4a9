//! The wire format, written down independently of the crate (a change of format fails these
//! tests), and raw peers that speak it: clients and servers without authentication that send
//! exactly what a test wants.

use std::time::Duration;

use actix_delivery::codec;
use actix_delivery::Incarnation;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub enum Frame {
    Hello(Hello),
    Challenge(Challenge),
    Proof(Proof),
    Accepted,
    Deliveries(Deliveries),
    Acks(Acks),
    Ping,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    pub magic: [u8; 8],
    pub version: u16,
    pub node_id: [u8; 16],
    pub nonce: [u8; 32],
    pub authenticated: bool,
    pub max_frame_length: u32,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct Challenge {
    pub version: u16,
    pub node_id: [u8; 16],
    pub nonce: [u8; 32],
    pub max_frame_length: u32,
    pub proof: Option<[u8; 32]>,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct Proof {
    pub proof: Option<[u8; 32]>,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct Deliveries {
    pub consumer: String,
    pub producer_id: String,
    pub incarnation: Incarnation,
    pub items: Vec<Item>,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct Item {
    pub seq: u64,
    pub window_start: u64,
    /// Since version 3: the W3C trace context (trace id, span id, flags), if any.
    pub trace_context: Option<([u8; 16], [u8; 8], u8)>,
    /// Since version 4: of a chunk of a large message, its message's first seq, number of
    /// chunks and length in bytes.
    pub chunk: Option<(u64, u32, u64)>,
    pub body: Vec<u8>,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct Acks {
    pub producer_id: String,
    pub incarnation: Incarnation,
    pub seqs: Vec<u64>,
}

/// The protocol version a node offers by default, the highest it speaks.
pub const VERSION: u16 = 4;

/// A frame of protocol version 3: version 4's, but a delivery has no chunk field.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub enum FrameV3 {
    Hello(Hello),
    Challenge(Challenge),
    Proof(Proof),
    Accepted,
    Deliveries(DeliveriesV3),
    Acks(Acks),
    Ping,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct DeliveriesV3 {
    pub consumer: String,
    pub producer_id: String,
    pub incarnation: Incarnation,
    pub items: Vec<ItemV3>,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct ItemV3 {
    pub seq: u64,
    pub window_start: u64,
    pub trace_context: Option<([u8; 16], [u8; 8], u8)>,
    pub body: Vec<u8>,
}

/// A body as protocol 2 writes it: codec id (2: MessagePack with named fields), the schema
/// version of its type (a bincode varint), the value.
pub fn body<T: Serialize>(value: &T) -> Vec<u8> {
    body_at(2, 1, &rmp_serde::to_vec_named(value).unwrap())
}

/// A body of codec `codec` at `version` whose value is `encoded`.
pub fn body_at(codec: u8, version: u32, encoded: &[u8]) -> Vec<u8> {
    let mut out = codec::encode(&(codec, version)).unwrap();
    out.extend_from_slice(encoded);
    out
}

fn random<const N: usize>() -> [u8; N] {
    let mut bytes = [0; N];
    getrandom::fill(&mut bytes).unwrap();
    bytes
}

pub fn hello(authenticated: bool) -> Frame {
    Frame::Hello(Hello {
        magic: *b"actixdlv",
        version: VERSION,
        node_id: random(),
        nonce: random(),
        authenticated,
        max_frame_length: 1 << 20,
    })
}

/// The bytes of one frame (of any version): 4-byte big-endian length, payload.
pub fn frame_bytes(frame: &impl Serialize) -> Vec<u8> {
    let payload = codec::encode(frame).unwrap();
    let mut out = (payload.len() as u32).to_be_bytes().to_vec();
    out.extend(payload);
    out
}

pub async fn write(stream: &mut TcpStream, frame: &impl Serialize) -> std::io::Result<()> {
    stream.write_all(&frame_bytes(frame)).await
}

/// The next frame, or `None` when the connection closed (or `within` passed).
pub async fn read(stream: &mut TcpStream, within: Duration) -> Option<Frame> {
    let read = async {
        let mut len = [0u8; 4];
        stream.read_exact(&mut len).await.ok()?;
        let mut payload = vec![0u8; u32::from_be_bytes(len) as usize];
        stream.read_exact(&mut payload).await.ok()?;
        Some(codec::decode(&payload).expect("the node sends valid frames"))
    };
    tokio::time::timeout(within, read).await.ok().flatten()
}

/// Whether the peer closed the connection within `within` (reading and discarding).
pub async fn closed_by_peer(stream: &mut TcpStream, within: Duration) -> bool {
    let drain = async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return true,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(within, drain).await.unwrap_or(false)
}

/// A client without authentication, through the handshake with an insecure node.
pub async fn insecure_client(addr: std::net::SocketAddr) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    write(&mut stream, &hello(false)).await.unwrap();
    let challenge = read(&mut stream, Duration::from_secs(5)).await;
    assert!(
        matches!(
            challenge,
            Some(Frame::Challenge(Challenge { proof: None, .. }))
        ),
        "{challenge:?}"
    );
    write(&mut stream, &Frame::Proof(Proof { proof: None }))
        .await
        .unwrap();
    assert_eq!(
        read(&mut stream, Duration::from_secs(5)).await,
        Some(Frame::Accepted)
    );
    stream
}

/// Deliveries of `u64` bodies from producer `p` (incarnation 7) to `consumer`.
pub fn deliveries(consumer: &str, seqs: impl IntoIterator<Item = u64>) -> Frame {
    Frame::Deliveries(Deliveries {
        consumer: consumer.into(),
        producer_id: "p".into(),
        incarnation: Incarnation::from_u128(7),
        items: seqs
            .into_iter()
            .map(|seq| Item {
                seq,
                window_start: 1,
                trace_context: None,
                chunk: None,
                body: body(&seq),
            })
            .collect(),
    })
}

/// [`deliveries`] at protocol version 3.
pub fn deliveries_v3(consumer: &str, seqs: impl IntoIterator<Item = u64>) -> FrameV3 {
    FrameV3::Deliveries(DeliveriesV3 {
        consumer: consumer.into(),
        producer_id: "p".into(),
        incarnation: Incarnation::from_u128(7),
        items: seqs
            .into_iter()
            .map(|seq| ItemV3 {
                seq,
                window_start: 1,
                trace_context: None,
                body: body(&seq),
            })
            .collect(),
    })
}

/// Reads frames until an `Acks` frame comes, skipping heartbeats.
pub async fn next_acks(stream: &mut TcpStream) -> Option<Acks> {
    loop {
        match read(stream, Duration::from_secs(5)).await? {
            Frame::Acks(acks) => return Some(acks),
            Frame::Ping => {}
            other => panic!("unexpected {other:?}"),
        }
    }
}

/// Accepts one connection as an insecure server, answers the handshake, then runs `after`.
pub async fn insecure_server_once(listener: &tokio::net::TcpListener) -> TcpStream {
    let (mut stream, _) = listener.accept().await.unwrap();
    let Some(Frame::Hello(hello)) = read(&mut stream, Duration::from_secs(5)).await else {
        panic!("no hello");
    };
    assert!(!hello.authenticated);
    let challenge = Challenge {
        version: VERSION,
        node_id: random(),
        nonce: random(),
        max_frame_length: 1 << 20,
        proof: None,
    };
    write(&mut stream, &Frame::Challenge(challenge))
        .await
        .unwrap();
    assert_eq!(
        read(&mut stream, Duration::from_secs(5)).await,
        Some(Frame::Proof(Proof { proof: None }))
    );
    write(&mut stream, &Frame::Accepted).await.unwrap();
    stream
}
