//! cluster: canonical choice per duplicate cluster (SPEC §6.4), and anchor forwarding to it.
//!
//! - Trigger: `cluster:dirty` of `c:<hash>` (weak: set by dedup when membership changes, by
//!   parse when a member's declared canonical changes and by indegree when a member's
//!   in-degree or names change).
//! - Reads: the members (`c:<hash>\0<url>` rows) and each member's `indeg:indeg`,
//!   `page:canonical`, `indeg:names`, `fwd:names` (for [`forward`]) and `page:declared`, in
//!   one call.
//! - Writes: `cluster:canonical` on the head, and `page:canonical` of every member whose
//!   canonical changed, with the member's `dedup:registered` written back unchanged (see
//!   [`hold_membership`]). The canonical is the member with the most votes (each member's
//!   declared canonical is a vote for the member it names, by URL or alias; one naming no
//!   member casts none), then the highest in-degree, then the shorter URL, then the
//!   lexicographically smaller (SPEC §6.4).
//! - Then, in the same transaction, [`forward`] (the canonical's `fwd:names`), from the names
//!   read here; its contract is in its module.
//! - Publishes the cluster in the band index of near-duplicates ([`publish`]: `s:` rows and
//!   `near:registered`, from the simhash its member rows hold).
//! - Notifies: export of every member whose canonical changed (weakly); the head's
//!   `near:dirty` when its canonical or its band rows changed ([`crate::near`] tells the
//!   near-duplicates).
//! - Twice is harmless: the choice is a function of the current rows; only differences are
//!   written.

use std::cmp::Reverse;
use std::collections::HashMap;

use async_trait::async_trait;
use bytes::Bytes;
use perc_notify::{Observer, ObserverError};
use perc_txn::Transaction;

use crate::model::{self, col};
use crate::{forward, IndexError};

pub struct Cluster;

/// Writes back, unchanged, the registration of a member whose row this run writes
/// (`dedup:registered` = the cluster's hash, as the membership row just read says): a write
/// skew otherwise. dedup may move the page to another cluster after this snapshot, whose run
/// may then find nothing to change on the page's row and write nothing there; this run's
/// stale write to the row would stand. Writing the cell dedup writes turns the skew into a
/// write-write conflict, so this run retries and sees the move. indegree holds a page's
/// registration the same way when it tells the page's cluster.
pub fn hold_membership(txn: &mut Transaction, member_row: &Bytes, hash: impl Into<Bytes>) {
    txn.set(member_row.clone(), Bytes::from_static(col::HASH_REGISTERED), hash);
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
        let (start, end) = model::children("c:", &hash);
        let rows = txn.scan(&start, &end, col::MEMBER).await?;
        // Members share their body, so the first one's simhash is the cluster's.
        let simhash = rows.first().and_then(|(_, v)| model::parse_simhash(v));
        let members: Vec<String> =
            rows.iter().filter_map(|(r, _)| model::child_key(r).map(str::to_string)).collect();
        if members.is_empty() {
            let gone = model::delete_if_present(txn, row, col::CLUSTER_CANONICAL).await?;
            publish(txn, row, &hash, None, gone).await?;
            return Ok(());
        }
        let keys: Vec<(Bytes, Bytes)> = members
            .iter()
            .flat_map(|m| {
                [
                    (model::page(m), Bytes::from_static(col::INDEG)),
                    (model::page(m), Bytes::from_static(col::CANONICAL)),
                    (model::page(m), Bytes::from_static(col::NAMES)),
                    (model::page(m), Bytes::from_static(col::FWD_NAMES)),
                    (model::page(m), Bytes::from_static(col::DECLARED)),
                ]
            })
            .collect();
        let got = txn.get_many(&keys).await?;
        let cell = |i: usize, k: usize| got[CELLS * i + k].as_ref();
        let indeg = |i: usize| -> u64 {
            cell(i, 0).and_then(|v| std::str::from_utf8(v).ok()?.parse().ok()).unwrap_or(0)
        };
        let names: Vec<Option<Bytes>> = (0..members.len()).map(|i| cell(i, 2).cloned()).collect();
        let declared: Vec<Option<&Bytes>> = (0..members.len()).map(|i| cell(i, 4)).collect();
        let votes = votes(&members, &names, &declared)?;
        let best = (0..members.len())
            .min_by_key(|&i| (Reverse((votes[i], indeg(i))), members[i].len(), members[i].clone()))
            .expect("members is not empty");
        let canonical = members[best].clone();
        let moved =
            model::set_if_changed(txn, row, col::CLUSTER_CANONICAL, Bytes::from(canonical.clone()))
                .await?;
        publish(txn, row, &hash, simhash, moved).await?;
        for (i, m) in members.iter().enumerate() {
            if cell(i, 1).map(|c| &c[..]) != Some(canonical.as_bytes()) {
                let member_row = model::page(m);
                txn.set(member_row.clone(), Bytes::from_static(col::CANONICAL), canonical.clone());
                hold_membership(txn, &member_row, hash.clone());
                txn.notify(member_row, Bytes::from_static(col::EXPORT_DIRTY));
            }
        }
        let forwarded: Vec<Option<Bytes>> =
            (0..members.len()).map(|i| cell(i, 3).cloned()).collect();
        forward::run(txn, &hash, &members, &names, &forwarded, &canonical).await?;
        Ok(())
    }
}

/// Keeps the cluster's rows in the band index (SPEC §6.4a) those of `simhash` (none for an
/// empty cluster or a body of under 3 tokens): the rows of a simhash it no longer has are
/// deleted, those of the new one written, and `near:registered` says which it has. The rows
/// are written unchecked: only this head's runs write them, and those conflict on
/// `near:registered`. When they or the canonical (`moved`) changed, and the cluster has or
/// had a simhash, `near:published` gets a new value (this run's start and the simhash) and
/// [`crate::near`] is told: near-duplicates may have seen what changed.
async fn publish(
    txn: &mut Transaction,
    head: &Bytes,
    hash: &str,
    simhash: Option<u64>,
    moved: bool,
) -> Result<(), ObserverError> {
    let registered =
        txn.get(head, col::NEAR_REGISTERED).await?.and_then(|v| model::parse_simhash(&v));
    if registered != simhash {
        for band in registered.map(|s| model::bands(s, hash)).into_iter().flatten() {
            txn.delete_unchecked(band, Bytes::from_static(col::BAND));
        }
        match simhash {
            Some(s) => {
                for band in model::bands(s, hash) {
                    txn.set_unchecked(band, Bytes::from_static(col::BAND), model::simhash_hex(s));
                }
                let value = model::simhash_hex(s);
                txn.set(head.clone(), Bytes::from_static(col::NEAR_REGISTERED), value);
            }
            None => txn.delete(head.clone(), Bytes::from_static(col::NEAR_REGISTERED)),
        }
    } else if !moved {
        return Ok(());
    }
    if let Some(s) = simhash.or(registered) {
        let published = format!("{:016x} {}", txn.start_ts().0, model::simhash_hex(s));
        txn.set(head.clone(), Bytes::from_static(col::NEAR_PUBLISHED), published);
        txn.notify(head.clone(), Bytes::from_static(col::NEAR_DIRTY));
    }
    Ok(())
}

/// The cells read of each member, in this order: `indeg:indeg`, `page:canonical`,
/// `indeg:names`, `fwd:names`, `page:declared`.
const CELLS: usize = 5;

/// Each member's votes: how many members declare, as their canonical, its URL or one of its
/// aliases (`names`: each member's `indeg:names`; a member whose names are not written yet
/// is named by its URL). A declared canonical naming no member casts no vote.
fn votes(
    members: &[String],
    names: &[Option<Bytes>],
    declared: &[Option<&Bytes>],
) -> Result<Vec<u64>, IndexError> {
    let mut by_name: HashMap<String, usize> = HashMap::new();
    for (i, (m, raw)) in members.iter().zip(names).enumerate() {
        by_name.insert(m.clone(), i);
        if let Some(raw) = raw {
            for name in model::names_union([raw])? {
                by_name.insert(name, i);
            }
        }
    }
    let mut votes = vec![0; members.len()];
    for d in declared.iter().flatten() {
        if let Some(&i) = std::str::from_utf8(d).ok().and_then(|d| by_name.get(d)) {
            votes[i] += 1;
        }
    }
    Ok(votes)
}
