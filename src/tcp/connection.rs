//! What both ends of a connection do: TLS (in the TLS mode), the handshake over the
//! socket, reading tagged frames with an idle timeout, and the writer that drains the bounded
//! output.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::BytesMut;
use futures_util::StreamExt;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio_util::codec::{FramedRead, LengthDelimitedCodec};

#[cfg(feature = "tls")]
use crate::runtime::error_chain::ErrorChain;
use crate::runtime::random::random_bytes;
use crate::tcp::auth::{Nonce, Opener, Sealer};
use crate::tcp::context::Context;
use crate::tcp::frame::{Frame, HANDSHAKE_MAX_FRAME};
use crate::tcp::handshake::{Client, HandshakeError, Local, Server, Session};
use crate::tcp::output::Output;
use crate::tcp::peer::Identity;
use crate::tcp::stats::{add, Counters, Warning};

/// The reading half of a connection (a socket's, or its TLS stream's).
pub(crate) type ReadStream = Box<dyn AsyncRead + Send + Unpin>;
/// The writing half of a connection.
pub(crate) type WriteStream = Box<dyn AsyncWrite + Send + Unpin>;
/// Frames read from a connection.
pub(crate) type Reader = FramedRead<ReadStream, LengthDelimitedCodec>;
/// The first byte of a TLS record carrying a handshake (a ClientHello); a frame before the
/// handshake starts with its length prefix's high byte, 0.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

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
    /// The link of an authenticated connection: frames of the protocol `version` it negotiated,
    /// tagged by `sealer`, at most the smaller of the peer's and this node's frame limit, at
    /// most `max_output_bytes` queued or being written.
    pub(crate) fn new(
        node: &Context,
        sealer: Sealer,
        peer_max_frame_length: usize,
        version: u16,
    ) -> Self {
        let options = &node.options;
        let max_frame = peer_max_frame_length.min(options.config.max_frame_length);
        Self {
            output: Mutex::new(Output::new(
                options.config.max_output_bytes,
                max_frame,
                sealer,
                version,
            )),
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

    /// The protocol version of its frames (the connection's).
    pub(crate) fn version(&self) -> u16 {
        self.lock().version()
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
    /// The peer delivered to a consumer it is not authorized for (counted where found).
    Unauthorized,
}

impl End {
    /// Counts the end where it is counted.
    pub(crate) fn count(&self, counters: &Counters) {
        match self {
            End::Closed | End::Unauthorized => {}
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
    node: &Context,
    link: &Link,
    writer: WriteStream,
    read: impl std::future::Future<Output = End>,
    peer: &(dyn std::fmt::Display + Sync),
) {
    add(&node.counters.connections_open, 1);
    #[cfg(feature = "metrics")]
    node.publish();
    let end = tokio::select! {
        () = node.cancel.cancelled() => End::Closed,
        end = read => end,
        () = write_loop(link, writer, node) => End::Closed,
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
    #[cfg(feature = "metrics")]
    node.publish();
    log::debug!("the connection with {peer} ended: {end:?}");
}

/// Drains `link` into the socket until the link closes or a write fails; sends a heartbeat
/// after `heartbeat` without output.
async fn write_loop(link: &Link, mut writer: WriteStream, node: &Context) {
    let (heartbeat, counters) = (node.options.config.heartbeat_interval, &node.counters);
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
        #[cfg(feature = "metrics")]
        let frames = {
            let mut output = link.lock();
            output.take(&mut spare);
            output.take_frames()
        };
        #[cfg(not(feature = "metrics"))]
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
        // A TLS stream may hold the last record back until flushed (a socket holds nothing).
        if writer.flush().await.is_err() {
            return;
        }
        #[cfg(feature = "metrics")]
        node.written(frames, spare.len());
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
    /// TLS failed, or one side speaks it and the other does not.
    Tls(String),
}

impl From<HandshakeError> for Failure {
    fn from(err: HandshakeError) -> Self {
        Self::Refused(err)
    }
}

/// An authenticated connection, ready for frames.
pub(crate) struct Established {
    pub reader: Reader,
    pub writer: WriteStream,
    pub session: Session,
    /// The peer's identity (an accepted connection under mutual TLS).
    pub identity: Option<Identity>,
}

/// Frames of the handshake are never tagged.
async fn write_frame(writer: &mut WriteStream, frame: &Frame<'_>) -> Result<(), Failure> {
    let mut out = Vec::new();
    frame
        .encode(&mut Sealer::new(None), &mut out, HANDSHAKE_MAX_FRAME)
        .map_err(HandshakeError::from)?;
    writer.write_all(&out).await.map_err(|_| Failure::Io)?;
    writer.flush().await.map_err(|_| Failure::Io)
}

async fn read_raw(reader: &mut Reader) -> Result<BytesMut, Failure> {
    match reader.next().await {
        Some(Ok(frame)) => Ok(frame),
        _ => Err(Failure::Io),
    }
}

/// A connection's two halves, ready for the handshake, and the peer's identity.
pub(crate) struct Halves {
    reader: Reader,
    writer: WriteStream,
    identity: Option<Identity>,
}

impl Halves {
    fn new(read: ReadStream, writer: WriteStream, identity: Option<Identity>) -> Self {
        let codec = LengthDelimitedCodec::builder()
            .max_frame_length(HANDSHAKE_MAX_FRAME)
            .new_codec();
        Self {
            reader: FramedRead::new(read, codec),
            writer,
            identity,
        }
    }

    fn plain(stream: TcpStream) -> Self {
        let (read, write) = stream.into_split();
        Self::new(Box::new(read), Box::new(write), None)
    }

    #[cfg(feature = "tls")]
    fn tls(
        stream: impl AsyncRead + AsyncWrite + Send + 'static,
        identity: Option<Identity>,
    ) -> Self {
        let (read, write) = tokio::io::split(stream);
        Self::new(Box::new(read), Box::new(write), identity)
    }
}

/// The connecting side's transport: TLS over `stream` in the TLS mode (the listening node's
/// certificate checked for `name`), the socket itself otherwise.
pub(crate) async fn secure_connect(
    node: &Context,
    stream: TcpStream,
    name: &crate::tcp::peer::PeerAddr,
) -> Result<Halves, Failure> {
    // Latency matters more than packet count: batches are formed above the socket already.
    let _ = stream.set_nodelay(true);
    #[cfg(feature = "tls")]
    if let Some(tls) = node.options.tls() {
        let name = crate::tcp::tls::server_name(name).map_err(Failure::Tls)?;
        let stream = tls
            .connect(name, stream)
            .await
            .map_err(|err| Failure::Tls(format!("TLS: {}", ErrorChain(&err))))?;
        return Ok(Halves::tls(stream, None));
    }
    let _ = (node, name);
    Ok(Halves::plain(stream))
}

/// The accepting side's transport: TLS in the TLS mode, the socket itself otherwise. A peer
/// of the other kind is refused by its first byte, with a clear reason.
pub(crate) async fn secure_accept(node: &Context, stream: TcpStream) -> Result<Halves, Failure> {
    let _ = stream.set_nodelay(true);
    let mut first = [0; 1];
    let speaks_tls = match stream.peek(&mut first).await {
        Ok(1) => first[0] == TLS_HANDSHAKE_RECORD,
        _ => return Err(Failure::Io),
    };
    #[cfg(feature = "tls")]
    if let Some(tls) = node.options.tls() {
        if !speaks_tls {
            return Err(Failure::Tls(
                "the peer does not speak TLS, and this node requires it".to_string(),
            ));
        }
        let (stream, identity) = tls
            .accept(stream)
            .await
            .map_err(|err| Failure::Tls(format!("TLS: {}", ErrorChain(&err))))?;
        return Ok(Halves::tls(stream, identity));
    }
    let _ = node;
    if speaks_tls {
        return Err(Failure::Tls(
            "the peer speaks TLS, and this node does not".to_string(),
        ));
    }
    Ok(Halves::plain(stream))
}

fn established(halves: Halves, local: &Local, session: Session) -> Established {
    let Halves {
        mut reader,
        writer,
        identity,
    } = halves;
    reader
        .decoder_mut()
        .set_max_frame_length(local.max_frame_length as usize);
    Established {
        reader,
        writer,
        session,
        identity,
    }
}

/// The connecting side's handshake.
pub(crate) async fn connect_handshake(
    halves: Halves,
    local: &Local,
) -> Result<Established, Failure> {
    let mut halves = halves;
    let Halves { reader, writer, .. } = &mut halves;
    let (client, hello) = Client::start(local, random_nonce());
    write_frame(writer, &hello).await?;
    let challenge = read_raw(reader).await?;
    let (proof, waiting) = client.handle(
        local,
        &Frame::decode(&challenge).map_err(HandshakeError::from)?,
    )?;
    write_frame(writer, &proof).await?;
    let accepted = read_raw(reader).await?;
    let session = waiting.handle(&accepted)?;
    Ok(established(halves, local, session))
}

/// The accepting side's handshake.
pub(crate) async fn accept_handshake(
    halves: Halves,
    local: &Local,
) -> Result<Established, Failure> {
    let mut halves = halves;
    let Halves { reader, writer, .. } = &mut halves;
    let hello = read_raw(reader).await?;
    let (server, challenge) = Server::start(local, &hello, random_nonce())?;
    write_frame(writer, &challenge).await?;
    let proof = read_raw(reader).await?;
    let mut session =
        server.handle(local, &Frame::decode(&proof).map_err(HandshakeError::from)?)?;
    let mut accepted = Vec::new();
    Frame::Accepted
        .encode(&mut session.sealer, &mut accepted, HANDSHAKE_MAX_FRAME)
        .map_err(HandshakeError::from)?;
    writer.write_all(&accepted).await.map_err(|_| Failure::Io)?;
    writer.flush().await.map_err(|_| Failure::Io)?;
    Ok(established(halves, local, session))
}

/// A fresh handshake nonce from the OS CSPRNG.
fn random_nonce() -> Nonce {
    random_bytes()
}
