//! cluster: canonical choice per duplicate cluster (SPEC §6.4).
//!
//! - Trigger: `cluster:dirty` of `c:<hash>` (weak: set by dedup when membership changes and by
//!   indegree when a member's in-degree or names change).
//! - Reads: the members (`c:<hash>\0<url>` rows) and each member's `indeg:indeg`,
//!   `page:canonical` and `indeg:names`.
//! - Writes: `cluster:canonical` on the head, and `page:canonical` of every member whose
//!   canonical changed. The canonical is the member with the highest in-degree; ties go to the
//!   shorter URL, then the lexicographically smaller. `cluster:digest` on the head: a digest of
//!   what forward of the canonical reads (the canonical and its members' names).
//! - Notifies: forward of the canonical when that digest changed (not on every change of an
//!   in-degree: forward's output does not depend on it), and export and forward of every
//!   member whose canonical changed (weakly).
//! - Twice is harmless: the choice is a function of the current rows; only differences are
//!   written.

use std::cmp::Reverse;

use async_trait::async_trait;
use bytes::Bytes;
use perc_notify::{Observer, ObserverError};
use perc_txn::Transaction;

use crate::model::{self, col};

pub struct Cluster;

/// The members of a cluster, by URL.
pub async fn members(txn: &Transaction, hash: &str) -> Result<Vec<String>, ObserverError> {
    Ok(model::child_keys(txn, "c:", hash, col::MEMBER).await?)
}

#[async_trait]
impl Observer for Cluster {
    async fn observe(
        &self,
        txn: &mut Transaction,
        row: &Bytes,
        _column: &Bytes,
    ) -> Result<(), ObserverError> {
        let Some(hash) = row.strip_prefix(b"c:").and_then(|h| std::str::from_utf8(h).ok()) else {
            return Ok(());
        };
        let hash = hash.to_string();
        let members = members(txn, &hash).await?;
        if members.is_empty() {
            model::delete_if_present(txn, row, col::CLUSTER_CANONICAL).await?;
            model::delete_if_present(txn, row, col::CLUSTER_DIGEST).await?;
            return Ok(());
        }
        let keys: Vec<(Bytes, Bytes)> = members
            .iter()
            .flat_map(|m| {
                [
                    (model::page(m), Bytes::from_static(col::INDEG)),
                    (model::page(m), Bytes::from_static(col::CANONICAL)),
                    (model::page(m), Bytes::from_static(col::NAMES)),
                ]
            })
            .collect();
        let got = txn.get_many(&keys).await?;
        let indeg = |i: usize| -> u64 {
            got[3 * i].as_ref().and_then(|v| std::str::from_utf8(v).ok()?.parse().ok()).unwrap_or(0)
        };
        let best = (0..members.len())
            .min_by_key(|&i| (Reverse(indeg(i)), members[i].len(), members[i].clone()))
            .expect("members is not empty");
        let canonical = members[best].clone();
        model::set_if_changed(txn, row, col::CLUSTER_CANONICAL, Bytes::from(canonical.clone()))
            .await?;
        for (i, m) in members.iter().enumerate() {
            if got[3 * i + 1].as_deref() != Some(canonical.as_bytes()) {
                let member_row = model::page(m);
                txn.set(member_row.clone(), Bytes::from_static(col::CANONICAL), canonical.clone());
                txn.notify(member_row.clone(), Bytes::from_static(col::EXPORT_DIRTY));
                txn.notify(member_row, Bytes::from_static(col::FWD_DIRTY));
            }
        }
        // What forward of the canonical reads: tell it only when that changed.
        let names = model::names_union((0..members.len()).filter_map(|i| got[3 * i + 2].as_ref()))?;
        let mut digest = blake3::Hasher::new();
        digest.update(canonical.as_bytes());
        for name in &names {
            digest.update(b"\n").update(name.as_bytes());
        }
        let digest = Bytes::from(digest.finalize().to_hex().to_string());
        if model::set_if_changed(txn, row, col::CLUSTER_DIGEST, digest).await? {
            txn.notify(model::page(&canonical), Bytes::from_static(col::FWD_DIRTY));
        }
        Ok(())
    }
}
