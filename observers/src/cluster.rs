//! cluster: canonical choice per duplicate cluster (spec §6.4), and anchor forwarding to it.
//!
//! - Trigger: `cluster:dirty` of `c:<hash>` (weak: set by dedup when membership changes, by
//!   parse when a member's declared canonical changes and by indegree when a member's names
//!   or in-degree change, in a cluster of more than one).
//! - Also runs as [`found`], in the parse run of a page that is a new cluster's
//!   first member (most pages: a body of their own), which then needs no run of cluster;
//!   and a cluster of one is not told of its member's names or in-degree (see
//!   [`mark_alone`]: indegree forwards the names itself).
//! - Reads: the members (`c:<hash>\0<url>` rows) and each member's `indeg:indeg`,
//!   `page:canonical`, `indeg:names`, `fwd:names` (for [`crate::forward`]), `page:declared` and
//!   `cluster:alone`, in one call.
//! - Writes: `cluster:canonical` on the head, and `page:canonical` of every member whose
//!   canonical changed, with the member's `dedup:registered` written back unchanged (see
//!   [`model::signals::hold_membership`]); and each member's `cluster:alone` ([`mark_alone`]: the cluster's
//!   hash on the member of a cluster of one, absent on the members of a larger one). The
//!   canonical is the member with the most votes (each member's
//!   declared canonical is a vote for the member it names, by URL or alias; one naming no
//!   member casts none), then the highest in-degree, then the shorter URL, then the
//!   lexicographically smaller (spec §6.4).
//! - Returns the [`Choice`]: what follows it in the same transaction ([`crate::runs`]):
//!   [`crate::forward`] (the canonical's `fwd:names`) from the names read here, and
//!   [`crate::export`] of every member whose canonical changed (their lines show it).
//! - Keeps the cluster's entry in the band index of near-duplicates ([`publish`]: its
//!   simhash, from its member rows, and its canonical, in the `near:block` cells of its four
//!   blocks, and `near:registered`); when the entry changes, writes its `near:list` and tells
//!   the clusters near it (see [`crate::near`] for why none is missed).
//! - Notifies: `near:dirty` of every cluster within 3 bits of its entry, old or new, when
//!   the entry changed.
//! - Twice is harmless: the choice is a function of the current rows; only differences are
//!   written.

use std::cmp::Reverse;
use std::collections::HashMap;

use bytes::Bytes;
use perc_notify::ObserverError;
use perc_txn::Transaction;

use crate::model::{self, col, rows, BlockEntry, Forward};
use crate::IndexError;

/// A cluster's choice, and what has to follow it in its transaction: the rows of the members
/// whose canonical moved (their export lines show it), and the forwarding of the members'
/// names to the canonical.
pub struct Choice {
    pub moved: Vec<Bytes>,
    pub forward: Forward,
}

/// Keeps each member's `cluster:alone` true: the cluster's hash on the member of a cluster of
/// one, absent on every member of a larger one. It lets indegree skip telling a cluster of
/// one that its member's in-degree or names changed: the choice among one member depends on
/// neither, and the one thing such a run would do, forwarding the member's names to itself,
/// indegree does in its own transaction.
///
/// Why no change is missed: indegree skips only when the mark names the cluster its page is
/// registered in, and writes the mark back unchanged. A member joining makes dedup tell the
/// cluster (a cluster with a member is never chosen for by [`found`]), and that run, seeing
/// two members, deletes the mark: it conflicts with any indegree run that overlaps it and
/// skipped on the mark, and a run after it reads the new in-degree and names. (Two runs of
/// one cluster that commit do not overlap: both write the head's ack of cluster, as
/// [`found`] does.) A stale mark, from a cluster the page has since left, names another hash
/// and is ignored.
fn mark_alone(txn: &mut Transaction, members: &[String], marks: &[Option<&Bytes>], hash: &str) {
    let alone = members.len() == 1;
    for (m, mark) in members.iter().zip(marks) {
        if alone && mark.map(|v| &v[..]) != Some(hash.as_bytes()) {
            txn.set(model::page(m), Bytes::from_static(col::ALONE), hash.to_string());
        } else if !alone && mark.is_some() {
            txn.delete(model::page(m), Bytes::from_static(col::ALONE));
        }
    }
}

/// The stage, as a run of cluster on the head `row`: reads the members and chooses. `None`
/// for an empty cluster (nothing follows).
pub async fn run(txn: &mut Transaction, row: &Bytes) -> Result<Option<Choice>, ObserverError> {
    let Some(hash) = rows::CLUSTERS.key_of(row) else {
        return Ok(None);
    };
    let (start, end) = model::children(&rows::CLUSTERS, hash);
    let rows = txn.scan(&start, &end, col::MEMBER).await?;
    choose(txn, row, hash, &rows).await
}

/// The stage, in the parse run of the page `url` that dedup has just registered under `hash`
/// (its member row's value `simhash`, as dedup wrote it): when the page is the cluster's only
/// member and the cluster has never been chosen for (no `cluster:canonical` on its head, as
/// for every new content hash), does here what a run of cluster on the head would do, and
/// returns its [`Choice`] (what follows it is the caller's, as after a run); otherwise does
/// nothing and returns `None` (the cluster is then told, and its run chooses). A page with content of its own then costs no run of cluster (~14 of
/// a replayed page's ~32 store calls went to it on a synthetic web).
///
/// - Reads: the member rows under `c:<hash>` (one scan of their rows, without values), then
///   in one call the head's cells and the band index cells of the simhash's blocks.
/// - Writes: what [`choose`] writes for one member, and the head's ack of cluster
///   ([`perc_notify::record_run`]): this transaction is a run of cluster on the head.
///
/// Why nothing is missed, though this transaction holds no lease of the head:
/// - The ack settles every notification of the head older than this transaction's start, so
///   this transaction must have seen all they announce: hence the scan of the member rows
///   (the head's `cluster:canonical` alone would miss a member whose join is committed and
///   whose notification is still pending).
/// - Every run of cluster on the head that commits writes the same ack, and so does every
///   other transaction taking this path for the head; of two that overlap, one does not
///   commit. So no choice for the head commits between this one's start and its commit.
/// - An idle run of the head that overlaps this one saw no `cluster:canonical` on the head
///   (no choice committed since this one's start), so no member (with a member it would
///   write a choice): it settled a notification of an empty cluster, and this one makes the
///   cluster's first choice.
/// - A page that joins the cluster meanwhile either takes this path too (the ack: one of the
///   two retries and sees the other's member) or tells the head, whose run sees this page's
///   member or overlaps this transaction (the ack again). A member cannot leave meanwhile:
///   there was none.
/// - The member's cells that the choice reads and others write: its `indeg:names` and
///   `indeg:indeg` are written by its indegree run, which writes the page's
///   `dedup:registered` back whenever it changes either (see [`model::signals::hold_membership`]), a cell
///   this transaction writes, so the two conflict; `page:declared` is this transaction's
///   own. The rest are written only by cluster runs, which [`model::signals::hold_membership`] keeps off a
///   page that moved.
pub async fn found(
    txn: &mut Transaction,
    hash: &str,
    url: &str,
    simhash: &Bytes,
) -> Result<Option<Choice>, ObserverError> {
    let head = model::cluster_head(hash);
    let member = model::member(hash, url);
    let (start, end) = model::children(&rows::CLUSTERS, hash);
    if txn.scan_rows(&start, &end, col::MEMBER).await? != [member.clone()] {
        return Ok(None);
    }
    let mut keys: Vec<(Bytes, Bytes)> =
        [col::CLUSTER_CANONICAL, col::NEAR_REGISTERED, col::NEAR_LIST]
            .map(|c| (head.clone(), Bytes::from_static(c)))
            .into();
    if let Some(s) = model::parse_simhash(simhash) {
        keys.extend(model::blocks(s).map(|b| (b, Bytes::from_static(col::BLOCK))));
    }
    if txn.get_many(&keys).await?[0].is_some() {
        return Ok(None);
    }
    let choice = choose(txn, &head, hash, &[(member, simhash.clone())]).await?;
    perc_notify::record_run(txn, &head, CLUSTER);
    Ok(choice)
}

/// The observer's name (the registry's, and the ack [`found`] writes).
pub const CLUSTER: &str = "cluster";

/// The choice for the cluster of `hash` (head row `row`) whose member rows are `rows`
/// (`c:<hash>\0<url>`, each with its `cluster:member` value): what the module's contract
/// lists after its reads. `None` for a cluster with no member.
async fn choose(
    txn: &mut Transaction,
    row: &Bytes,
    hash: &str,
    rows: &[(Bytes, Bytes)],
) -> Result<Option<Choice>, ObserverError> {
    // Members share their body, so the first one's simhash is the cluster's.
    let simhash = rows.first().and_then(|(_, v)| model::parse_simhash(v));
    let members: Vec<String> =
        rows.iter().filter_map(|(r, _)| model::child_key(r).map(str::to_string)).collect();
    if members.is_empty() {
        model::delete_if_present(txn, row, col::CLUSTER_CANONICAL).await?;
        let registered = txn.get(row, col::NEAR_REGISTERED).await?;
        publish(txn, row, hash, None, registered.as_ref()).await?;
        return Ok(None);
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
                (model::page(m), Bytes::from_static(col::ALONE)),
            ]
        })
        .chain([
            (row.clone(), Bytes::from_static(col::NEAR_REGISTERED)),
            (Bytes::from_static(model::CONFIG_ROW), Bytes::from_static(col::CANONICAL_BY)),
        ])
        .collect();
    let got = txn.get_many(&keys).await?;
    let registered = got[got.len() - 2].as_ref();
    let by = CanonicalBy::stored(got.last().expect("the rule's cell").as_ref())?;
    let cell = |i: usize, k: usize| got[CELLS * i + k].as_ref();
    let indeg = |i: usize| -> u64 {
        cell(i, 0).and_then(|v| std::str::from_utf8(v).ok()?.parse().ok()).unwrap_or(0)
    };
    let names: Vec<Option<Bytes>> = (0..members.len()).map(|i| cell(i, 2).cloned()).collect();
    let declared: Vec<Option<&Bytes>> = (0..members.len()).map(|i| cell(i, 4)).collect();
    let votes = votes(&members, &names, &declared)?;
    let marks: Vec<Option<&Bytes>> = (0..members.len()).map(|i| cell(i, 5)).collect();
    mark_alone(txn, &members, &marks, hash);
    // The importance each member is ranked by after its votes: its in-degree, or the bits
    // of its PageRank (positive finite floats order as their bits do).
    let importance: Vec<u64> = match by {
        CanonicalBy::InDegree => (0..members.len()).map(indeg).collect(),
        CanonicalBy::PageRank => ranked(txn, hash, &members).await?,
    };
    let best = (0..members.len())
        .min_by_key(|&i| (Reverse((votes[i], importance[i])), members[i].len(), members[i].clone()))
        .expect("members is not empty");
    let canonical = members[best].clone();
    model::set_if_changed(txn, row, col::CLUSTER_CANONICAL, Bytes::from(canonical.clone())).await?;
    let entry = simhash.map(|simhash| BlockEntry {
        hash: hash.to_string(),
        simhash,
        canonical: canonical.clone(),
    });
    publish(txn, row, hash, entry, registered).await?;
    let mut moved = Vec::new();
    for (i, m) in members.iter().enumerate() {
        if cell(i, 1).map(|c| &c[..]) != Some(canonical.as_bytes()) {
            let member_row = model::page(m);
            txn.set(member_row.clone(), Bytes::from_static(col::CANONICAL), canonical.clone());
            model::signals::hold_membership(txn, &member_row, hash.to_string());
            moved.push(member_row);
        }
    }
    let forwarded: Vec<Option<Bytes>> = (0..members.len()).map(|i| cell(i, 3).cloned()).collect();
    let forward = Forward { hash: hash.to_string(), members, names, forwarded, canonical };
    Ok(Some(Choice { moved, forward }))
}

/// Keeps the cluster's entry in the band index (spec §6.4a) what it is now: `entry` (none
/// for an empty cluster or a body of under 3 tokens), against `registered`, the head's
/// `near:registered`. When it changed: the entry leaves the `near:block` cells of the old
/// simhash's blocks and is written into those of the new one's (checked cells: overlapping
/// runs of near-duplicate clusters conflict on the cell they share), the head's
/// `near:list` is computed from the cells read, and every cluster within 3 bits of the old
/// or the new entry is told (`near:dirty`): their lists name this cluster's canonical, or
/// should. All in one read of the cells and the list.
async fn publish(
    txn: &mut Transaction,
    head: &Bytes,
    hash: &str,
    entry: Option<BlockEntry>,
    registered: Option<&Bytes>,
) -> Result<(), ObserverError> {
    let was = registered.and_then(|r| BlockEntry::from_registered(hash, r));
    if entry == was {
        return Ok(());
    }
    let mut rows: Vec<Bytes> = Vec::new();
    for e in was.iter().chain(entry.iter()) {
        for b in model::blocks(e.simhash) {
            if !rows.contains(&b) {
                rows.push(b);
            }
        }
    }
    let keys: Vec<(Bytes, Bytes)> = rows
        .iter()
        .map(|r| (r.clone(), Bytes::from_static(col::BLOCK)))
        .chain([(head.clone(), Bytes::from_static(col::NEAR_LIST))])
        .collect();
    let mut cells = txn.get_many(&keys).await?;
    let list = cells.pop().expect("the list's cell");
    let new_blocks = entry.as_ref().map(|e| model::blocks(e.simhash));
    // The clusters near the old entry and near the new one.
    let (mut near_was, mut near_now) = (Vec::new(), Vec::new());
    for (row, cell) in rows.iter().zip(&cells) {
        let mut entries = cell.as_deref().map(model::block_entries).unwrap_or_default();
        entries.retain(|e| e.hash != hash);
        if let Some(was) = &was {
            model::add_near(&mut near_was, was, &entries);
        }
        if let Some(entry) = &entry {
            model::add_near(&mut near_now, entry, &entries);
            if new_blocks.as_ref().is_some_and(|b| b.contains(row)) {
                let at = entries.partition_point(|e| e.hash.as_str() < hash);
                entries.insert(at, entry.clone());
            }
        }
        match model::block_value(&entries) {
            Some(value) => txn.set(row.clone(), Bytes::from_static(col::BLOCK), value),
            None => txn.delete(row.clone(), Bytes::from_static(col::BLOCK)),
        }
    }
    model::write_near_list(txn, head, list.as_ref(), &near_now)?;
    let mut told: Vec<&str> = near_was.iter().chain(&near_now).map(|e| e.hash.as_str()).collect();
    told.sort_unstable();
    told.dedup();
    for h in told {
        txn.notify(model::cluster_head(h), Bytes::from_static(col::NEAR_DIRTY));
    }
    match &entry {
        Some(e) => txn.set(head.clone(), Bytes::from_static(col::NEAR_REGISTERED), e.registered()),
        None => txn.delete(head.clone(), Bytes::from_static(col::NEAR_REGISTERED)),
    }
    Ok(())
}

/// What a cluster's canonical is, after the votes (spec §6.4, `index.canonical_by`): the
/// member with the highest in-degree (exact, whatever order the updates came in), or with
/// the highest PageRank (the paper's choice; two members whose ranks are within the rank's
/// bound of each other may be chosen either way). A store keeps the rule it was built with
/// (`cluster:by` of `m:config`, see [`keep_rule`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CanonicalBy {
    #[default]
    InDegree,
    PageRank,
}

impl CanonicalBy {
    /// The rule `cluster:by` holds: absent is by in-degree.
    pub(crate) fn stored(cell: Option<&Bytes>) -> Result<CanonicalBy, IndexError> {
        match cell.map(|c| &c[..]) {
            None => Ok(CanonicalBy::InDegree),
            Some(b"pagerank") => Ok(CanonicalBy::PageRank),
            Some(other) => Err(IndexError::corrupt("cluster:by of m:config", other.escape_ascii())),
        }
    }

    /// Its name, as `index.canonical_by` spells it.
    pub fn name(self) -> &'static str {
        match self {
            CanonicalBy::InDegree => "indegree",
            CanonicalBy::PageRank => "pagerank",
        }
    }
}

/// Records the rule of a store that has chosen no canonical yet, and checks the rule of one
/// that has: a store keeps the rule its canonical URLs were chosen by, and a configuration
/// asking for the other one is an error that names both ([`IndexError::Rule`]).
pub async fn keep_rule(client: &perc_txn::Client, by: CanonicalBy) -> Result<(), IndexError> {
    let outcome = client
        .retrying(|c| async move {
            let mut t = c.begin().await?;
            let cell = t.get(model::CONFIG_ROW, col::CANONICAL_BY).await?;
            let stored = match CanonicalBy::stored(cell.as_ref()) {
                Ok(stored) => stored,
                Err(e) => return Ok(Err(e)),
            };
            if stored == by {
                return Ok(Ok(()));
            }
            let chosen = t
                .scan_first(rows::CLUSTERS.start(), rows::CLUSTERS.end(), col::CLUSTER_CANONICAL, 1)
                .await?;
            if !chosen.is_empty() {
                return Ok(Err(IndexError::Rule { stored: stored.name(), asked: by.name() }));
            }
            let row = Bytes::from_static(model::CONFIG_ROW);
            match by {
                CanonicalBy::PageRank => t.set(
                    row,
                    Bytes::from_static(col::CANONICAL_BY),
                    Bytes::from_static(b"pagerank"),
                ),
                CanonicalBy::InDegree => t.delete(row, Bytes::from_static(col::CANONICAL_BY)),
            }
            t.commit().await.map(|_| Ok(()))
        })
        .await?;
    outcome
}

/// The members' PageRanks (as the bits of the floats, 0 for a member not ranked yet), for a
/// choice by PageRank; and keeps each member's `rank:cluster` true: the hash on every member
/// of a cluster of more than one (a rank run that moves the member's rank tells the cluster),
/// absent on the member of a cluster of one.
///
/// Why no move is missed: a rank run reads the mark when it reads the rank. A run that read
/// no mark and moves the rank of a member this transaction marks overlaps it, or committed
/// before it (this read its rank), or starts after it (it reads the mark). The overlapping
/// one writes its bucket's `rank:folded`, checked, as every transaction that writes rank cells
/// does, and so does this one when it writes a mark, rewriting the value it read: one of the
/// two does not commit.
async fn ranked(
    txn: &mut Transaction,
    hash: &str,
    members: &[String],
) -> Result<Vec<u64>, IndexError> {
    let keys = model::cells_of(
        members.iter().map(|m| model::rank_row(m)),
        &[col::RANK, col::RANK_CLUSTER],
    );
    let cells = txn.get_many(&keys).await?;
    let want = (members.len() > 1).then_some(hash.as_bytes());
    let mut buckets = std::collections::BTreeSet::new();
    let mut ranks = Vec::new();
    for (m, cells) in members.iter().zip(cells.chunks(2)) {
        let x = crate::rank::shown(m, &cells[0])?;
        ranks.push(if x > 0.0 { x.to_bits() } else { 0 });
        let row = model::rank_row(m);
        match (cells[1].as_deref(), want) {
            (had, Some(want)) if had != Some(want) => {
                txn.set(row, Bytes::from_static(col::RANK_CLUSTER), hash.to_string());
                buckets.insert(model::rank_bucket(m));
            }
            (Some(_), None) => txn.delete(row, Bytes::from_static(col::RANK_CLUSTER)),
            _ => {}
        }
    }
    for b in buckets {
        crate::rank::hold_mark(txn, b).await?;
    }
    Ok(ranks)
}

/// The cells read of each member, in this order: `indeg:indeg`, `page:canonical`,
/// `indeg:names`, `fwd:names`, `page:declared`, `cluster:alone`.
const CELLS: usize = 6;

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
