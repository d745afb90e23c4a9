//! The handshake as a pure state machine: frames in, frames out, no I/O.
//!
//! ```text
//! client (connects)                                   server (accepts)
//! Hello { magic, version V, node_id C, nonce Nc,
//!         authenticated, max_frame_length }  ───────▶ checks magic, version, mode
//!                                             ◀─────── Challenge { version v, node_id S,
//!                                                        nonce Ns, max_frame_length, proof S }
//! checks version, mode, proof S
//! Proof { proof C }                          ───────▶ checks proof C
//!                                             ◀─────── Accepted (the first tagged frame)
//! ```
//!
//! # Versions
//!
//! Each side speaks a range of protocol versions ([`Local::versions`]). The client offers `V`,
//! the highest it is set to use ([`Local::wire_version`]); the server answers with
//! `v = min(V, its highest)` if that is one it speaks, else refuses the client
//! ([`HandshakeError::Version`]); the client accepts `v` if it lies between its lowest version
//! and `V`, else refuses the server. One round trip settles the connection on the highest
//! version both speak ([`Session::version`]), at which every later frame is encoded and
//! decoded. A `Hello` of a version newer than this crate's may be longer than its own (a later
//! version appends fields to it): the server reads what it knows and answers with its highest
//! version, so a client of the next release connects to this one.
//!
//! # Authentication
//!
//! With a secret K and the transcript `t` (every field either side announced, so magic,
//! versions, node ids `C` and `S`, nonces `Nc` and `Ns`, the client's mode and both frame
//! limits): `proof S = HMAC-SHA256(K, "actix-delivery/1 server proof\0" ‖ t)`, `proof C` the
//! same with "client proof", and the session keys of each direction the same with their own
//! labels. The transcript of a `Hello` of version 3 or 4 is
//!
//! ```text
//! t = the Hello's bytes ‖ the Challenge without its proof, encoded
//! ```
//!
//! (a `Hello` of these versions is exactly its known fields, and bincode's encoding of a fixed
//! type is self-delimiting), and that of a `Hello` of any version above 4, which may be
//! longer than its known fields (the format of future releases, [`LENGTH_BOUND_HELLO_VERSION`]
//! on),
//!
//! ```text
//! t = len ‖ the Hello's bytes ‖ the Challenge without its proof, encoded
//! ```
//!
//! where `len` is the number of the `Hello`'s bytes as a `u32`, 4 bytes little endian, so
//! that no byte can move between the end of the `Hello` and the start of the `Challenge`
//! without changing `t`. Every later release computes `t` the same way for a `Hello` above
//! version 4 (see [`Hello`]). The `Hello`'s bytes are those the client sent and the server
//! received (the payload after the frame kind), not a re-encoding of the fields this crate
//! knows, so that the fields a newer client appended are bound too; for a `Hello` of this
//! crate's versions they are the canonical encoding that earlier releases bind. Each side's
//! proof covers the other side's fresh nonce, so a recorded handshake replayed to either side
//! fails; the labels differ, so a proof reflected to its maker fails; both node ids are bound,
//! so a proof made for one pair of nodes fails for another; every announced value is bound, so
//! one altered on the path (a lowered frame limit, an offered version, say) fails the
//! handshake. Proofs are compared in constant time; the secret never crosses the wire. Every
//! frame after the handshake carries a tag under the session key of its direction over its
//! number and payload (see [`Sealer`]).
//!
//! Without a secret (the explicitly insecure mode) the proofs are `None` and frames carry no tag;
//! a node of one mode refuses a peer of the other, so a misconfiguration never degrades a
//! secured cluster silently.

use std::ops::RangeInclusive;

use crate::codec::{self, MAX_ENCODED_BYTES};
use crate::error::OptionsError;
use crate::tcp::auth::{NodeId, NodeSecret, Nonce, Opener, Role, Sealer, Transcript};
use crate::tcp::frame::{
    Challenge, Frame, FrameError, Hello, Proof, LENGTH_BOUND_HELLO_VERSION, MAGIC,
    MIN_PROTOCOL_VERSION, PROTOCOL_VERSION,
};

/// The smallest `max_frame_length` a node may announce.
pub(crate) const MIN_FRAME_LENGTH: usize = 4096;

/// What one node brings to its handshakes.
#[derive(Debug)]
pub struct Local {
    /// This run's id.
    pub node_id: NodeId,
    /// `None`: the explicitly insecure mode.
    pub secret: Option<NodeSecret>,
    /// The largest frame this node accepts.
    pub max_frame_length: u32,
    /// The protocol versions this node speaks: [`MIN_PROTOCOL_VERSION`] to
    /// [`PROTOCOL_VERSION`] ([`Local::VERSIONS`]). As a server it answers with the highest of
    /// them that the client offers.
    pub versions: RangeInclusive<u16>,
    /// The version this node offers as a client: the highest of `versions` unless a rolling
    /// upgrade keeps an older one (the node's `wire_version`). As a client the node accepts
    /// only an answer within `versions` and up to this offer: a `wire_version` above
    /// `versions` is offered, and an answer above them refused ([`HandshakeError::Version`]).
    pub wire_version: u16,
}

impl Local {
    /// The protocol versions this crate speaks.
    pub const VERSIONS: RangeInclusive<u16> = MIN_PROTOCOL_VERSION..=PROTOCOL_VERSION;
}

/// Why a handshake failed. The connection is closed; nothing it carried reached a consumer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HandshakeError {
    /// The two sides speak no protocol version in common.
    #[error(
        "no protocol version in common: this node speaks versions {lowest} to {highest}, the \
         peer {peer} at most"
    )]
    Version {
        /// The lowest version this node speaks.
        lowest: u16,
        /// The highest version this node speaks here: its highest as a server, the version it
        /// offered as a client.
        highest: u16,
        /// The peer's: the version a client offered (its highest), or the one a server chose
        /// (the highest it speaks up to this node's offer).
        peer: u16,
    },
    /// This node has a secret, the peer does not authenticate.
    #[error("the peer does not authenticate, and this node requires it")]
    PeerUnauthenticated,
    /// This node runs without a secret, the peer authenticates.
    #[error("the peer authenticates, and this node has no secret")]
    PeerAuthenticates,
    /// The peer's proof is wrong: another secret, or a replayed or reflected handshake.
    #[error("the peer's proof does not verify (another secret, or a replayed handshake)")]
    BadProof,
    /// The peer is this node itself.
    #[error("the peer is this node itself")]
    SelfConnection,
    /// The peer accepts frames too small for this protocol.
    #[error("the peer's max_frame_length {0} is below the minimum 4096")]
    FrameLimit(u32),
    /// A frame that does not belong at this point of the handshake, or does not decode.
    #[error("unexpected or malformed handshake frame: {0}")]
    Unexpected(String),
}

impl From<FrameError> for HandshakeError {
    fn from(err: FrameError) -> Self {
        Self::Unexpected(err.to_string())
    }
}

/// An established session: who the peer is, the protocol version, and the tagging of both
/// directions.
pub struct Session {
    /// The peer's id for its current run.
    pub peer: NodeId,
    /// The protocol version of the connection, the highest both sides speak: every frame
    /// after the handshake is encoded and decoded at it.
    pub version: u16,
    /// The largest frame the peer accepts.
    pub peer_max_frame_length: usize,
    /// Tags what this side sends.
    pub sealer: Sealer,
    /// Checks what this side receives.
    pub opener: Opener,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("peer", &self.peer)
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

/// What the handshake settled, besides the keys.
struct Settled {
    peer: NodeId,
    peer_max: u32,
    version: u16,
}

fn session(local: &Local, role: Role, transcript: &Transcript, settled: Settled) -> Session {
    let keys = local.secret.as_ref().map(|s| s.session_keys(transcript));
    let (send, receive) = match (&keys, role) {
        (Some((c2s, s2c)), Role::Client) => (Some(c2s), Some(s2c)),
        (Some((c2s, s2c)), Role::Server) => (Some(s2c), Some(c2s)),
        (None, _) => (None, None),
    };
    Session {
        peer: settled.peer,
        version: settled.version,
        peer_max_frame_length: settled.peer_max as usize,
        sealer: Sealer::new(send),
        opener: Opener::new(receive),
    }
}

fn check_peer(local: &Local, peer: NodeId, max: u32) -> Result<(), HandshakeError> {
    if peer == local.node_id {
        return Err(HandshakeError::SelfConnection);
    }
    if (max as usize) < MIN_FRAME_LENGTH {
        return Err(HandshakeError::FrameLimit(max));
    }
    Ok(())
}

/// What the proofs and session keys cover, for a `Hello` of `version` whose bytes (as sent and
/// received) are `hello`: of versions 3 and 4, the `Hello`'s bytes and the `Challenge` without
/// its proof, encoded (a `Hello` of these versions is exactly its known fields, and bincode's
/// encoding of a fixed type is self-delimiting); of a version above 4 (whose `Hello` may be
/// longer), the `Hello`'s length as a 4-byte little-endian `u32` first, so that the boundary
/// between the two is bound too (see [`Hello`]).
pub(crate) fn transcript(hello: &[u8], version: u16, challenge: &Challenge) -> Transcript {
    let unproved = Challenge {
        proof: None,
        ..challenge.clone()
    };
    let mut bytes = Vec::with_capacity(hello.len() + 68);
    if version >= LENGTH_BOUND_HELLO_VERSION {
        // Within HANDSHAKE_MAX_FRAME, far below u32::MAX.
        let len = u32::try_from(hello.len()).expect("a Hello fits one handshake frame");
        bytes.extend_from_slice(&len.to_le_bytes());
    }
    bytes.extend_from_slice(hello);
    // A few dozen bytes of fixed-size fields: far below the codec's limit.
    codec::encode_into(&unproved, &mut bytes).expect("a Challenge encodes");
    Transcript::new(bytes)
}

fn unexpected(frame: &Frame<'_>) -> HandshakeError {
    let kind = match frame {
        Frame::Hello(_) => "Hello",
        Frame::Challenge(_) => "Challenge",
        Frame::Proof(_) => "Proof",
        Frame::Accepted => "Accepted",
        Frame::Deliveries(_) => "Deliveries",
        Frame::Acks(_) => "Acks",
        Frame::Ping => "Ping",
    };
    HandshakeError::Unexpected(format!("a {kind} frame"))
}

/// The connecting side, waiting for the server's [`Challenge`].
#[derive(Debug)]
pub struct Client {
    /// The `Hello` sent, encoded (the payload after the frame kind).
    hello: Vec<u8>,
    /// The version offered.
    offered: u16,
}

impl Client {
    /// Starts a handshake with a fresh `nonce`, offering [`Local::wire_version`]; send the
    /// returned `Hello`.
    pub fn start(local: &Local, nonce: Nonce) -> (Self, Frame<'static>) {
        let hello = Hello {
            magic: MAGIC,
            version: local.wire_version,
            node_id: local.node_id,
            nonce,
            authenticated: local.secret.is_some(),
            max_frame_length: local.max_frame_length,
        };
        // A few dozen bytes of fixed-size fields: far below the codec's limit.
        let bytes = codec::encode(&hello).expect("a Hello encodes");
        let client = Self {
            hello: bytes,
            offered: local.wire_version,
        };
        (client, Frame::Hello(hello))
    }

    /// Checks the server's answer; on success send the returned `Proof` and wait for
    /// `Accepted` ([`AwaitingAccepted`]).
    ///
    /// # Errors
    /// Why the server is refused.
    pub fn handle(
        self,
        local: &Local,
        frame: &Frame<'_>,
    ) -> Result<(Frame<'static>, AwaitingAccepted), HandshakeError> {
        let Frame::Challenge(challenge) = frame else {
            return Err(unexpected(frame));
        };
        let Challenge {
            version,
            node_id,
            max_frame_length,
            proof,
            ..
        } = challenge;
        // Up to the offer, and never above what this node speaks (`Local` is built by hand
        // too: a `wire_version` above `versions` must not admit a version it cannot encode).
        let lowest = *local.versions.start();
        let highest = self.offered.min(*local.versions.end());
        if !(lowest..=highest).contains(version) {
            return Err(HandshakeError::Version {
                lowest,
                highest,
                peer: *version,
            });
        }
        check_peer(local, *node_id, *max_frame_length)?;
        let transcript = transcript(&self.hello, self.offered, challenge);
        let answer = match (&local.secret, proof) {
            (Some(secret), Some(proof)) => {
                if !secret.verify(Role::Server, &transcript, proof) {
                    return Err(HandshakeError::BadProof);
                }
                Some(secret.prove(Role::Client, &transcript))
            }
            (Some(_), None) => return Err(HandshakeError::PeerUnauthenticated),
            (None, Some(_)) => return Err(HandshakeError::PeerAuthenticates),
            (None, None) => None,
        };
        let settled = Settled {
            peer: *node_id,
            peer_max: *max_frame_length,
            version: *version,
        };
        let session = session(local, Role::Client, &transcript, settled);
        Ok((
            Frame::Proof(Proof { proof: answer }),
            AwaitingAccepted(session),
        ))
    }
}

/// The connecting side after its proof: the next frame must be a correctly tagged `Accepted`.
#[derive(Debug)]
pub struct AwaitingAccepted(Session);

impl AwaitingAccepted {
    /// Checks the server's first tagged frame (its whole payload, tag included).
    ///
    /// # Errors
    /// A wrong tag or another frame.
    pub fn handle(mut self, payload: &[u8]) -> Result<Session, HandshakeError> {
        let opened = self
            .0
            .opener
            .open(payload)
            .ok_or(HandshakeError::BadProof)?;
        match Frame::decode(opened)? {
            Frame::Accepted => Ok(self.0),
            other => Err(unexpected(&other)),
        }
    }
}

/// The accepting side, waiting for the client's [`Proof`].
pub struct Server {
    transcript: Transcript,
    client: NodeId,
    client_max: u32,
    version: u16,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("client", &self.client)
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

impl Server {
    /// Checks the client's first frame, `payload` as received (a `Hello`, read as
    /// [`Frame::decode_opening`] reads it), and answers with a `Challenge` under a fresh
    /// `nonce`, at the highest version both speak.
    ///
    /// # Errors
    /// Why the client is refused.
    pub fn start(
        local: &Local,
        payload: &[u8],
        nonce: Nonce,
    ) -> Result<(Self, Frame<'static>), HandshakeError> {
        let (frame, hello_bytes) = Frame::decode_opening(payload)?;
        let Frame::Hello(hello) = &frame else {
            return Err(unexpected(&frame));
        };
        let (lowest, highest) = (*local.versions.start(), *local.versions.end());
        let version = hello.version.min(highest);
        if version < lowest {
            return Err(HandshakeError::Version {
                lowest,
                highest,
                peer: hello.version,
            });
        }
        check_peer(local, hello.node_id, hello.max_frame_length)?;
        match (local.secret.is_some(), hello.authenticated) {
            (true, false) => return Err(HandshakeError::PeerUnauthenticated),
            (false, true) => return Err(HandshakeError::PeerAuthenticates),
            _ => {}
        }
        let mut challenge = Challenge {
            version,
            node_id: local.node_id,
            nonce,
            max_frame_length: local.max_frame_length,
            proof: None,
        };
        let transcript = transcript(hello_bytes, hello.version, &challenge);
        challenge.proof = local
            .secret
            .as_ref()
            .map(|s| s.prove(Role::Server, &transcript));
        let server = Self {
            transcript,
            client: hello.node_id,
            client_max: hello.max_frame_length,
            version,
        };
        Ok((server, Frame::Challenge(challenge)))
    }

    /// Checks the client's proof; on success send `Accepted` through the session's sealer.
    ///
    /// # Errors
    /// Why the client is refused.
    pub fn handle(self, local: &Local, frame: &Frame<'_>) -> Result<Session, HandshakeError> {
        let Frame::Proof(Proof { proof }) = frame else {
            return Err(unexpected(frame));
        };
        let transcript = &self.transcript;
        match (&local.secret, proof) {
            (Some(secret), Some(proof)) if secret.verify(Role::Client, transcript, proof) => {}
            (None, None) => {}
            _ => return Err(HandshakeError::BadProof),
        }
        let settled = Settled {
            peer: self.client,
            peer_max: self.client_max,
            version: self.version,
        };
        Ok(session(local, Role::Server, transcript, settled))
    }
}

/// The `wire_version` setting of every carrier: a protocol version this crate speaks.
pub fn check_wire_version(version: u16) -> Result<(), OptionsError> {
    if !Local::VERSIONS.contains(&version) {
        return Err(OptionsError::new(
            "wire_version",
            format!(
                "must be a protocol version this release speaks, {MIN_PROTOCOL_VERSION} to \
                 {PROTOCOL_VERSION} (got {version})"
            ),
        ));
    }
    Ok(())
}

/// The frame and output limits every carrier has: a frame of 4 KiB to 16 MiB, an output of
/// at least two frames and at most 1 GiB.
pub fn check_frame_limits(
    max_frame_length: usize,
    max_output_bytes: usize,
) -> Result<(), OptionsError> {
    let max_frame = MAX_ENCODED_BYTES as usize;
    if !(MIN_FRAME_LENGTH..=max_frame).contains(&max_frame_length) {
        return Err(OptionsError::new(
            "max_frame_length",
            format!(
                "must lie between {MIN_FRAME_LENGTH} and {max_frame} bytes (got \
                 {max_frame_length})"
            ),
        ));
    }
    if max_output_bytes < 2 * max_frame_length || max_output_bytes > 1 << 30 {
        return Err(OptionsError::new(
            "max_output_bytes",
            format!("must lie between twice max_frame_length and 1 GiB (got {max_output_bytes})"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local(id: u8, secret: Option<&[u8]>) -> Local {
        Local {
            node_id: NodeId::from_bytes([id; 16]),
            secret: secret.map(|s| NodeSecret::new(s).unwrap()),
            max_frame_length: 1 << 20,
            versions: Local::VERSIONS,
            wire_version: PROTOCOL_VERSION,
        }
    }

    /// A node speaking `versions`, offering the highest of them.
    fn speaking(id: u8, versions: RangeInclusive<u16>) -> Local {
        Local {
            wire_version: *versions.end(),
            versions,
            ..local(id, Some(K))
        }
    }

    /// The payload of an untagged frame, as the server receives it.
    fn opening(frame: &Frame<'_>) -> Vec<u8> {
        let mut out = Vec::new();
        frame
            .encode(&mut Sealer::new(None), &mut out, 1 << 20)
            .unwrap();
        out.split_off(crate::tcp::frame::LENGTH_PREFIX)
    }

    const K: &[u8] = b"0123456789abcdef0123456789abcdef";
    const OTHER: &[u8] = b"fedcba9876543210fedcba9876543210";

    /// Runs a whole handshake; returns both sessions or the first error.
    fn run(
        client: &Local,
        server: &Local,
        nonces: (Nonce, Nonce),
    ) -> Result<(Session, Session), HandshakeError> {
        let (c, hello) = Client::start(client, nonces.0);
        let (s, challenge) = Server::start(server, &opening(&hello), nonces.1)?;
        let (proof, waiting) = c.handle(client, &challenge)?;
        let mut server_session = s.handle(server, &proof)?;
        let mut accepted = Vec::new();
        Frame::Accepted
            .encode(&mut server_session.sealer, &mut accepted, 1 << 20)
            .unwrap();
        let client_session = waiting.handle(&accepted[4..])?;
        Ok((client_session, server_session))
    }

    fn exchange(from: &mut Session, to: &mut Session) -> bool {
        let mut out = Vec::new();
        Frame::Ping
            .encode(&mut from.sealer, &mut out, 1 << 20)
            .unwrap();
        to.opener
            .open(&out[4..])
            .is_some_and(|p| Frame::decode(p) == Ok(Frame::Ping))
    }

    #[test]
    fn a_good_handshake_authenticates_both_sides_and_keys_both_directions() {
        let (client, server) = (local(1, Some(K)), local(2, Some(K)));
        let (mut c, mut s) = run(&client, &server, ([1; 32], [2; 32])).unwrap();
        assert_eq!(c.peer, server.node_id);
        assert_eq!(s.peer, client.node_id);
        assert_eq!(c.peer_max_frame_length, 1 << 20);
        assert!(exchange(&mut c, &mut s));
        assert!(exchange(&mut s, &mut c));
        // A frame of one direction reflected back to its sender fails there.
        let mut out = Vec::new();
        Frame::Ping
            .encode(&mut c.sealer, &mut out, 1 << 20)
            .unwrap();
        assert!(c.opener.open(&out[4..]).is_none());
    }

    #[test]
    fn a_wrong_secret_is_refused_by_the_client_and_by_the_server() {
        let (client, server) = (local(1, Some(K)), local(2, Some(OTHER)));
        assert_eq!(
            run(&client, &server, ([1; 32], [2; 32])).unwrap_err(),
            HandshakeError::BadProof
        );
        // A client that skips checking the challenge still cannot produce the server's
        // expected proof.
        let (_, hello) = Client::start(&client, [1; 32]);
        let (s, _) = Server::start(&server, &opening(&hello), [2; 32]).unwrap();
        let forged = Frame::Proof(Proof {
            proof: Some([0; 32]),
        });
        assert_eq!(
            s.handle(&server, &forged).unwrap_err(),
            HandshakeError::BadProof
        );
    }

    #[test]
    fn no_secret_and_a_secret_refuse_each_other_both_ways() {
        let (secure, insecure) = (local(1, Some(K)), local(2, None));
        assert_eq!(
            run(&insecure, &secure, ([1; 32], [2; 32])).unwrap_err(),
            HandshakeError::PeerUnauthenticated,
            "refused by the secure server"
        );
        assert_eq!(
            run(&secure, &insecure, ([1; 32], [2; 32])).unwrap_err(),
            HandshakeError::PeerAuthenticates,
            "refused by the insecure server"
        );
        // A client that lies about its mode in the Hello still fails at the proof.
        let (c, mut hello) = Client::start(&insecure, [1; 32]);
        if let Frame::Hello(h) = &mut hello {
            h.authenticated = true;
        }
        let secure_server = local(3, Some(K));
        let (s, challenge) = Server::start(&secure_server, &opening(&hello), [2; 32]).unwrap();
        assert_eq!(
            c.handle(&insecure, &challenge).unwrap_err(),
            HandshakeError::PeerAuthenticates
        );
        let bare = Frame::Proof(Proof { proof: None });
        assert_eq!(
            s.handle(&secure_server, &bare).unwrap_err(),
            HandshakeError::BadProof
        );
        // Two insecure nodes do connect, with untagged frames.
        let (mut c, mut s) = run(&local(4, None), &local(5, None), ([1; 32], [2; 32])).unwrap();
        assert_eq!(c.sealer.overhead(), 0);
        assert!(exchange(&mut c, &mut s));
    }

    #[test]
    fn a_replayed_proof_fails_against_a_fresh_server_nonce() {
        let (client, server) = (local(1, Some(K)), local(2, Some(K)));
        // A recorded handshake: Hello and Proof of the client.
        let (c, hello) = Client::start(&client, [1; 32]);
        let (_, challenge) = Server::start(&server, &opening(&hello), [2; 32]).unwrap();
        let (recorded_proof, _) = c.handle(&client, &challenge).unwrap();
        // The attacker replays both to the server, which draws a new nonce.
        let (s, _) = Server::start(&server, &opening(&hello), [3; 32]).unwrap();
        assert_eq!(
            s.handle(&server, &recorded_proof).unwrap_err(),
            HandshakeError::BadProof
        );
    }

    #[test]
    fn a_replayed_challenge_fails_against_a_fresh_client_nonce() {
        let (client, server) = (local(1, Some(K)), local(2, Some(K)));
        let (_, hello) = Client::start(&client, [1; 32]);
        let (_, recorded_challenge) = Server::start(&server, &opening(&hello), [2; 32]).unwrap();
        let (c, _) = Client::start(&client, [9; 32]);
        assert_eq!(
            c.handle(&client, &recorded_challenge).unwrap_err(),
            HandshakeError::BadProof
        );
    }

    #[test]
    fn a_reflected_challenge_is_no_proof() {
        // An attacker without the secret connects to the server, gets its Challenge, and
        // returns the server's own proof as its Proof.
        let server = local(2, Some(K));
        let attacker = local(1, None);
        let (_, mut hello) = Client::start(&attacker, [1; 32]);
        if let Frame::Hello(h) = &mut hello {
            h.authenticated = true;
        }
        let (s, challenge) = Server::start(&server, &opening(&hello), [2; 32]).unwrap();
        let Frame::Challenge(Challenge { proof, .. }) = challenge else {
            unreachable!()
        };
        let reflected = Frame::Proof(Proof { proof });
        assert_eq!(
            s.handle(&server, &reflected).unwrap_err(),
            HandshakeError::BadProof
        );
        // And a client's Hello reflected to itself is its own node id: refused.
        let client = local(1, Some(K));
        let (c, hello) = Client::start(&client, [1; 32]);
        assert_eq!(
            Server::start(&client, &opening(&hello), [2; 32]).unwrap_err(),
            HandshakeError::SelfConnection
        );
        let (_, challenge) = Server::start(&server, &opening(&hello), [2; 32]).unwrap();
        let mut own = challenge;
        if let Frame::Challenge(ch) = &mut own {
            ch.node_id = client.node_id;
        }
        assert_eq!(
            c.handle(&client, &own).unwrap_err(),
            HandshakeError::SelfConnection
        );
    }

    #[test]
    fn an_altered_frame_limit_fails_the_handshake_both_ways() {
        let (client, server) = (local(1, Some(K)), local(2, Some(K)));
        // On the path, the client's announced limit is lowered (still a valid value).
        let (c, mut hello) = Client::start(&client, [1; 32]);
        if let Frame::Hello(h) = &mut hello {
            h.max_frame_length = 4096;
        }
        let (_, challenge) = Server::start(&server, &opening(&hello), [2; 32]).unwrap();
        assert_eq!(
            c.handle(&client, &challenge).unwrap_err(),
            HandshakeError::BadProof,
            "the client sees that the server's proof covers another Hello"
        );
        // And the server's announced limit, on its way back.
        let (c, hello) = Client::start(&client, [1; 32]);
        let (_, mut challenge) = Server::start(&server, &opening(&hello), [2; 32]).unwrap();
        if let Frame::Challenge(ch) = &mut challenge {
            ch.max_frame_length = 1 << 24;
        }
        assert_eq!(
            c.handle(&client, &challenge).unwrap_err(),
            HandshakeError::BadProof
        );
    }

    #[test]
    fn every_announced_field_is_bound_by_the_proofs() {
        let (client, server) = (local(1, Some(K)), local(2, Some(K)));
        let (_, hello) = Client::start(&client, [1; 32]);
        let (_, challenge) = Server::start(&server, &opening(&hello), [2; 32]).unwrap();
        let (Frame::Hello(hello), Frame::Challenge(challenge)) = (hello, challenge) else {
            unreachable!()
        };
        let secret = NodeSecret::new(K).unwrap();
        let bytes = |hello: &Hello| codec::encode(hello).unwrap();
        let proof = secret.prove(
            Role::Server,
            &transcript(&bytes(&hello), hello.version, &challenge),
        );
        let mut hellos = vec![hello.clone(); 6];
        hellos[0].magic[0] ^= 1;
        hellos[1].version ^= 1;
        hellos[2].node_id = NodeId::from_bytes([9; 16]);
        hellos[3].nonce[0] ^= 1;
        hellos[4].authenticated ^= true;
        hellos[5].max_frame_length ^= 1;
        let mut challenges = vec![challenge.clone(); 4];
        challenges[0].version ^= 1;
        challenges[1].node_id = NodeId::from_bytes([9; 16]);
        challenges[2].nonce[0] ^= 1;
        challenges[3].max_frame_length ^= 1;
        let altered = hellos
            .iter()
            .map(|h| transcript(&bytes(h), h.version, &challenge))
            .chain(
                challenges
                    .iter()
                    .map(|ch| transcript(&bytes(&hello), hello.version, ch)),
            );
        for (i, altered) in altered.enumerate() {
            assert!(!secret.verify(Role::Server, &altered, &proof), "field {i}");
        }
        // The proof is not part of what it proves.
        let mut other_proof = challenge.clone();
        other_proof.proof = Some([0; 32]);
        assert!(secret.verify(
            Role::Server,
            &transcript(&bytes(&hello), hello.version, &other_proof),
            &proof
        ));

        // A server that saw an altered limit refuses the proof the client made over its own.
        let (s, _) =
            Server::start(&server, &opening(&Frame::Hello(hellos[5].clone())), [2; 32]).unwrap();
        let genuine = Frame::Proof(Proof {
            proof: Some(secret.prove(
                Role::Client,
                &transcript(&bytes(&hello), hello.version, &challenge),
            )),
        });
        assert_eq!(
            s.handle(&server, &genuine).unwrap_err(),
            HandshakeError::BadProof
        );
    }

    /// The version both sessions settled on, and the version the server's Challenge named.
    fn settled(client: &Local, server: &Local) -> Result<(u16, u16), HandshakeError> {
        let (c, s) = run(client, server, ([1; 32], [2; 32]))?;
        Ok((c.version, s.version))
    }

    #[test]
    fn two_nodes_of_this_release_settle_on_version_4() {
        let (client, server) = (local(1, Some(K)), local(2, Some(K)));
        assert_eq!(settled(&client, &server), Ok((4, 4)));
        let (_, hello) = Client::start(&client, [1; 32]);
        let (_, challenge) = Server::start(&server, &opening(&hello), [2; 32]).unwrap();
        assert!(matches!(hello, Frame::Hello(Hello { version: 4, .. })));
        assert!(matches!(
            challenge,
            Frame::Challenge(Challenge { version: 4, .. })
        ));
    }

    #[test]
    fn a_client_offering_3_settles_on_3_with_a_server_of_3_to_4() {
        let client = Local {
            wire_version: 3,
            ..local(1, Some(K))
        };
        assert_eq!(settled(&client, &local(2, Some(K))), Ok((3, 3)));
    }

    #[test]
    fn a_client_offering_4_settles_on_3_with_a_server_speaking_only_3() {
        let server = speaking(2, 3..=3);
        assert_eq!(settled(&local(1, Some(K)), &server), Ok((3, 3)));
    }

    #[test]
    fn nodes_without_a_version_in_common_refuse_each_other_naming_both_sides() {
        // The server answers 3, the highest it speaks; the client speaks 4 only.
        let refused = settled(&speaking(1, 4..=4), &speaking(2, 3..=3)).unwrap_err();
        assert_eq!(
            refused,
            HandshakeError::Version {
                lowest: 4,
                highest: 4,
                peer: 3
            }
        );
        assert_eq!(
            refused.to_string(),
            "no protocol version in common: this node speaks versions 4 to 4, the peer 3 at most"
        );
        // The server refuses a client whose offer is below what it speaks.
        let refused = settled(&speaking(1, 3..=3), &speaking(2, 4..=4)).unwrap_err();
        assert_eq!(
            refused,
            HandshakeError::Version {
                lowest: 4,
                highest: 4,
                peer: 3
            }
        );
        // A server answering above the client's offer, or below its range, is refused.
        let client = Local {
            wire_version: 3,
            ..local(1, Some(K))
        };
        for answered in [4, 2] {
            let (c, hello) = Client::start(&client, [1; 32]);
            let (_, mut challenge) =
                Server::start(&local(2, Some(K)), &opening(&hello), [2; 32]).unwrap();
            if let Frame::Challenge(ch) = &mut challenge {
                ch.version = answered;
            }
            assert_eq!(
                c.handle(&client, &challenge).unwrap_err(),
                HandshakeError::Version {
                    lowest: 3,
                    highest: 3,
                    peer: answered
                }
            );
        }
    }

    #[test]
    fn a_client_refuses_a_version_above_those_it_speaks_whatever_it_offered() {
        // A wire_version above the versions the node speaks (Local is public): the offer goes
        // out, but a server answering above the node's range is refused, not accepted at a
        // version the node cannot encode.
        let client = Local {
            wire_version: 9,
            ..local(1, Some(K))
        };
        assert_eq!(
            settled(&client, &speaking(2, 3..=9)).unwrap_err(),
            HandshakeError::Version {
                lowest: 3,
                highest: 4,
                peer: 9
            }
        );
        // A server of this release answers 4: accepted.
        assert_eq!(settled(&client, &local(2, Some(K))), Ok((4, 4)));
    }

    #[test]
    fn a_downgraded_offer_fails_the_proofs() {
        let (client, server) = (local(1, Some(K)), local(2, Some(K)));
        let (c, mut hello) = Client::start(&client, [1; 32]);
        if let Frame::Hello(h) = &mut hello {
            h.version = 3; // on the path
        }
        let (_, challenge) = Server::start(&server, &opening(&hello), [2; 32]).unwrap();
        assert!(matches!(
            challenge,
            Frame::Challenge(Challenge { version: 3, .. })
        ));
        assert_eq!(
            c.handle(&client, &challenge).unwrap_err(),
            HandshakeError::BadProof
        );
    }

    /// A client of a later release (speaking 3 to 9, offering 9) and the payload of its
    /// opening frame: a version 9 Hello with 20 bytes of fields this release does not know
    /// appended, built by hand as it would send it.
    fn future_client() -> (Local, Vec<u8>) {
        let future = Local {
            versions: 3..=9,
            wire_version: 9,
            ..local(1, Some(K))
        };
        let hello = Hello {
            magic: MAGIC,
            version: 9,
            node_id: future.node_id,
            nonce: [1; 32],
            authenticated: true,
            max_frame_length: future.max_frame_length,
        };
        let mut payload = vec![0]; // the kind of a Hello
        payload.extend_from_slice(&codec::encode(&hello).unwrap());
        payload.extend_from_slice(&[0xab; 20]);
        (future, payload)
    }

    #[test]
    fn a_newer_clients_longer_hello_is_answered_at_version_4_and_both_proofs_verify() {
        // A client of a later release: version 9, and 20 bytes of fields appended to its
        // Hello, built by hand as it would send them.
        let (future, payload) = future_client();
        assert!(payload.len() <= crate::tcp::frame::HANDSHAKE_MAX_FRAME);
        let server = local(2, Some(K));
        let (s, challenge) = Server::start(&server, &payload, [2; 32]).unwrap();
        let Frame::Challenge(challenge) = challenge else {
            unreachable!()
        };
        assert_eq!(challenge.version, 4);
        // The future client binds its Hello as sent, appended bytes included, after its
        // length: what the server bound, spelled out as a later release computes it.
        let secret = NodeSecret::new(K).unwrap();
        let t = transcript(&payload[1..], 9, &challenge);
        let unproved = Challenge {
            proof: None,
            ..challenge.clone()
        };
        let spelled_out = [
            &(payload.len() as u32 - 1).to_le_bytes()[..],
            &payload[1..],
            &codec::encode(&unproved).unwrap(),
        ]
        .concat();
        assert_eq!(t.bytes(), spelled_out);
        assert_eq!(s.transcript.bytes(), spelled_out, "the server's");
        let server_proof = challenge.proof.expect("authenticated");
        assert!(secret.verify(Role::Server, &t, &server_proof));
        let proof = Frame::Proof(Proof {
            proof: Some(secret.prove(Role::Client, &t)),
        });
        let mut server_session = s.handle(&server, &proof).unwrap();
        assert_eq!(server_session.version, 4);
        let settled = Settled {
            peer: server.node_id,
            peer_max: challenge.max_frame_length,
            version: challenge.version,
        };
        let mut client_session = session(&future, Role::Client, &t, settled);
        assert!(exchange(&mut client_session, &mut server_session));
        assert!(exchange(&mut server_session, &mut client_session));
        // The appended bytes are bound: other ones fail the client's proof.
        let mut altered = payload.clone();
        altered[payload.len() - 1] ^= 1;
        let (s, _) = Server::start(&server, &altered, [2; 32]).unwrap();
        assert_eq!(
            s.handle(&server, &proof).unwrap_err(),
            HandshakeError::BadProof
        );
    }

    #[test]
    fn bytes_moved_from_a_newer_clients_hello_into_a_forged_challenge_fail_the_proofs() {
        // A client of a later release offers 9, with 20 bytes of fields appended to its Hello.
        let (future, sent) = future_client();
        let client = Client {
            hello: sent[1..].to_vec(),
            offered: 9,
        };
        // On the path, an attacker appends two bytes, which the server reads as more fields
        // of a version it does not know, and answers at 4 (a server whose limit encodes in 3
        // bytes and whose nonce has 252 at byte 30: the attacker retries until it has one).
        let moved = [9, 0xcd];
        let received = [&sent[..], &moved].concat();
        let server = Local {
            max_frame_length: 4096,
            ..local(2, Some(K))
        };
        let mut nonce = [2; 32];
        nonce[30] = 252;
        let (s, challenge) = Server::start(&server, &received, nonce).unwrap();
        let Frame::Challenge(challenge) = challenge else {
            unreachable!()
        };
        assert_eq!(challenge.version, 4);
        // It moves them into the Challenge it passes on: they and the server's Challenge (its
        // proof aside) decode as one Challenge at version 9, exactly those bytes re-encoded.
        let unproved = Challenge {
            proof: None,
            ..challenge.clone()
        };
        let shifted = [&moved[..], &codec::encode(&unproved).unwrap()].concat();
        let mut forged: Challenge = codec::decode(&shifted).unwrap();
        assert_eq!(forged.version, 9);
        assert_eq!(codec::encode(&forged).unwrap(), shifted);
        forged.proof = challenge.proof;
        // Both sides' bytes, each Hello followed by its Challenge, are the same string: the
        // Hello's length is all that tells them apart.
        assert_eq!(
            [&sent[1..], &shifted[..]].concat(),
            [&received[1..], &codec::encode(&unproved).unwrap()].concat()
        );
        assert_eq!(
            client
                .handle(&future, &Frame::Challenge(forged.clone()))
                .unwrap_err(),
            HandshakeError::BadProof,
            "the server's proof covers another Hello"
        );
        // A client that went on anyway: its proof fails at the server.
        let secret = NodeSecret::new(K).unwrap();
        let t = transcript(&sent[1..], 9, &forged);
        let proof = Frame::Proof(Proof {
            proof: Some(secret.prove(Role::Client, &t)),
        });
        assert_eq!(
            s.handle(&server, &proof).unwrap_err(),
            HandshakeError::BadProof
        );
    }

    #[test]
    fn trailing_bytes_after_a_hello_of_a_known_version_are_refused() {
        let server = local(2, Some(K));
        for wire_version in [3, 4] {
            let client = Local {
                wire_version,
                ..local(1, Some(K))
            };
            let (_, hello) = Client::start(&client, [1; 32]);
            let mut payload = opening(&hello);
            assert!(Server::start(&server, &payload, [2; 32]).is_ok());
            payload.extend_from_slice(&[0xab; 20]);
            assert!(matches!(
                Server::start(&server, &payload, [2; 32]),
                Err(HandshakeError::Unexpected(_))
            ));
        }
    }

    #[test]
    fn a_hello_whose_kind_takes_more_than_one_byte_is_bound_without_the_kinds_bytes() {
        // The kind 0 written as a varint of three bytes (251, then a u16 0), which bincode
        // reads: the server binds the Hello's own bytes, those the client bound.
        let (client, server) = (local(1, Some(K)), local(2, Some(K)));
        let (c, hello) = Client::start(&client, [1; 32]);
        let mut payload = vec![251, 0, 0];
        payload.extend_from_slice(&opening(&hello)[1..]);
        let (s, challenge) = Server::start(&server, &payload, [2; 32]).unwrap();
        let (proof, _) = c
            .handle(&client, &challenge)
            .expect("the server's proof covers the client's Hello");
        assert!(s.handle(&server, &proof).is_ok());
    }

    #[test]
    fn the_transcript_of_a_version_4_handshake_is_what_the_previous_release_binds() {
        // The previous release (strict version 4) bound `encode(Hello) ‖ encode(Challenge
        // without proof)`, re-encoding the Hello it decoded; spelled out here byte by byte.
        let (client, server) = (local(1, Some(K)), local(2, Some(K)));
        let (c, hello) = Client::start(&client, [3; 32]);
        let (s, challenge) = Server::start(&server, &opening(&hello), [4; 32]).unwrap();
        let max = [252, 0, 0, 16, 0]; // 1 MiB, a varint u32
        let mut old = Vec::new();
        old.extend_from_slice(b"actixdlv");
        old.push(4); // version
        old.extend_from_slice(&[1; 16]); // node id
        old.extend_from_slice(&[3; 32]); // nonce
        old.push(1); // authenticated
        old.extend_from_slice(&max);
        old.push(4); // the Challenge: version
        old.extend_from_slice(&[2; 16]);
        old.extend_from_slice(&[4; 32]);
        old.extend_from_slice(&max);
        old.push(0); // no proof
        let (Frame::Hello(h), Frame::Challenge(ch)) = (&hello, &challenge) else {
            unreachable!()
        };
        let unproved = Challenge {
            proof: None,
            ..ch.clone()
        };
        let re_encoded = [codec::encode(h).unwrap(), codec::encode(&unproved).unwrap()].concat();
        assert_eq!(re_encoded, old, "the previous release's computation");
        assert_eq!(s.transcript.bytes(), old, "the server's");
        // The client's: its proof is the one made over those bytes.
        let secret = NodeSecret::new(K).unwrap();
        let old = Transcript::new(old);
        let (proof, _) = c.handle(&client, &challenge).unwrap();
        assert_eq!(
            proof,
            Frame::Proof(Proof {
                proof: Some(secret.prove(Role::Client, &old))
            })
        );
        assert_eq!(ch.proof, Some(secret.prove(Role::Server, &old)));
    }

    #[test]
    fn frames_out_of_turn_and_tiny_frame_limits_are_refused() {
        let (client, server) = (local(1, Some(K)), local(2, Some(K)));
        assert!(matches!(
            Server::start(&server, &opening(&Frame::Ping), [2; 32]),
            Err(HandshakeError::Unexpected(_))
        ));
        let (c, hello) = Client::start(&client, [1; 32]);
        assert!(matches!(
            c.handle(&client, &hello),
            Err(HandshakeError::Unexpected(_))
        ));
        let small = Local {
            max_frame_length: 4095,
            ..local(3, Some(K))
        };
        let (_, hello) = Client::start(&small, [1; 32]);
        assert_eq!(
            Server::start(&server, &opening(&hello), [2; 32]).unwrap_err(),
            HandshakeError::FrameLimit(4095)
        );
        // An untagged or wrong Accepted does not admit the client.
        let (c, hello) = Client::start(&client, [1; 32]);
        let (_, challenge) = Server::start(&server, &opening(&hello), [2; 32]).unwrap();
        let (_, waiting) = c.handle(&client, &challenge).unwrap();
        let mut untagged = Vec::new();
        Frame::Accepted
            .encode(&mut Sealer::new(None), &mut untagged, 1 << 20)
            .unwrap();
        assert_eq!(
            waiting.handle(&untagged[4..]).unwrap_err(),
            HandshakeError::BadProof
        );
    }
}
