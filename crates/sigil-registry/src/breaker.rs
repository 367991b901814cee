//! A circuit breaker per registry host, so a dark registry costs one
//! timeout per cool-down instead of one per request.
//!
//! Owns the state machine — closed; open after `failures` consecutive
//! failures (no answer in time, connection refused or reset, 5xx); half-open
//! after `cool_down`, when exactly one request probes the host while the
//! others still fail fast; closed again on the probe's answer, open again on
//! its failure — and the failure a refused request gets, which names the
//! host, the count, the last failure and when the next probe goes. Any HTTP
//! answer below 500 (404 and 401 included) is an answer: the host is up.
//! It sends no request and keeps no clock of its own beyond `Instant`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sigil_core::ResolveFailure;

use crate::Observer;

/// Consecutive failures that open a host's breaker.
pub const DEFAULT_FAILURES: u32 = 3;
/// How long an open breaker fails fast before one request probes the host.
pub const DEFAULT_COOL_DOWN: Duration = Duration::from_secs(15);
/// When a host's breaker opens, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// Consecutive failures that open it (0: never).
    pub failures: u32,
    /// How long it fails fast before one request probes the host.
    pub cool_down: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            failures: DEFAULT_FAILURES,
            cool_down: DEFAULT_COOL_DOWN,
        }
    }
}

/// Hosts whose breakers are remembered; past this, closed ones are forgotten.
const MAX_HOSTS: usize = 1024;

#[derive(Debug, Clone)]
enum State {
    Closed {
        failures: u32,
    },
    Open {
        until: Instant,
        failures: u32,
        last: String,
    },
    HalfOpen {
        failures: u32,
        last: String,
    },
}

impl State {
    /// `sigil_registry_breaker_state`: 0 closed, 1 open, 2 half-open.
    fn gauge(&self) -> i64 {
        match self {
            State::Closed { .. } => 0,
            State::Open { .. } => 1,
            State::HalfOpen { .. } => 2,
        }
    }
}

/// Whether a failure says the host is not answering (opens the breaker).
pub fn is_host_failure(f: &ResolveFailure) -> bool {
    match f {
        ResolveFailure::Timeout { .. } | ResolveFailure::Unreachable { .. } => true,
        ResolveFailure::Status { status, .. } => *status >= 500,
        _ => false,
    }
}

/// The breakers of every host seen.
#[derive(Debug)]
pub(crate) struct Breakers {
    /// 0: breakers are off.
    failures: u32,
    cool_down: Duration,
    hosts: Mutex<HashMap<String, State>>,
}

/// Leave to send one request to a host; report how it went with
/// [`Breakers::record`]. Dropped unreported (the caller was cancelled), a
/// probe lets the next request probe instead.
#[must_use]
pub(crate) struct Permit<'a> {
    breakers: &'a Breakers,
    host: String,
    probe: bool,
    done: bool,
    observer: &'a dyn Observer,
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        if self.done || !self.probe {
            return;
        }
        let mut hosts = self.breakers.lock();
        if let Some(State::HalfOpen { failures, last }) = hosts.get(&self.host).cloned() {
            // Nobody learned anything: probe again at the next request.
            hosts.insert(
                self.host.clone(),
                State::Open {
                    until: Instant::now(),
                    failures,
                    last,
                },
            );
            self.observer.breaker(&self.host, 1);
        }
    }
}

impl Breakers {
    pub(crate) fn new(s: Settings) -> Breakers {
        Breakers {
            failures: s.failures,
            cool_down: s.cool_down,
            hosts: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, State>> {
        self.hosts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Leave to ask `host`, or the failure to answer with at once.
    pub(crate) fn admit<'a>(
        &'a self,
        host: &str,
        observer: &'a dyn Observer,
    ) -> Result<Permit<'a>, ResolveFailure> {
        if self.failures == 0 {
            return Ok(Permit {
                breakers: self,
                host: String::new(),
                probe: false,
                done: true,
                observer,
            });
        }
        let now = Instant::now();
        let mut hosts = self.lock();
        let state = hosts
            .get(host)
            .cloned()
            .unwrap_or(State::Closed { failures: 0 });
        let probe = match state {
            State::Closed { .. } => false,
            State::Open {
                until,
                failures,
                last,
            } if now >= until => {
                hosts.insert(host.to_owned(), State::HalfOpen { failures, last });
                observer.breaker(host, 2);
                true
            }
            State::Open {
                until,
                failures,
                last,
            } => {
                return Err(self.refusal(host, failures, &last, Some(until - now)));
            }
            State::HalfOpen { failures, last } => {
                return Err(self.refusal(host, failures, &last, None));
            }
        };
        Ok(Permit {
            breakers: self,
            host: host.to_owned(),
            probe,
            done: false,
            observer,
        })
    }

    fn refusal(
        &self,
        host: &str,
        failures: u32,
        last: &str,
        next: Option<Duration>,
    ) -> ResolveFailure {
        let when = match next {
            Some(d) => format!("the next probe in {}s", d.as_secs().max(1)),
            None => "a probe is in flight".to_owned(),
        };
        ResolveFailure::Unreachable {
            detail: format!(
                "{host} is failing fast: {failures} consecutive requests failed (last: {last}); {when}"
            ),
        }
    }

    /// How the request `permit` allowed went.
    pub(crate) fn record<T>(&self, mut permit: Permit<'_>, result: &Result<T, ResolveFailure>) {
        if self.failures == 0 {
            return;
        }
        permit.done = true;
        let host = std::mem::take(&mut permit.host);
        let mut hosts = self.lock();
        let before = hosts
            .get(&host)
            .cloned()
            .unwrap_or(State::Closed { failures: 0 });
        let next = match result {
            Err(f) if is_host_failure(f) => {
                let failures = match &before {
                    State::Closed { failures }
                    | State::Open { failures, .. }
                    | State::HalfOpen { failures, .. } => failures.saturating_add(1),
                };
                if failures >= self.failures || matches!(before, State::HalfOpen { .. }) {
                    State::Open {
                        // A cool-down too long for the clock (a flag of
                        // years) means a day: never a panic.
                        until: Instant::now()
                            .checked_add(self.cool_down)
                            .unwrap_or_else(|| Instant::now() + Duration::from_secs(86_400)),
                        failures,
                        last: f.to_string(),
                    }
                } else {
                    State::Closed { failures }
                }
            }
            _ => State::Closed { failures: 0 },
        };
        if next.gauge() != before.gauge() {
            permit.observer.breaker(&host, next.gauge());
        }
        if matches!(next, State::Closed { failures: 0 }) {
            hosts.remove(&host);
        } else {
            if hosts.len() >= MAX_HOSTS {
                hosts.retain(|_, s| !matches!(s, State::Closed { .. }));
            }
            hosts.insert(host, next);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Seen(Mutex<Vec<(String, i64)>>);
    impl Observer for Seen {
        fn request(&self, _: &str, _: &str, _: &str, _: Duration) {}
        fn cache(&self, _: bool) {}
        fn breaker(&self, host: &str, state: i64) {
            self.0.lock().unwrap().push((host.to_owned(), state));
        }
    }

    fn timeout() -> Result<(), ResolveFailure> {
        Err(ResolveFailure::Timeout {
            budget: Duration::from_secs(3),
        })
    }

    #[test]
    fn opens_after_consecutive_failures_probes_once_and_closes_on_an_answer() {
        let seen = Seen(Mutex::new(Vec::new()));
        let b = Breakers::new(Settings {
            failures: 3,
            cool_down: Duration::from_millis(50),
        });
        for _ in 0..2 {
            let p = b.admit("dark:5000", &seen).unwrap();
            b.record(p, &timeout());
        }
        // A success in between resets the count.
        let p = b.admit("dark:5000", &seen).unwrap();
        b.record(p, &Ok(()));
        for _ in 0..3 {
            let p = b.admit("dark:5000", &seen).unwrap();
            b.record(p, &timeout());
        }
        let e = b.admit("dark:5000", &seen).err().unwrap();
        assert!(
            e.to_string()
                .contains("dark:5000 is failing fast: 3 consecutive"),
            "{e}"
        );
        assert!(e.to_string().contains("no answer from the registry"), "{e}");
        // Other hosts are not affected; 404 and 401 are answers.
        let p = b.admit("up:5000", &seen).unwrap();
        b.record::<()>(p, &Err(ResolveFailure::NotFound { detail: "x".into() }));
        assert!(b.admit("up:5000", &seen).is_ok());
        std::thread::sleep(Duration::from_millis(60));
        // One probe; the others still fail fast while it is in flight.
        let probe = b.admit("dark:5000", &seen).unwrap();
        assert!(
            b.admit("dark:5000", &seen)
                .err()
                .unwrap()
                .to_string()
                .contains("a probe is in flight")
        );
        b.record(probe, &timeout());
        assert!(
            b.admit("dark:5000", &seen).is_err(),
            "a failed probe opens it again"
        );
        std::thread::sleep(Duration::from_millis(60));
        let probe = b.admit("dark:5000", &seen).unwrap();
        b.record(probe, &Ok(()));
        assert!(b.admit("dark:5000", &seen).is_ok(), "an answer closes it");
        let states: Vec<i64> = seen.0.lock().unwrap().iter().map(|(_, s)| *s).collect();
        assert_eq!(states, [1, 2, 1, 2, 0]);
    }

    #[test]
    fn a_cancelled_probe_lets_the_next_request_probe() {
        let seen = Seen(Mutex::new(Vec::new()));
        let b = Breakers::new(Settings {
            failures: 1,
            cool_down: Duration::ZERO,
        });
        let p = b.admit("h", &seen).unwrap();
        b.record(p, &timeout());
        let probe = b.admit("h", &seen).unwrap();
        drop(probe);
        assert!(b.admit("h", &seen).is_ok());
        // 5xx counts; 429 (alive, rate limiting) does not.
        assert!(is_host_failure(&ResolveFailure::Status {
            status: 503,
            detail: String::new()
        }));
        assert!(!is_host_failure(&ResolveFailure::RateLimited {
            retry_after: None
        }));
    }
}
