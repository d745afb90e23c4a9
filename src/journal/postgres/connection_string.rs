//! Parsing a connection string, with an error that says what did not parse and never holds
//! the password: what the journal, the read model and the lease store take.
//!
//! tokio-postgres says only "invalid connection string" and keeps the reason in its error's
//! source, in words of its own; some of them hold part of the string (the name of an unknown
//! option, which is the whole URL when its scheme is misspelt; the character found where `=`
//! was expected), and so possibly the password. [`parse_config`] writes each reason it knows
//! in words that hold no part of the string but an option's name (and that only when it is a
//! name: lowercase letters, digits and `_`), and any other as "it does not parse".

use std::error::Error as _;
use std::str::FromStr;

use tokio_postgres::Config;

/// Parses `config` as tokio-postgres does: a libpq-style `key=value` string or a
/// `postgresql://` (or `postgres://`) URL.
///
/// # Errors
/// What did not parse, beginning "a PostgreSQL connection string that does not parse": the
/// option whose value is invalid, the unknown option (named if it is a name), or the byte at
/// which a `key=value` string broke off; never any other part of the string.
pub(crate) fn parse_config(config: &str) -> Result<Config, String> {
    Config::from_str(config).map_err(|err| {
        let reason = err.source().map(|cause| cause.to_string());
        format!(
            "a PostgreSQL connection string that does not parse: {}",
            reason
                .as_deref()
                .map_or("it does not parse".into(), describe)
        )
    })
}

/// A parse error's reason (tokio-postgres's words) without any part of the string.
fn describe(reason: &str) -> String {
    if let Some(name) = between(reason, "unknown option `", "`") {
        return if is_option_name(name) {
            format!("unknown option `{name}`")
        } else {
            "an unknown option, which is not an option's name (a URL must start with \
             postgresql:// or postgres://; a value with spaces needs single quotes)"
                .into()
        };
    }
    if let Some(name) = between(reason, "invalid value for option `", "`")
        && is_option_name(name)
    {
        return format!("invalid value for option `{name}`");
    }
    if let Some(rest) = reason.strip_prefix("unexpected character at byte ")
        && let Some((byte, expected)) = rest.split_once(": expected `")
    {
        let expected = expected.chars().next().filter(|c| *c == '=' || *c == '\'');
        if let (Ok(byte), Some(expected)) = (byte.parse::<usize>(), expected) {
            return format!("expected `{expected}` at byte {byte}");
        }
    }
    match reason {
        "unexpected EOF" => "it ends where an option's `=` or value was expected".into(),
        "unterminated quoted connection parameter value" => {
            "a quoted value without its closing quote".into()
        }
        "unterminated parameter" => "a URL parameter without `=`".into(),
        _ if reason.contains("utf-8") => "a percent-encoded part that is not UTF-8".into(),
        _ => "it does not parse".into(),
    }
}

/// The text of `reason` between `start` (at its beginning) and the next `end`.
fn between<'a>(reason: &'a str, start: &str, end: &str) -> Option<&'a str> {
    let rest = reason.strip_prefix(start)?;
    rest.split_once(end).map(|(inner, _)| inner)
}

/// Whether `name` can be an option's name as libpq spells them: 1 to 63 of `a-z`, `0-9` and
/// `_`.
fn is_option_name(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name
            .bytes()
            .all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_reason_is_told_without_the_string_and_unknown_ones_without_anything() {
        for (reason, told) in [
            (
                "unknown option `conect_timeout`",
                "unknown option `conect_timeout`",
            ),
            ("unknown option `Pa55`", "which is not an option's name"),
            (
                "unknown option `postgressql://u:pw@h/d?sslmode`",
                "postgresql://",
            ),
            (
                "invalid value for option `port`",
                "invalid value for option `port`",
            ),
            (
                "unexpected character at byte 43: expected `=` but got `p`",
                "expected `=` at byte 43",
            ),
            ("unexpected EOF", "it ends where"),
            ("unterminated parameter", "without `=`"),
            (
                "invalid utf-8 sequence of 1 bytes from index 2",
                "not UTF-8",
            ),
            ("something new with a secret", "it does not parse"),
        ] {
            let described = describe(reason);
            assert!(described.contains(told), "{reason}: {described}");
            for secret in ["Pa55", "pw@", "got `p`", "secret"] {
                assert!(!described.contains(secret), "{reason}: {described}");
            }
        }
    }
}
