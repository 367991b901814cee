//! Authentication ahead of the first request: how a host asks to be
//! authenticated is learned once per host (from the first request's
//! answer, remembered and single-flighted by [`crate::probe`]), so a lookup
//! sends the credentials
//! a Basic host wants, or a token fetched for its scope from a Bearer
//! host's realm, with its first request — instead of a 401 round trip per
//! request (Basic) or per repository (Bearer). A 401 is still answered as
//! it comes (`Lookup::send`); this only saves the round trip it costs.

use http::{Method, StatusCode, header};
use sigil_core::ResolveFailure;

use super::Lookup;
use crate::auth::{Challenge, parse_challenge};
use crate::probe::Scheme;
use crate::response::Resp;

/// What [`Lookup::ahead`] found.
pub(super) enum Ahead {
    /// The `Authorization` the request carries (`None`: anonymous).
    Auth(Option<String>),
    /// The host was unknown and this request was its probe: sent
    /// anonymously, here is its answer (a 401 is answered by the caller).
    Answered(Resp),
}

impl Lookup<'_> {
    /// How the first request to `domain` is authenticated, from how the
    /// host asks (learned once per host): Basic credentials, or a token
    /// fetched for `scope` at once — instead of a 401 round trip per
    /// request (Basic) or per repository (Bearer). An unknown host's first
    /// request is its probe: it goes anonymously and its answer says how
    /// the host authenticates (no extra round trip; an open host needs
    /// nothing more); lookups that arrive meanwhile wait for that answer.
    /// A probe that failed is not remembered: the request learns as it
    /// goes.
    pub(super) async fn ahead(
        &self,
        (method, url): (&Method, &str),
        domain: &str,
        scope: &str,
        identity: &str,
    ) -> Result<Ahead, ResolveFailure> {
        let scheme = match self.schemes.known(domain) {
            Some(s) => s,
            None => {
                let mut answered = None;
                let learned = self
                    .schemes
                    .learn(domain, || async {
                        self.observer.probe(domain, "auth");
                        let r = self.once(method.clone(), url, domain, None).await?;
                        let scheme = scheme_of_answer(&r);
                        answered = Some(r);
                        Ok::<_, ResolveFailure>(scheme)
                    })
                    .await;
                match (answered, learned) {
                    (Some(r), _) => return Ok(Ahead::Answered(r)),
                    (None, Ok(s)) => s,
                    (None, Err(e)) => {
                        tracing::debug!(domain, error = %e, "registry auth probe failed");
                        return Ok(Ahead::Auth(None));
                    }
                }
            }
        };
        Ok(Ahead::Auth(match scheme {
            Scheme::Open => None,
            Scheme::Basic => self.credential.map(|c| c.basic_header().to_string()),
            Scheme::Bearer { realm, service } => {
                let token = self
                    .fetch_token(domain, &realm, service.as_deref(), scope, self.credential)
                    .await?;
                self.tokens
                    .put(domain, scope, identity, token.0.clone(), token.1);
                Some(format!("Bearer {}", token.0))
            }
        }))
    }
}

/// How a host asks to be authenticated, read off an anonymous answer.
fn scheme_of_answer(r: &Resp) -> Scheme {
    if r.status != StatusCode::UNAUTHORIZED {
        return Scheme::Open;
    }
    r.headers
        .get(header::WWW_AUTHENTICATE)
        .and_then(|v| v.to_str().ok())
        .and_then(parse_challenge)
        .map_or(Scheme::Open, |c| scheme_of(&c))
}

/// What a challenge says about the host.
pub(super) fn scheme_of(c: &Challenge) -> Scheme {
    match c {
        Challenge::Basic => Scheme::Basic,
        Challenge::Bearer { realm, service, .. } => Scheme::Bearer {
            realm: realm.clone(),
            service: service.clone(),
        },
    }
}
