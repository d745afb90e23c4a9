//! What both ends of a connection do: the handshake over the socket, reading tagged frames
//! with an idle timeout, and the writer that drains the bounded output.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::BytesMut;
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio_util::codec::{FramedRead, LengthDelimitedCodec};

use crate::remote::auth::{random_nonce, Opener, Sealer};
use crate::remote::frame::{Frame, HANDSHAKE_MAX_FRAME};
use crate::remote::handshake::{Client, HandshakeError, Local, Server, Session};
use crate::remote::node::Shared;
use crate::remote::output::Output;
use crate::remote::stats::{add, Counters, Warning};

/// Frames read from a connection.
pub(crate) type Reader = FramedRead<OwnedReadHalf, LengthDelimitedCodec>;

/// Writer buffers larger than this are not kept between writes.
const SPARE_KEPT: usize = 1 << 20;

/// One connection's output, shared with whoever sends on it (producers' remote references,
/// consumers' reply addresses) and drained by the connection's writer.
pub(crate) struct Link {
    output: Mutex<Output>,
    ready: Notify,
    closed: AtomicBool,
    /// Where the output's high-water mark is published as it rises.
    counters: Arc<Counters>,
}

impl Link {
    /// The link of an authenticated connection: frames tagged by `sealer`, at most the smaller
    /// of the peer's and this node's frame limit, at most `max_output_bytes` queued or being
    /// written.
    pub(crate) fn new(node: &Shared, sealer: Sealer, peer_max_frame_length: usize) -> Self {
        let options = &node.options;
        let max_frame = peer_max_frame_length.min(options.max_frame_length);
        Self {
            output: Mutex::new(Output::new(options.max_output_bytes, max_frame, sealer)),
            ready: Notify::new(),
            closed: AtomicBool::new(false),
            counters: node.counters.clone(),
        }
    }

    /// Queues through `push` and wakes the writer; `None` once the connection is closed.
    /// Publishes the output's high-water mark when it rises, so that it is true while a
    /// write blocks.
    pub(crate) fn with<R>(&self, push: impl FnOnce(&mut Output) -> R) -> Option<R> {
        if self.closed.load(Ordering::Acquire) {
            return None;
        }
        let result = {
            let mut output = self.lock();
            let before = output.high_water();
            let result = push(&mut output);
            let after = output.high_water();
            if after > before {
                self.counters
                    .output_high_water
                    .fetch_max(after as u64, Ordering::Relaxed);
            }
            result
        };
        self.ready.notify_one();
        Some(result)
    }

    /// Nothing more is queued; the writer stops.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.ready.notify_one();
    }

    fn lock(&self) -> MutexGuard<'_, Output> {
        self.output.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Why a connection ended.
#[derive(Debug)]
pub(crate) enum End {
    /// The peer closed it (or half-closed its sending side), or the socket failed.
    Closed,
    /// Nothing arrived for the idle timeout.
    Idle,
    /// A frame did not verify, decode or belong here.
    Violation,
}

impl End {
    /// Counts the end where it is counted.
    pub(crate) fn count(&self, counters: &Counters) {
        match self {
            End::Closed => {}
            End::Idle => add(&counters.idle_timeouts, 1),
            End::Violation => add(&counters.decode_failures, 1),
        }
    }
}

/// The next frame's payload, its tag checked and removed.
pub(crate) async fn next_frame(
    reader: &mut Reader,
    opener: &mut Opener,
    idle: Duration,
    counters: &Counters,
) -> Result<BytesMut, End> {
    let frame = match tokio::time::timeout(idle, reader.next()).await {
        Err(_) => return Err(End::Idle),
        Ok(None) => return Err(End::Closed),
        Ok(Some(Err(err))) if err.kind() == io::ErrorKind::InvalidData => {
            return Err(End::Violation); // a length prefix above the limit
        }
        Ok(Some(Err(_))) => return Err(End::Closed),
        Ok(Some(Ok(frame))) => frame,
    };
    add(&counters.frames_in, 1);
    let mut frame = frame;
    let len = opener.open(&frame).ok_or(End::Violation)?.len();
    frame.truncate(len);
    Ok(frame)
}

/// Runs an authenticated connection: `read` until it ends (or the node stops), beside the
/// writer of `link`; then closes the link and counts how it ended. `peer` names the other end
/// in logs.
pub(crate) async fn drive(
    node: &Shared,
    link: &Link,
    writer: OwnedWriteHalf,
    read: impl std::future::Future<Output = End>,
    peer: &(dyn std::fmt::Display + Sync),
) {
    add(&node.counters.connections_open, 1);
    let heartbeat = node.options.heartbeat_interval;
    let end = tokio::select! {
        () = node.cancel.cancelled() => End::Closed,
        end = read => end,
        () = write_loop(link, writer, heartbeat, &node.counters) => End::Closed,
    };
    end.count(&node.counters);
    if matches!(end, End::Violation) {
        node.warnings.warn(Warning::Decode, || {
            format!("closed the connection with {peer}: a frame did not verify or decode")
        });
    }
    link.close();
    node.counters
        .connections_open
        .fetch_sub(1, Ordering::Relaxed);
    log::debug!("the connection with {peer} ended: {end:?}");
}

/// Drains `link` into the socket until the link closes or a write fails; sends a heartbeat
/// after `heartbeat` without output.
async fn write_loop(
    link: &Link,
    mut writer: OwnedWriteHalf,
    heartbeat: Duration,
    counters: &Counters,
) {
    let mut spare = Vec::new();
    loop {
        if tokio::time::timeout(heartbeat, link.ready.notified())
            .await
            .is_err()
            && link.with(|output| output.push(&Frame::Ping)).is_some()
        {
            add(&counters.frames_out, 1);
        }
        if link.closed.load(Ordering::Acquire) {
            return;
        }
        link.lock().take(&mut spare);
        // Written bytes leave the output's count as they go, so it has room again at once.
        let mut done = 0;
        while done < spare.len() {
            match writer.write(&spare[done..]).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    done += n;
                    link.lock().written(n);
                }
            }
        }
        spare.clear();
        if spare.capacity() > SPARE_KEPT {
            spare = Vec::new();
        }
    }
}

/// Why a handshake over a socket failed.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The protocol refused the peer.
    Refused(HandshakeError),
    /// The socket closed or failed, or the peer sent something that is no frame.
    Io,
}

impl From<HandshakeError> for Failure {
    fn from(err: HandshakeError) -> Self {
        Self::Refused(err)
    }
}

/// An authenticated connection, ready for frames.
pub(crate) struct Established {
    pub reader: Reader,
    pub writer: OwnedWriteHalf,
    pub session: Session,
}

/// Frames of the handshake are never tagged.
async fn write_frame(writer: &mut OwnedWriteHalf, frame: &Frame<'_>) -> Result<(), Failure> {
    let mut out = Vec::new();
    frame
        .encode(&mut Sealer::new(None), &mut out, HANDSHAKE_MAX_FRAME)
        .map_err(HandshakeError::from)?;
    writer.write_all(&out).await.map_err(|_| Failure::Io)
}

async fn read_raw(reader: &mut Reader) -> Result<BytesMut, Failure> {
    match reader.next().await {
        Some(Ok(frame)) => Ok(frame),
        _ => Err(Failure::Io),
    }
}

fn split(stream: TcpStream) -> (Reader, OwnedWriteHalf) {
    // Latency matters more than packet count: batches are formed above the socket already.
    let _ = stream.set_nodelay(true);
    let (read, write) = stream.into_split();
    let codec = LengthDelimitedCodec::builder()
        .max_frame_length(HANDSHAKE_MAX_FRAME)
        .new_codec();
    (FramedRead::new(read, codec), write)
}

fn established(
    mut reader: Reader,
    writer: OwnedWriteHalf,
    local: &Local,
    session: Session,
) -> Established {
    reader
        .decoder_mut()
        .set_max_frame_length(local.max_frame_length as usize);
    Established {
        reader,
        writer,
        session,
    }
}

/// The connecting side's handshake.
pub(crate) async fn connect_handshake(
    stream: TcpStream,
    local: &Local,
) -> Result<Established, Failure> {
    let (mut reader, mut writer) = split(stream);
    let (client, hello) = Client::start(local, random_nonce());
    write_frame(&mut writer, &hello).await?;
    let challenge = read_raw(&mut reader).await?;
    let (proof, waiting) = client.handle(
        local,
        &Frame::decode(&challenge).map_err(HandshakeError::from)?,
    )?;
    write_frame(&mut writer, &proof).await?;
    let accepted = read_raw(&mut reader).await?;
    let session = waiting.handle(&accepted)?;
    Ok(established(reader, writer, local, session))
}

/// The accepting side's handshake.
pub(crate) async fn accept_handshake(
    stream: TcpStream,
    local: &Local,
) -> Result<Established, Failure> {
    let (mut reader, mut writer) = split(stream);
    let hello = read_raw(&mut reader).await?;
    let (server, challenge) = Server::start(
        local,
        &Frame::decode(&hello).map_err(HandshakeError::from)?,
        random_nonce(),
    )?;
    write_frame(&mut writer, &challenge).await?;
    let proof = read_raw(&mut reader).await?;
    let mut session =
        server.handle(local, &Frame::decode(&proof).map_err(HandshakeError::from)?)?;
    let mut accepted = Vec::new();
    Frame::Accepted
        .encode(&mut session.sealer, &mut accepted, HANDSHAKE_MAX_FRAME)
        .map_err(HandshakeError::from)?;
    writer.write_all(&accepted).await.map_err(|_| Failure::Io)?;
    Ok(established(reader, writer, local, session))
}
