//! The counters a process keeps (observer runs, requests per host), added to the ones
//! stored in the store (`m:stats`) so that `perc status` shows every process's.

use bytes::Bytes;
use perc_observers::IndexError;

use crate::{Pipeline, Result};

/// Where the counters of every run so far are kept, per observer:
/// [runs, commits, skipped, conflicts, failures, parked].
pub(crate) const STATS_ROW: &[u8] = b"m:stats";

pub(crate) const STATS_COLUMN: &[u8] = b"stats:observers";

pub type StoredStats = std::collections::BTreeMap<String, [u64; 6]>;

/// Requests to each host by every process so far: [requests, failed, first ms, last ms].
pub(crate) const HOSTS_COLUMN: &[u8] = b"stats:hosts";

pub(crate) const OBSERVER_COUNTERS: &str = "the stored observer counters";

pub(crate) const HOST_COUNTERS: &str = "the stored host counters";

pub type StoredHosts = std::collections::BTreeMap<String, [u64; 4]>;

/// A process's counters now, and what of them the store does not have yet.
pub(crate) struct Unsaved {
    pub(crate) now: StoredStats,
    pub(crate) delta: StoredStats,
    pub(crate) hosts_now: StoredHosts,
    pub(crate) hosts_delta: StoredHosts,
}

pub(crate) fn add_stats(all: &mut StoredStats, delta: &StoredStats) {
    for (name, add) in delta {
        let e = all.entry(name.clone()).or_default();
        for (slot, add) in e.iter_mut().zip(add) {
            *slot += add;
        }
    }
}

pub(crate) fn add_hosts(hosts: &mut StoredHosts, delta: &StoredHosts) {
    for (host, [requests, failed, first, last]) in delta {
        let h = hosts.entry(host.clone()).or_insert([0, 0, *first, *last]);
        h[0] += requests;
        h[1] += failed;
        h[2] = h[2].min(*first);
        h[3] = h[3].max(*last);
    }
}

/// A stored counter record (`what` names it in the error), or an empty one if none is stored.
pub(crate) fn decode_stored<T: serde::de::DeserializeOwned + Default>(
    raw: Option<Bytes>,
    what: &str,
) -> Result<T, IndexError> {
    match raw {
        Some(v) => serde_json::from_slice(&v).map_err(|e| IndexError::corrupt(what, e)),
        None => Ok(T::default()),
    }
}

impl Pipeline {
    /// Adds this process's counters, as far as not added before, to the ones stored (shown
    /// by `perc status`). Processes sharing a store add theirs concurrently: a conflict is
    /// retried.
    pub async fn save_stats(&self) -> Result<()> {
        let u = self.unsaved();
        if u.delta.is_empty() && u.hosts_delta.is_empty() {
            return Ok(());
        }
        self.client.retrying(|_| self.try_save_stats(&u.delta, &u.hosts_delta)).await?;
        *self.saved.lock().unwrap_or_else(|e| e.into_inner()) = u.now;
        *self.hosts_saved.lock().unwrap_or_else(|e| e.into_inner()) = u.hosts_now;
        Ok(())
    }

    /// This process's counters now, and what of them is not added to the stored ones yet.
    pub(crate) fn unsaved(&self) -> Unsaved {
        let now: StoredStats = self
            .engine
            .stats()
            .into_iter()
            .map(|s| (s.name, [s.runs, s.commits, s.skipped, s.conflicts, s.failures, s.parked]))
            .collect();
        let delta: StoredStats = {
            let saved = self.saved.lock().unwrap_or_else(|e| e.into_inner());
            now.iter()
                .map(|(name, counts)| {
                    let before = saved.get(name).copied().unwrap_or_default();
                    (name.clone(), std::array::from_fn(|i| counts[i].saturating_sub(before[i])))
                })
                .filter(|(_, d): &(String, [u64; 6])| d.iter().any(|n| *n > 0))
                .collect()
        };
        let hosts_now: StoredHosts = self.polite.as_ref().map_or_else(Default::default, |p| {
            p.host_counts()
                .into_iter()
                .map(|(host, c)| (host, [c.requests, c.failed, c.first_ms, c.last_ms]))
                .collect()
        });
        let hosts_delta: StoredHosts = {
            let saved = self.hosts_saved.lock().unwrap_or_else(|e| e.into_inner());
            hosts_now
                .iter()
                .filter(|(host, c)| saved.get(*host).is_none_or(|s| s[0] < c[0]))
                .map(|(host, c)| {
                    let s = saved.get(host).copied().unwrap_or_default();
                    (host.clone(), [c[0] - s[0], c[1] - s[1], c[2], c[3]])
                })
                .collect()
        };
        Unsaved { now, delta, hosts_now, hosts_delta }
    }

    pub(crate) async fn try_save_stats(
        &self,
        delta: &StoredStats,
        hosts_delta: &StoredHosts,
    ) -> Result<(), perc_txn::TxnError> {
        let mut t = self.client.begin().await?;
        // A counter record that cannot be read starts over rather than stopping the run.
        let raw = t.get(STATS_ROW, STATS_COLUMN).await?;
        let mut all: StoredStats = decode_stored(raw, OBSERVER_COUNTERS).unwrap_or_default();
        add_stats(&mut all, delta);
        if !hosts_delta.is_empty() {
            let raw = t.get(STATS_ROW, HOSTS_COLUMN).await?;
            let mut hosts: StoredHosts = decode_stored(raw, HOST_COUNTERS).unwrap_or_default();
            add_hosts(&mut hosts, hosts_delta);
            t.set(
                Bytes::from_static(STATS_ROW),
                Bytes::from_static(HOSTS_COLUMN),
                serde_json::to_vec(&hosts).expect("serializable"),
            );
        }
        t.set(
            Bytes::from_static(STATS_ROW),
            Bytes::from_static(STATS_COLUMN),
            serde_json::to_vec(&all).expect("serializable"),
        );
        t.commit().await?;
        Ok(())
    }
}
