//! Which client and which request slots a registry host gets: the clients
//! of the hosts the policy lists, a default client for the rest, and request
//! slots per host — also for hosts the policy does not list, so one dark or
//! slow host (any admission request may name one) cannot take the slots of
//! another. It sends no request itself.

use std::collections::HashMap;
use std::sync::Arc;

use sigil_core::policy::RegistrySpec;
use tokio::sync::Semaphore;

use crate::RegistryError;
use crate::client::{DEFAULT_MAX_CONCURRENT, HostClient};

/// Clients for every configured host plus a default for the rest.
///
/// Request slots are per host, also for hosts the policy does not list: one
/// dark or slow host (any admission request may name one) must not take the
/// slots of another.
#[derive(Debug)]
pub(crate) struct Hosts {
    configured: HashMap<String, HostClient>,
    default: HostClient,
    unlisted: std::sync::Mutex<HashMap<String, Arc<Semaphore>>>,
}

/// Unlisted hosts whose slots are remembered; past this, idle ones are forgotten.
const MAX_UNLISTED_HOSTS: usize = 1024;

impl Hosts {
    pub(crate) fn new(specs: &[RegistrySpec]) -> Result<Hosts, RegistryError> {
        let mut configured = HashMap::new();
        for s in specs {
            configured.insert(s.host.clone(), HostClient::new(s)?);
        }
        Ok(Hosts {
            configured,
            default: HostClient::new(&RegistrySpec::default())?,
            unlisted: std::sync::Mutex::new(HashMap::new()),
        })
    }

    /// The request slots of `domain`: its own client's, or (unlisted) its own
    /// semaphore of the default size, created on first use.
    pub(crate) fn permits(&self, domain: &str) -> Arc<Semaphore> {
        if let Some(h) = self.configured.get(domain) {
            return h.permits.clone();
        }
        let mut map = self.unlisted.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = map.get(domain) {
            return p.clone();
        }
        if map.len() >= MAX_UNLISTED_HOSTS {
            // Forget hosts with no request in flight (only the map holds them).
            map.retain(|_, p| Arc::strong_count(p) > 1);
        }
        let p = Arc::new(Semaphore::new(DEFAULT_MAX_CONCURRENT as usize));
        map.insert(domain.to_owned(), p.clone());
        p
    }

    pub(crate) fn get(&self, domain: &str) -> &HostClient {
        self.configured.get(domain).unwrap_or(&self.default)
    }
}
