//! Go's `time.Duration` text, as Kubernetes writes it (`10s`, `1m0s`,
//! `1.5s`, `250ms`, `12h`): the API server's `?timeout=` and kubelet's
//! credential-provider `cacheDuration`.

use std::time::Duration;

/// Parses Go's `time.Duration` text (`10s`, `1m0s`, `1.5s`, `250ms`);
/// `None` for anything else, negative, or a year or more.
pub fn parse_go(s: &str) -> Option<Duration> {
    let s = s.trim();
    if s.is_empty() {
        return None;
    }
    let mut total = 0f64;
    let mut rest = s;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let n: f64 = rest[..num_end].parse().ok()?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let mult = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        total += n * mult;
        rest = &rest[unit_end..];
    }
    (total.is_finite() && (0.0..31_536_000.0).contains(&total))
        .then(|| Duration::from_secs_f64(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(parse_go("10s"), Some(Duration::from_secs(10)));
        assert_eq!(parse_go("1m0s"), Some(Duration::from_secs(60)));
        assert_eq!(parse_go("12h0m0s"), Some(Duration::from_secs(43_200)));
        assert_eq!(parse_go("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_go("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_go("0s"), Some(Duration::ZERO));
        assert_eq!(parse_go("5"), None);
        assert_eq!(parse_go("1e400s"), None);
    }
}
