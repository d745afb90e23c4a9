//! The handshake as a pure state machine: frames in, frames out, no I/O.
//!
//! ```text
//! client (connects)                                   server (accepts)
//! Hello { magic, version, node_id C, nonce Nc,
//!         authenticated, max_frame_length }  ───────▶ checks magic, version, mode
//!                                             ◀─────── Challenge { version, node_id S, nonce Ns,
//!                                                        max_frame_length, proof S }
//! checks version, mode, proof S
//! Proof { proof C }                          ───────▶ checks proof C
//!                                             ◀─────── Accepted (the first tagged frame)
//! ```
//!
//! With a secret K and the transcript `t` = the `Hello` ‖ the `Challenge` without its proof
//! (their encodings, which are self-delimiting: every field either side announced, so magic,
//! versions, node ids `C` and `S`, nonces `Nc` and `Ns`, the client's mode and both frame
//! limits): `proof S = HMAC-SHA256(K, "actix-delivery/1 server proof\0" ‖ t)`, `proof C` the
//! same with "client proof", and the session keys of each direction the same with their own
//! labels. Each side's proof covers the other side's fresh nonce, so a recorded handshake
//! replayed to either side fails; the labels differ, so a proof reflected to its maker fails;
//! both node ids are bound, so a proof made for one pair of nodes fails for another; every
//! announced value is bound, so one altered on the path (a lowered frame limit, say) fails
//! the handshake. Each side computes `t` from the values it sent and received, not from the
//! bytes, so a field added to either frame later is bound without further code. Proofs are
//! compared in constant time; the secret never crosses the wire. Every frame after the
//! handshake carries a tag under the session key of its direction over its number and payload
//! (see [`Sealer`]).
//!
//! Without a secret (the explicitly insecure mode) the proofs are `None` and frames carry no tag;
//! a node of one mode refuses a peer of the other, so a misconfiguration never degrades a
//! secured cluster silently.

use crate::codec::{self, MAX_ENCODED_BYTES};
use crate::error::OptionsError;
use crate::tcp::auth::{NodeId, NodeSecret, Nonce, Opener, Role, Sealer, Transcript};
use crate::tcp::frame::{Challenge, Frame, FrameError, Hello, Proof, MAGIC, PROTOCOL_VERSION};

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
}

/// Why a handshake failed. The connection is closed; nothing it carried reached a consumer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HandshakeError {
    /// The peer speaks another protocol version.
    #[error("protocol version {theirs} is not ours ({ours})")]
    Version {
        /// Ours.
        ours: u16,
        /// The peer's.
        theirs: u16,
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

/// An established session: who the peer is and the tagging of both directions.
pub struct Session {
    /// The peer's id for its current run.
    pub peer: NodeId,
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
            .finish_non_exhaustive()
    }
}

fn session(
    local: &Local,
    role: Role,
    transcript: &Transcript,
    peer: NodeId,
    peer_max: u32,
) -> Session {
    let keys = local.secret.as_ref().map(|s| s.session_keys(transcript));
    let (send, receive) = match (&keys, role) {
        (Some((c2s, s2c)), Role::Client) => (Some(c2s), Some(s2c)),
        (Some((c2s, s2c)), Role::Server) => (Some(s2c), Some(c2s)),
        (None, _) => (None, None),
    };
    Session {
        peer,
        peer_max_frame_length: peer_max as usize,
        sealer: Sealer::new(send),
        opener: Opener::new(receive),
    }
}

fn check_peer(local: &Local, version: u16, peer: NodeId, max: u32) -> Result<(), HandshakeError> {
    if version != PROTOCOL_VERSION {
        return Err(HandshakeError::Version {
            ours: PROTOCOL_VERSION,
            theirs: version,
        });
    }
    if peer == local.node_id {
        return Err(HandshakeError::SelfConnection);
    }
    if (max as usize) < MIN_FRAME_LENGTH {
        return Err(HandshakeError::FrameLimit(max));
    }
    Ok(())
}

/// What the proofs and session keys cover: the `Hello` and the `Challenge` without its proof,
/// encoded (bincode's encoding of a fixed type is self-delimiting, so the concatenation is
/// unambiguous).
pub(crate) fn transcript(hello: &Hello, challenge: &Challenge) -> Transcript {
    let unproved = Challenge {
        proof: None,
        ..challenge.clone()
    };
    let mut bytes = Vec::with_capacity(128);
    // Both are a few dozen bytes of fixed-size fields: far below the codec's limit.
    codec::encode_into(hello, &mut bytes).expect("a Hello encodes");
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
    hello: Hello,
}

impl Client {
    /// Starts a handshake with a fresh `nonce`; send the returned `Hello`.
    pub fn start(local: &Local, nonce: Nonce) -> (Self, Frame<'static>) {
        let hello = Hello {
            magic: MAGIC,
            version: PROTOCOL_VERSION,
            node_id: local.node_id,
            nonce,
            authenticated: local.secret.is_some(),
            max_frame_length: local.max_frame_length,
        };
        (
            Self {
                hello: hello.clone(),
            },
            Frame::Hello(hello),
        )
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
        check_peer(local, *version, *node_id, *max_frame_length)?;
        let transcript = transcript(&self.hello, challenge);
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
        let session = session(
            local,
            Role::Client,
            &transcript,
            *node_id,
            *max_frame_length,
        );
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
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("client", &self.client)
            .finish_non_exhaustive()
    }
}

impl Server {
    /// Checks the client's `Hello` and answers with a `Challenge` under a fresh `nonce`.
    ///
    /// # Errors
    /// Why the client is refused.
    pub fn start(
        local: &Local,
        frame: &Frame<'_>,
        nonce: Nonce,
    ) -> Result<(Self, Frame<'static>), HandshakeError> {
        let Frame::Hello(hello) = frame else {
            return Err(unexpected(frame));
        };
        check_peer(local, hello.version, hello.node_id, hello.max_frame_length)?;
        match (local.secret.is_some(), hello.authenticated) {
            (true, false) => return Err(HandshakeError::PeerUnauthenticated),
            (false, true) => return Err(HandshakeError::PeerAuthenticates),
            _ => {}
        }
        let mut challenge = Challenge {
            version: PROTOCOL_VERSION,
            node_id: local.node_id,
            nonce,
            max_frame_length: local.max_frame_length,
            proof: None,
        };
        let transcript = transcript(hello, &challenge);
        challenge.proof = local
            .secret
            .as_ref()
            .map(|s| s.prove(Role::Server, &transcript));
        let server = Self {
            transcript,
            client: hello.node_id,
            client_max: hello.max_frame_length,
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
        Ok(session(
            local,
            Role::Server,
            transcript,
            self.client,
            self.client_max,
        ))
    }
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
        }
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
        let (s, challenge) = Server::start(server, &hello, nonces.1)?;
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
        let (s, _) = Server::start(&server, &hello, [2; 32]).unwrap();
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
        let (s, challenge) = Server::start(&secure_server, &hello, [2; 32]).unwrap();
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
        let (_, challenge) = Server::start(&server, &hello, [2; 32]).unwrap();
        let (recorded_proof, _) = c.handle(&client, &challenge).unwrap();
        // The attacker replays both to the server, which draws a new nonce.
        let (s, _) = Server::start(&server, &hello, [3; 32]).unwrap();
        assert_eq!(
            s.handle(&server, &recorded_proof).unwrap_err(),
            HandshakeError::BadProof
        );
    }

    #[test]
    fn a_replayed_challenge_fails_against_a_fresh_client_nonce() {
        let (client, server) = (local(1, Some(K)), local(2, Some(K)));
        let (_, hello) = Client::start(&client, [1; 32]);
        let (_, recorded_challenge) = Server::start(&server, &hello, [2; 32]).unwrap();
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
        let (s, challenge) = Server::start(&server, &hello, [2; 32]).unwrap();
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
            Server::start(&client, &hello, [2; 32]).unwrap_err(),
            HandshakeError::SelfConnection
        );
        let (_, challenge) = Server::start(&server, &hello, [2; 32]).unwrap();
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
        let (_, challenge) = Server::start(&server, &hello, [2; 32]).unwrap();
        assert_eq!(
            c.handle(&client, &challenge).unwrap_err(),
            HandshakeError::BadProof,
            "the client sees that the server's proof covers another Hello"
        );
        // And the server's announced limit, on its way back.
        let (c, hello) = Client::start(&client, [1; 32]);
        let (_, mut challenge) = Server::start(&server, &hello, [2; 32]).unwrap();
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
        let (_, challenge) = Server::start(&server, &hello, [2; 32]).unwrap();
        let (Frame::Hello(hello), Frame::Challenge(challenge)) = (hello, challenge) else {
            unreachable!()
        };
        let secret = NodeSecret::new(K).unwrap();
        let proof = secret.prove(Role::Server, &transcript(&hello, &challenge));
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
            .map(|h| transcript(h, &challenge))
            .chain(challenges.iter().map(|ch| transcript(&hello, ch)));
        for (i, altered) in altered.enumerate() {
            assert!(!secret.verify(Role::Server, &altered, &proof), "field {i}");
        }
        // The proof is not part of what it proves.
        let mut other_proof = challenge.clone();
        other_proof.proof = Some([0; 32]);
        assert!(secret.verify(Role::Server, &transcript(&hello, &other_proof), &proof));

        // A server that saw an altered limit refuses the proof the client made over its own.
        let (s, _) = Server::start(&server, &Frame::Hello(hellos[5].clone()), [2; 32]).unwrap();
        let genuine = Frame::Proof(Proof {
            proof: Some(secret.prove(Role::Client, &transcript(&hello, &challenge))),
        });
        assert_eq!(
            s.handle(&server, &genuine).unwrap_err(),
            HandshakeError::BadProof
        );
    }

    #[test]
    fn a_wrong_version_is_refused_by_both_sides() {
        let (client, server) = (local(1, Some(K)), local(2, Some(K)));
        let (_, mut hello) = Client::start(&client, [1; 32]);
        if let Frame::Hello(h) = &mut hello {
            h.version = PROTOCOL_VERSION + 1;
        }
        assert_eq!(
            Server::start(&server, &hello, [2; 32]).unwrap_err(),
            HandshakeError::Version {
                ours: PROTOCOL_VERSION,
                theirs: PROTOCOL_VERSION + 1
            }
        );
        let (c, hello) = Client::start(&client, [1; 32]);
        let (_, mut challenge) = Server::start(&server, &hello, [2; 32]).unwrap();
        if let Frame::Challenge(ch) = &mut challenge {
            ch.version = 0;
        }
        assert_eq!(
            c.handle(&client, &challenge).unwrap_err(),
            HandshakeError::Version {
                ours: PROTOCOL_VERSION,
                theirs: 0
            }
        );
    }

    #[test]
    fn frames_out_of_turn_and_tiny_frame_limits_are_refused() {
        let (client, server) = (local(1, Some(K)), local(2, Some(K)));
        assert!(matches!(
            Server::start(&server, &Frame::Ping, [2; 32]),
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
            Server::start(&server, &hello, [2; 32]).unwrap_err(),
            HandshakeError::FrameLimit(4095)
        );
        // An untagged or wrong Accepted does not admit the client.
        let (c, hello) = Client::start(&client, [1; 32]);
        let (_, challenge) = Server::start(&server, &hello, [2; 32]).unwrap();
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
