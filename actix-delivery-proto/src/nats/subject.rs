//! What a subject or queue group name must be before the carrier uses it. Pure.

use crate::protocol::envelope::MAX_ID_BYTES;

/// Why a subject or queue group name was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SubjectError {
    /// Empty.
    #[error("it is empty")]
    Empty,
    /// Longer than 256 bytes (it travels in every batch, as the consumer's name).
    #[error("it is {0} bytes, more than the 256 allowed")]
    TooLong(usize),
    /// Contains whitespace or a control character, which NATS's protocol cannot carry.
    #[error("it contains whitespace or a control character")]
    Whitespace,
    /// A subject with an empty token (`a..b`, a leading or trailing `.`).
    #[error("it has an empty token (a leading, trailing or doubled '.')")]
    EmptyToken,
    /// A subject with a wildcard (`*`, `>`): a consumer is exposed on, and a producer sends
    /// to, one concrete subject.
    #[error("it contains a wildcard ('*' or '>')")]
    Wildcard,
}

/// Checks a subject to expose a consumer on or to send to.
pub fn check_subject(subject: &str) -> Result<(), SubjectError> {
    check_name(subject)?;
    for token in subject.split('.') {
        match token {
            "" => return Err(SubjectError::EmptyToken),
            "*" | ">" => return Err(SubjectError::Wildcard),
            _ => {}
        }
    }
    Ok(())
}

/// Checks a queue group name.
pub fn check_group(group: &str) -> Result<(), SubjectError> {
    check_name(group)
}

fn check_name(name: &str) -> Result<(), SubjectError> {
    if name.is_empty() {
        return Err(SubjectError::Empty);
    }
    if name.len() > MAX_ID_BYTES {
        return Err(SubjectError::TooLong(name.len()));
    }
    if name.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(SubjectError::Whitespace);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concrete_subjects_pass() {
        for subject in ["orders", "shop.orders.eu-1", "_x.y"] {
            assert_eq!(check_subject(subject), Ok(()), "{subject}");
        }
    }

    #[test]
    fn bad_subjects_are_refused_with_the_reason() {
        let long = "a".repeat(257);
        let cases = [
            ("", SubjectError::Empty),
            (long.as_str(), SubjectError::TooLong(257)),
            ("a b", SubjectError::Whitespace),
            ("a\tb", SubjectError::Whitespace),
            ("a\u{0}b", SubjectError::Whitespace),
            ("a..b", SubjectError::EmptyToken),
            (".a", SubjectError::EmptyToken),
            ("a.", SubjectError::EmptyToken),
            ("a.*", SubjectError::Wildcard),
            ("a.>", SubjectError::Wildcard),
        ];
        for (subject, why) in cases {
            assert_eq!(check_subject(subject), Err(why), "{subject:?}");
        }
    }

    #[test]
    fn groups_may_contain_dots_but_no_whitespace() {
        assert_eq!(check_group("workers.eu"), Ok(()));
        assert_eq!(check_group(""), Err(SubjectError::Empty));
        assert_eq!(check_group("a b"), Err(SubjectError::Whitespace));
    }
}
