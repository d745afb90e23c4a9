//! Which protocol version a NATS message speaks: its first byte. A carrier reads every version
//! this crate speaks and writes the one its `wire_version` names.
//!
//! Protocol 1 put the frame first, so its messages start with the kind of their frame (4 for
//! deliveries, 5 for ACKs); protocols 2 and 3 start with their number; protocol 4 starts with
//! 7, because a message starting with 4 or 5 could not be told from one of protocol 1, by this
//! carrier or by one of protocol 1. The next protocol takes 8.

use crate::tcp::frame::{MIN_PROTOCOL_VERSION, PROTOCOL_VERSION};

/// The first byte of a NATS message of protocol `version`, if this crate speaks it.
pub const fn message_byte(version: u16) -> Option<u8> {
    match version {
        3 => Some(3),
        4 => Some(7),
        _ => None,
    }
}

/// The protocol version of a NATS message that starts with `byte`, if this crate speaks it.
pub const fn message_version(byte: u8) -> Option<u16> {
    match byte {
        3 => Some(3),
        7 => Some(4),
        _ => None,
    }
}

// Every version this crate speaks has its byte (a new protocol needs one).
const _: () = {
    let mut version = MIN_PROTOCOL_VERSION;
    while version <= PROTOCOL_VERSION {
        assert!(
            message_byte(version).is_some(),
            "a new protocol needs a message byte"
        );
        version += 1;
    }
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_version_this_crate_speaks_has_one_byte_and_no_other_byte_is_read() {
        for version in MIN_PROTOCOL_VERSION..=PROTOCOL_VERSION {
            let byte = message_byte(version).expect("a byte");
            assert_eq!(message_version(byte), Some(version));
        }
        assert_eq!(message_byte(4), Some(7), "not 4: a kind of protocol 1");
        let read = (0..=u8::MAX)
            .filter(|&b| message_version(b).is_some())
            .count();
        assert_eq!(
            read,
            usize::from(PROTOCOL_VERSION - MIN_PROTOCOL_VERSION + 1)
        );
        for byte in [1, 2, 4, 5, 8, 255] {
            assert_eq!(message_version(byte), None, "{byte}");
        }
        assert_eq!(message_byte(2), None);
        assert_eq!(message_byte(5), None);
    }
}
