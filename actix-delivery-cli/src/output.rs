//! Printing: JSON lines or aligned tables on stdout, notes on stderr; times, ages and bytes
//! written for people.

use std::io::{self, BufWriter, Stdout, Write};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Where a command prints.
pub struct Output {
    out: BufWriter<Stdout>,
}

impl Output {
    pub fn stdout() -> Self {
        Self {
            out: BufWriter::new(io::stdout()),
        }
    }

    /// One line.
    pub fn line(&mut self, line: &str) -> io::Result<()> {
        writeln!(self.out, "{line}")
    }

    /// One JSON value, on a line of its own.
    pub fn json(&mut self, value: &serde_json::Value) -> io::Result<()> {
        self.line(&value.to_string())
    }

    /// The rows under `header`, each column as wide as its widest cell (the last one not
    /// padded). A cell's control characters are escaped ([`printable`]): cells hold what peers
    /// sent.
    pub fn table(&mut self, header: &[&str], rows: &[Vec<String>]) -> io::Result<()> {
        let rows: Vec<Vec<String>> = rows
            .iter()
            .map(|row| row.iter().map(|cell| printable(cell)).collect())
            .collect();
        let rows = rows.as_slice();
        let mut widths: Vec<usize> = header.iter().map(|cell| cell.chars().count()).collect();
        for row in rows {
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(cell.chars().count());
            }
        }
        let header: Vec<String> = header.iter().map(|cell| (*cell).to_owned()).collect();
        for row in std::iter::once(&header).chain(rows) {
            let mut line = String::new();
            for (index, cell) in row.iter().enumerate() {
                if index + 1 == row.len() {
                    line.push_str(cell);
                } else {
                    let pad = widths[index] - cell.chars().count();
                    line.push_str(cell);
                    line.extend(std::iter::repeat_n(' ', pad + 2));
                }
            }
            self.line(line.trim_end())?;
        }
        Ok(())
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// A note for the reader (paging hints): on stderr, so that stdout stays the data.
pub fn note(text: &str) {
    eprintln!("{text}");
}

/// `time` in RFC 3339, UTC, to the millisecond: `2024-05-01T12:00:00.123Z`.
pub fn time(time: SystemTime) -> String {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, of_day) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil(days as i64);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        of_day / 3600,
        of_day / 60 % 60,
        of_day % 60,
        since.subsec_millis()
    )
}

/// The date `days` after 1970-01-01 (Howard Hinnant's `civil_from_days`).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Milliseconds since the Unix epoch.
pub fn millis(time: SystemTime) -> u64 {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
}

/// How long ago `time` was (zero if in the future).
pub fn age(time: SystemTime, now: SystemTime) -> Duration {
    now.duration_since(time).unwrap_or_default()
}

/// A duration for people: `850ms`, `42s`, `5m 12s`, `3h 4m`, `2d 5h`.
pub fn duration(duration: Duration) -> String {
    let secs = duration.as_secs();
    match secs {
        0 => format!("{}ms", duration.subsec_millis()),
        1..60 => format!("{secs}s"),
        60..3600 => format!("{}m {}s", secs / 60, secs % 60),
        3600..86_400 => format!("{}h {}m", secs / 3600, secs / 60 % 60),
        _ => format!("{}d {}h", secs / 86_400, secs / 3600 % 24),
    }
}

/// `bytes` in lower-case hexadecimal.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        text.push(char::from(DIGITS[usize::from(byte >> 4)]));
        text.push(char::from(DIGITS[usize::from(byte & 0xf)]));
    }
    text
}

/// `text` with its control characters (`char::is_control`: escape, bell, newline, C1 codes…)
/// written `\u{1b}`: safe to print to a terminal when it came from a peer (a dead letter's
/// key, source or error could otherwise move the cursor, retitle the window or set the
/// clipboard).
pub fn printable(text: &str) -> String {
    if !text.chars().any(char::is_control) {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() {
            out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    out
}

/// `text` cut to `max` characters, with an ellipsis when cut.
pub fn cut(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut cut: String = text.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// An optional number, `-` for none.
pub fn opt(value: Option<u64>) -> String {
    value.map_or_else(|| "-".to_owned(), |value| value.to_string())
}

#[cfg(test)]
mod tests {
    use super::printable;

    #[test]
    fn printable_escapes_control_characters_only() {
        assert_eq!(printable("key-7 é"), "key-7 é");
        assert_eq!(
            printable("a\x1b]52;c;aGk=\x07b\n\u{9b}"),
            "a\\u{1b}]52;c;aGk=\\u{7}b\\u{a}\\u{9b}"
        );
    }
}
