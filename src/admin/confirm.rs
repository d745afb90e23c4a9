//! The confirmation tokens of the console's writes (replay, delete): an HMAC-SHA256, under a
//! key drawn when the console is made, of the action, the entry's id and what changes when the
//! entry does (its last time and its failed replays). The show endpoint and the page hand one
//! out with the entry; a write without it, with one of another entry or action, or with one
//! of the entry as it was before a later letter or a failed replay updated it, does nothing.
//! A write that went through removes the entry, so its token can do nothing again, and a
//! token does not outlive the console (a restart draws a new key), unless the application
//! gives the key's secret (`Console::confirm_key`, shared by replicas behind a load balancer).

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use crate::delivery::dead_letters::StoredDeadLetter;

/// A write the console confirms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    /// Replay the entry through its source's route.
    Replay,
    /// Delete the entry without replaying it.
    Delete,
}

impl Action {
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Self::Replay => "replay",
            Self::Delete => "delete",
        }
    }
}

/// The key tokens are made with (drawn once per console, or derived from the secret given to
/// `Console::confirm_key`).
pub(crate) struct ConfirmKey([u8; 32]);

impl ConfirmKey {
    pub(crate) fn new(key: [u8; 32]) -> Self {
        Self(key)
    }

    /// The key derived from an application's secret (`Console::confirm_key`): the same secret
    /// gives the same key, in every replica.
    pub(crate) fn from_secret(secret: &[u8]) -> Self {
        let mut digest = Sha256::new();
        digest.update(b"actix-delivery admin confirm key\0");
        digest.update(secret);
        Self(digest.finalize().into())
    }

    /// The token of `action` on `entry` as it is now (hex).
    pub(crate) fn token(&self, action: Action, entry: &StoredDeadLetter) -> String {
        hex(&self.mac(action, entry).finalize().into_bytes())
    }

    /// Whether `token` is the token of `action` on `entry` as it is now (compared in constant
    /// time).
    pub(crate) fn verify(&self, action: Action, entry: &StoredDeadLetter, token: &str) -> bool {
        let Some(bytes) = unhex(token) else {
            return false;
        };
        self.mac(action, entry).verify_slice(&bytes).is_ok()
    }

    fn mac(&self, action: Action, entry: &StoredDeadLetter) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("any key length");
        mac.update(b"actix-delivery admin confirm\0");
        mac.update(action.as_str().as_bytes());
        mac.update(&entry.id.to_le_bytes());
        mac.update(&entry.last_at_ms.to_le_bytes());
        mac.update(&entry.replay_failures.to_le_bytes());
        mac
    }
}

/// Whether two secrets are equal, in a time that depends on neither (their SHA-256 digests
/// are compared whole).
pub(crate) fn same_secret(a: &[u8], b: &[u8]) -> bool {
    let (a, b) = (Sha256::digest(a), Sha256::digest(b));
    a.iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

/// `bytes` in lowercase hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        out.push(DIGITS[usize::from(byte >> 4)] as char);
        out.push(DIGITS[usize::from(byte & 0xf)] as char);
    }
    out
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || text.len() > 128 {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let bytes = text.as_bytes().chunks(2);
    bytes
        .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::Manifest;
    use crate::delivery::dead_letters::{DeadLetterCause, NewDeadLetter, SourceKind};

    fn entry(id: u64, last_at_ms: u64) -> StoredDeadLetter {
        StoredDeadLetter {
            id,
            letter: NewDeadLetter {
                kind: SourceKind::Consumer,
                source: "s".into(),
                cause: DeadLetterCause::Undecodable,
                key: "k".into(),
                origin: None,
                manifest: Manifest::raw(),
                body: None,
                body_len: 0,
                attempts: 1,
                error: String::new(),
            },
            first_at_ms: 1,
            last_at_ms,
            replay_failures: 0,
        }
    }

    #[test]
    fn a_token_confirms_one_action_on_one_entry_as_it_is() {
        let key = ConfirmKey::new([7; 32]);
        let token = key.token(Action::Replay, &entry(1, 10));
        assert!(key.verify(Action::Replay, &entry(1, 10), &token));
        assert!(
            !key.verify(Action::Delete, &entry(1, 10), &token),
            "another action"
        );
        assert!(
            !key.verify(Action::Replay, &entry(2, 10), &token),
            "another entry"
        );
        assert!(
            !key.verify(Action::Replay, &entry(1, 11), &token),
            "the entry changed"
        );
        let mut failed = entry(1, 10);
        failed.replay_failures = 1;
        assert!(
            !key.verify(Action::Replay, &failed, &token),
            "a replay failed since"
        );
        let other = ConfirmKey::new([8; 32]);
        assert!(
            !other.verify(Action::Replay, &entry(1, 10), &token),
            "another console"
        );
        for bad in ["", "zz", "abc", &token[..10]] {
            assert!(!key.verify(Action::Replay, &entry(1, 10), bad), "{bad:?}");
        }
    }

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret(b"s3cret", b"s3cret"));
        assert!(!same_secret(b"s3cret", b"s3cre"));
        assert!(!same_secret(b"", b"x"));
        assert_eq!(hex(&[0, 0xab, 0xff]), "00abff");
        assert_eq!(unhex("00abff"), Some(vec![0, 0xab, 0xff]));
    }
}
