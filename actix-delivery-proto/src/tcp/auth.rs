//! Node identities, the shared secret, and the MACs built from it: the handshake's proofs, the
//! session keys, and the tag on every frame after the handshake. Pure: no I/O, no runtime.

use std::fmt;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::error::OptionsError;

type HmacSha256 = Hmac<Sha256>;

/// Bytes of a frame tag: HMAC-SHA256 truncated to its first 128 bits (as in RFC 4868).
pub(crate) const TAG_LEN: usize = 16;

/// The shortest secret a node accepts, in bytes.
pub const MIN_SECRET_BYTES: usize = 16;

/// The longest secret a node accepts, in bytes.
pub const MAX_SECRET_BYTES: usize = 1024;

/// A node's identity for one run: 128 random bits drawn at every start, so a restarted node is
/// a new node to its peers.
#[derive(
    Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct NodeId([u8; 16]);

impl NodeId {
    /// An id with a chosen value (tests).
    pub const fn from_bytes(bytes: [u8; 16]) -> Self {
        Self(bytes)
    }

    /// The id's bytes.
    pub const fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl fmt::Debug for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NodeId({self})")
    }
}

/// The secret every node of a cluster shares; it authenticates nodes to each other and every
/// frame they exchange. It never leaves the process: the handshake proves knowledge of it with
/// HMAC-SHA256 over fresh nonces. `Debug` does not print it.
#[derive(Clone)]
pub struct NodeSecret(Box<[u8]>);

impl NodeSecret {
    /// A secret of [`MIN_SECRET_BYTES`] to [`MAX_SECRET_BYTES`] bytes. Use random bytes (e.g.
    /// 32 from a CSPRNG, stored like a password), not a word: the handshake can be recorded and
    /// a guessable secret checked offline against it.
    ///
    /// # Errors
    /// [`OptionsError`] for the field `secret` if the length is out of range.
    pub fn new(secret: impl AsRef<[u8]>) -> Result<Self, OptionsError> {
        let secret = secret.as_ref();
        if !(MIN_SECRET_BYTES..=MAX_SECRET_BYTES).contains(&secret.len()) {
            return Err(OptionsError::new(
                "secret",
                format!(
                    "must be {MIN_SECRET_BYTES} to {MAX_SECRET_BYTES} bytes (got {})",
                    secret.len()
                ),
            ));
        }
        Ok(Self(secret.into()))
    }

    /// The proof that `role` knows the secret, for this handshake.
    pub(crate) fn prove(&self, role: Role, transcript: &Transcript) -> [u8; 32] {
        self.mac(role.label(), transcript)
            .finalize()
            .into_bytes()
            .into()
    }

    /// Whether `proof` is `role`'s proof for this handshake, compared in constant time.
    pub(crate) fn verify(&self, role: Role, transcript: &Transcript, proof: &[u8; 32]) -> bool {
        self.mac(role.label(), transcript)
            .verify_slice(proof)
            .is_ok()
    }

    /// The session keys of this handshake: `(client to server, server to client)`.
    pub(crate) fn session_keys(&self, transcript: &Transcript) -> ([u8; 32], [u8; 32]) {
        let key =
            |label| -> [u8; 32] { self.mac(label, transcript).finalize().into_bytes().into() };
        (key(CLIENT_TO_SERVER_KEY), key(SERVER_TO_CLIENT_KEY))
    }

    /// HMAC-SHA256 keyed with the secret, fed `label ‖ transcript`.
    fn mac(&self, label: &[u8], transcript: &Transcript) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.0).expect("HMAC accepts any key length");
        mac.update(label);
        mac.update(&transcript.0);
        mac
    }
}

impl fmt::Debug for NodeSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("NodeSecret(..)")
    }
}

/// A handshake nonce: 256 fresh random bits per side and connection.
pub type Nonce = [u8; 32];

/// What both sides' MACs cover: everything the two sides announced in the handshake (see
/// the `handshake` module), in an unambiguous encoding.
pub(crate) struct Transcript(Vec<u8>);

impl Transcript {
    /// The transcript of these bytes; the caller makes them unambiguous.
    pub(crate) fn new(bytes: Vec<u8>) -> Self {
        Self(bytes)
    }

    /// The bytes it covers.
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.0
    }
}

/// Which side of a handshake a proof comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// The side that connected.
    Client,
    /// The side that accepted.
    Server,
}

impl Role {
    fn label(self) -> &'static [u8] {
        match self {
            Role::Client => CLIENT_PROOF,
            Role::Server => SERVER_PROOF,
        }
    }
}

// Domain-separation labels: one per purpose and direction, so no MAC made for one purpose is
// accepted for another (a server's proof reflected as a client's fails).
const SERVER_PROOF: &[u8] = b"actix-delivery/1 server proof\0";
const CLIENT_PROOF: &[u8] = b"actix-delivery/1 client proof\0";
const CLIENT_TO_SERVER_KEY: &[u8] = b"actix-delivery/1 key client to server\0";
const SERVER_TO_CLIENT_KEY: &[u8] = b"actix-delivery/1 key server to client\0";

/// Tags the frames one side sends: HMAC-SHA256(session key, frame number ‖ payload),
/// truncated to `TAG_LEN`. The frame number counts from 0 per direction and is not sent:
/// a frame injected, dropped, replayed or reordered by anyone without the key fails the next
/// check. Without a secret (insecure mode) frames carry no tag.
pub struct Sealer {
    key: Option<HmacSha256>,
    counter: u64,
}

impl Sealer {
    /// A sealer that tags frames with `key`, or sends them untagged without one.
    pub fn new(key: Option<&[u8; 32]>) -> Self {
        Self {
            key: key.map(|k| HmacSha256::new_from_slice(k).expect("any key length")),
            counter: 0,
        }
    }

    /// Bytes the tag adds to each frame.
    pub(crate) fn overhead(&self) -> usize {
        if self.key.is_some() {
            TAG_LEN
        } else {
            0
        }
    }

    /// Appends the tag of `out[start..]` to `out` and counts the frame.
    pub(crate) fn seal(&mut self, out: &mut Vec<u8>, start: usize) {
        if let Some(key) = &self.key {
            let mut mac = key.clone();
            mac.update(&self.counter.to_le_bytes());
            mac.update(&out[start..]);
            out.extend_from_slice(&mac.finalize().into_bytes()[..TAG_LEN]);
        }
        self.counter += 1;
    }
}

/// Checks the tags of the frames one side receives (see [`Sealer`]).
pub struct Opener {
    key: Option<HmacSha256>,
    counter: u64,
}

impl Opener {
    /// An opener that checks the tags of `key`, or takes untagged frames without one.
    pub fn new(key: Option<&[u8; 32]>) -> Self {
        Self {
            key: key.map(|k| HmacSha256::new_from_slice(k).expect("any key length")),
            counter: 0,
        }
    }

    /// The payload of `frame` if its tag is right (compared in constant time); counts the frame.
    pub fn open<'a>(&mut self, frame: &'a [u8]) -> Option<&'a [u8]> {
        let Some(key) = &self.key else {
            self.counter += 1;
            return Some(frame);
        };
        let split = frame.len().checked_sub(TAG_LEN)?;
        let (payload, tag) = frame.split_at(split);
        let mut mac = key.clone();
        mac.update(&self.counter.to_le_bytes());
        mac.update(payload);
        mac.verify_truncated_left(tag).ok()?;
        self.counter += 1;
        Some(payload)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(byte: u8) -> NodeSecret {
        NodeSecret::new([byte; 32]).unwrap()
    }

    #[test]
    fn secrets_are_bounded_and_never_printed() {
        assert_eq!(NodeSecret::new([1; 15]).unwrap_err().field, "secret");
        assert!(NodeSecret::new([1; 16]).is_ok());
        assert!(NodeSecret::new(vec![1; 1024]).is_ok());
        assert!(NodeSecret::new(vec![1; 1025]).is_err());
        assert_eq!(format!("{:?}", secret(0x41)), "NodeSecret(..)");
    }

    #[test]
    fn proofs_depend_on_every_input_and_differ_by_purpose() {
        let t = Transcript::new(vec![1, 2, 3, 4]);
        let (s, k) = (secret(9), secret(8));
        let server = s.prove(Role::Server, &t);
        assert!(s.verify(Role::Server, &t, &server));
        assert!(!s.verify(Role::Client, &t, &server), "reflected");
        assert!(!k.verify(Role::Server, &t, &server), "another secret");
        let others = [vec![1, 2, 3, 5], vec![1, 2, 3], vec![1, 2, 3, 4, 0], vec![]];
        for other in others.map(Transcript::new) {
            assert!(!s.verify(Role::Server, &other, &server));
            assert_ne!(s.session_keys(&other), s.session_keys(&t));
        }
        let (c2s, s2c) = s.session_keys(&t);
        let client = s.prove(Role::Client, &t);
        let all = [server, client, c2s, s2c];
        for (i, x) in all.iter().enumerate() {
            assert!(all[i + 1..].iter().all(|y| y != x));
        }
    }

    fn sealed(sealer: &mut Sealer, payload: &[u8]) -> Vec<u8> {
        let mut out = payload.to_vec();
        sealer.seal(&mut out, 0);
        out
    }

    #[test]
    fn frames_open_only_in_order_with_the_right_key() {
        let key = [7; 32];
        let mut sealer = Sealer::new(Some(&key));
        let first = sealed(&mut sealer, b"one");
        let second = sealed(&mut sealer, b"two");
        assert_eq!(first.len(), 3 + TAG_LEN);

        let mut opener = Opener::new(Some(&key));
        assert_eq!(opener.open(&second), None, "out of order");
        assert_eq!(opener.open(&first), Some(&b"one"[..]));
        assert_eq!(opener.open(&first), None, "replayed");
        assert_eq!(opener.open(&second), Some(&b"two"[..]));

        let mut wrong = Opener::new(Some(&[8; 32]));
        assert_eq!(wrong.open(&first), None, "another key");
        let mut tampered = first.clone();
        tampered[0] ^= 1;
        assert_eq!(Opener::new(Some(&key)).open(&tampered), None);
        assert_eq!(Opener::new(Some(&key)).open(&first[..5]), None);
        assert_eq!(Opener::new(Some(&key)).open(&[]), None);
    }

    #[test]
    fn without_a_key_frames_carry_no_tag() {
        let mut sealer = Sealer::new(None);
        assert_eq!(sealer.overhead(), 0);
        assert_eq!(sealed(&mut sealer, b"x"), b"x");
        assert_eq!(Opener::new(None).open(b"x"), Some(&b"x"[..]));
    }

    #[test]
    fn node_ids_print_as_hex() {
        let id = NodeId::from_bytes([0xab; 16]);
        assert_eq!(id.to_string(), "ab".repeat(16));
    }
}
