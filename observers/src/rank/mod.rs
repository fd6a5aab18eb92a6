//! rank: each page's PageRank (spec §6.4b), kept current by pushes.
//!
//! The graph is the in-degree's: q → p for each distinct pair of pages where q links to p or
//! to an alias of p (q ≠ p); PR(p) = 0.15 + 0.85 · Σ PR(q) / outdeg(q). Each page keeps an
//! estimate x(p) and A(p), the sum of what its sources pushed to it (its shard holds both,
//! below); its residual is ρ(p) = 0.15 + A(p) − x(p). A source q pushes w(q) = 0.85 · x(q) /
//! |S(q)| to each page of its out-set S(q) (`rank:out`), as changes: when x(q) or S(q)
//! changes, each target gets the difference of what q pushes it. At quiescence every push
//! is folded (A(p) = Σ w(q) over its sources) and |ρ(p)| ≤ [`EPSILON`] for every page, so
//! x − x̂ = (I − 0.85 M)⁻¹ ρ, and |x − x̂| ≤ (ε / 0.15) · x: with ε = 1e-4, within 0.00067 · x
//! of the exact rank, inside the bound of max(0.001, 0.001 · x) (the rank shown, below, is
//! off by at most what is left of it).
//!
//! Pushes are combined as Fluo's CombineQueue combines updates: they are rows of the
//! target's bucket (`g:<bucket>\0<target>\0<ts>`, one per writing transaction and target,
//! written without a lock), and one run of the bucket folds them all, so that a page with
//! thousands of sources is no conflict hot spot. The run then lets each page whose residual
//! passes ε absorb it (x += ρ) and push on, in memory, round after round, folding the pushes
//! to pages of its bucket in the same transaction (Gauss–Seidel) and writing those to other
//! buckets as rows; past [`PAGES_MAX`] pages or [`READS_MAX`] rounds that read, what is
//! left goes back to its bucket's rows.
//!
//! A page's state (x, A) lives in its shard's row with 1/64 of the bucket's pages
//! ([`shard`]): an update moves the A of thousands of pages, and a run writes 64 rows for
//! them. What the export, the cluster and search read is the rank shown, in the
//! page's `k:` row (`rank:rank`) with its out-set (`rank:out`): it follows x when x leaves it
//! by more than the bound leaves room for ([`shard::leeway`]).
//!
//! - Trigger: `rank:dirty` of the bucket's head row `g:<bucket>` (weak), set with every
//!   push row and every word to resolve a page's out-set again (`rank:resolve`, or
//!   `rank:resolves` for a transaction's list of them, [`model::resolves`]): parse
//!   writes one when a page's links or what it is change, and, when a URL parsed before
//!   becomes or stops being a page, one that has the run resolve its sources too (the `e:`
//!   rows into it and the `x:` rows of those that reach it through aliases, enumerated in
//!   the run, after that commit); indegree, for the sources whose links to an alias resolve
//!   elsewhere, or to a URL that became a page.
//! - Reads: the store's canonical rule, the bucket's rows (at most [`FOLD_MAX`]; the rest by
//!   a run it asks for), the shards of the pages they name and those its pushes reach,
//!   `rank:out` of those that move, `rank:cluster` of those whose rank shown moves (with
//!   the rule by PageRank), and
//!   for a page to resolve,
//!   `page:meta`, `page:links` and what the links count for: a page, or the page an alias's
//!   chain ends at (`indeg:alias_of`), as the in-degree counts them
//!   ([`model::pages_counted_for`]). A URL that is not a page has no rank and pushes nothing.
//! - Writes: the shards that changed, the ranks shown and out-sets that changed, push rows
//!   to other buckets, its mark; a search queue row for a page whose rank shown left its band
//!   ([`search::band`]).
//! - Notifies: the cluster of a page whose rank shown moved, when its `rank:cluster` names
//!   one (a cluster of more than one member that chooses its canonical by PageRank).
//! - Takes its rows by a mark, as indegree takes its change rows (`rank:folded`).
//! - Twice is harmless: a run with nothing to fold writes nothing.
//! - A crawl or a replay defers the runs (`m:config rank:deferred`) and [`settle`]s at its
//!   end.

use std::collections::{BTreeMap, BTreeSet};

use async_trait::async_trait;
use bytes::Bytes;
use perc_notify::{Observer, ObserverError};
use perc_txn::{Found, RangeScan, Transaction};
use serde::{Deserialize, Serialize};

use crate::cluster::CanonicalBy;
use crate::model::{self, col, rows, Meta, PageKind};
use crate::search;
use crate::IndexError;

mod settle;
pub mod shard;

pub use settle::{defer, deferred, settle};
use shard::{Entry, Shards, Slot};

/// The residual a page absorbs past.
pub const EPSILON: f64 = 1e-4;

/// The damping factor.
pub const DAMPING: f64 = 0.85;

/// The rank a page starts from, and what it gets with no source.
pub const TELEPORT: f64 = 1.0 - DAMPING;

/// The bound each page's rank is kept within of the exact PageRank at quiescence (spec
/// §6.4b): max(0.001, 0.001 · exact).
pub fn bound(exact: f64) -> f64 {
    0.001f64.max(0.001 * exact.abs())
}

/// What the export's six decimals add to the bound between two written ranks.
pub const ROUNDING: f64 = 2e-6;

/// The columns of a bucket's rows that a run takes (and settle clears): pushes, words to
/// resolve one URL's out-set, and lists of them ([`model::resolves`]).
pub(crate) const TAKEN: [&[u8]; 3] = [col::PUSH, col::RESOLVE, col::RESOLVES];

/// Push rows a run folds at most.
pub const FOLD_MAX: usize = 16384;

/// Pages a run reads at most: past them, what is left to fold goes back to the bucket.
pub const PAGES_MAX: usize = 4096;

/// Rounds of absorbing that read the store a run does at most (rounds among the pages it
/// has read cost no call).
pub const READS_MAX: usize = 24;

/// What a page's pushes go to (`rank:out`): its out-set. What it pushes each target is its
/// weight, [`weight`]; a URL that is not a page has no rank and pushes nothing.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Out {
    /// Its targets, sorted.
    pub targets: Vec<String>,
}

/// What a source of rank `x` pushes each target of `out`: 0.85 · x / |S|.
fn weight(x: f64, out: &Out) -> f64 {
    match out.targets.len() {
        0 => 0.0,
        n => DAMPING * x / n as f64,
    }
}

fn number(raw: &[u8], what: &str, url: &str) -> Result<f64, IndexError> {
    std::str::from_utf8(raw)
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|x| x.is_finite())
        .ok_or_else(|| IndexError::corrupt(format!("{what} of {url}"), raw.escape_ascii()))
}

/// A page's rank state as its shard holds it: x, A and the rank shown (for tests and
/// diagnostics; the runs read whole shards).
pub async fn state_of(txn: &Transaction, url: &str) -> Result<Entry, IndexError> {
    let slot = Slot::of(url);
    let mut shards = Shards::default();
    shards.load(txn, [&slot]).await?;
    Ok(shards.get(&slot))
}

/// A page's shown rank, its `rank:rank` as stored (none is 0).
pub(crate) fn shown(url: &str, rank: &Option<Bytes>) -> Result<f64, IndexError> {
    match rank {
        None => Ok(0.0),
        Some(raw) => model::rank_of(raw)
            .ok_or_else(|| IndexError::corrupt(format!("rank:rank of {url}"), raw.escape_ascii())),
    }
}

/// A page's `rank:out` as stored (none is the empty set).
fn out_of(url: &str, out: &Option<Bytes>) -> Result<Out, IndexError> {
    Ok(out
        .as_ref()
        .map(|o| serde_json::from_slice(o))
        .transpose()
        .map_err(|e| IndexError::corrupt(format!("rank:out of {url}"), e))?
        .unwrap_or_default())
}

/// A page's rank state as a run found it, and as it leaves it; its out-set is read only
/// when it moves.
#[derive(Debug)]
struct State {
    slot: Slot,
    now: Entry,
    before: Entry,
    out: Option<Out>,
    /// Whether the run resolved its out-set to another one than it read.
    out_changed: bool,
}

/// The stage, as a run of rank on a bucket's head row `row`.
pub async fn run(txn: &mut Transaction, row: &Bytes) -> Result<(), ObserverError> {
    let Some(bucket) = model::rank_head_bucket(row) else { return Ok(()) };
    let cells = [
        (row.clone(), Bytes::from_static(col::RANK_FOLDED)),
        (Bytes::from_static(model::CONFIG_ROW), Bytes::from_static(col::RANK_DEFERRED)),
        (Bytes::from_static(model::CONFIG_ROW), Bytes::from_static(col::CANONICAL_BY)),
    ];
    let [mark, deferred, rule] =
        <[Option<Bytes>; 3]>::try_from(txn.get_many(&cells).await?).expect("three cells");
    if deferred.is_some() {
        // A bulk load: the ranks are settled at its end ([`settle`]), which tells every bucket.
        return Ok(());
    }
    // Only a store that chooses its canonicals by PageRank has clusters to tell (the rule is
    // the store's for good: `cluster::keep_rule`).
    let tell = CanonicalBy::stored(rule.as_ref())? == CanonicalBy::PageRank;
    let mark =
        u64::try_from(model::count_of(mark)?).map_err(|e| IndexError::corrupt("rank:folded", e))?;
    let (start, end) = model::children(&rows::PUSHES, &format!("{bucket:02x}"));
    let ranges: Vec<RangeScan> =
        TAKEN.iter().map(|c| RangeScan::new(&start, &end, c).first(FOLD_MAX)).collect();
    let found = txn.scan_each_found(&ranges).await?;
    let taken = take_pushes(txn, found, mark)?;
    if taken.more {
        txn.notify(row.clone(), Bytes::from_static(col::RANK_DIRTY));
    }
    let mut resolve = taken.resolve;
    let changed: Vec<&str> = taken.sources_of.iter().map(String::as_str).collect();
    if !changed.is_empty() {
        let mut sources = model::child_keys_under(txn, &rows::EDGES, &changed, col::EDGE).await?;
        sources.extend(model::child_keys_under(txn, &rows::VIAS, &changed, col::VIA).await?);
        // A page's cells are written by its own bucket's runs only: the sources of another
        // bucket are told there.
        let (here, there): (Vec<String>, Vec<String>) =
            sources.into_iter().partition(|s| model::rank_bucket(s) == bucket);
        resolve.extend(here);
        model::signals::rank_targets_changed(txn, there.iter().map(String::as_str));
    }
    let outbox = absorb(txn, bucket, taken.pushes, resolve, tell).await?;
    write_pushes(txn, outbox);
    if taken.folded {
        txn.set(
            row.clone(),
            Bytes::from_static(col::RANK_FOLDED),
            Bytes::from(taken.mark.to_string()),
        );
    }
    Ok(())
}

/// Folds `pushes` into the bucket's pages and resolves the out-sets of `resolve`, then lets
/// each page whose residual passes ε absorb it, in rounds: a push to a page of the bucket is
/// folded in the same transaction (Gauss–Seidel inside the bucket), the pushes to another
/// bucket's pages are returned, summed by target, for push rows. Writes the rank cells that
/// changed; `tell`s the clusters of the pages whose rank shown moved.
async fn absorb(
    txn: &mut Transaction,
    bucket: u8,
    mut pushes: BTreeMap<String, f64>,
    mut resolve: BTreeSet<String>,
    tell: bool,
) -> Result<BTreeMap<String, f64>, IndexError> {
    let mut states: BTreeMap<String, State> = BTreeMap::new();
    let mut shards = Shards::default();
    let mut outbox: BTreeMap<String, f64> = BTreeMap::new();
    let mut reads = 0;
    loop {
        let due: BTreeSet<String> = pushes.keys().chain(&resolve).cloned().collect();
        if due.is_empty() {
            break;
        }
        if due.iter().any(|u| !states.contains_key(u)) {
            reads += 1;
        }
        if states.len() >= PAGES_MAX || reads > READS_MAX {
            // A bounded transaction (a run must end well within its lease, on any store):
            // what is left goes back to the bucket for its next run.
            outbox.extend(pushes);
            break;
        }
        load_ranks(txn, &due, &mut shards, &mut states).await?;
        // A page has a rank (a URL that is not one has none), unless resolved otherwise.
        let mut moving = Vec::new();
        for url in &due {
            let state = states.get_mut(url).expect("read");
            let now = &mut state.now;
            now.a += pushes.remove(url).unwrap_or(0.0);
            if resolve.contains(url) || (now.x > 0.0 && (TELEPORT + now.a - now.x).abs() > EPSILON)
            {
                moving.push(url);
            }
        }
        load_outs(txn, &moving, &mut states).await?;
        let resolved = out_sets(txn, &resolve).await?;
        for url in moving {
            let state = states.get_mut(url).expect("read");
            let before = state.out.take().unwrap_or_default();
            let (page, resolved) = match resolved.get(url) {
                Some((page, targets)) => (*page, Some(Out { targets: targets.clone() })),
                None => (state.now.x > 0.0, None),
            };
            let x = match page {
                false => 0.0,
                true => TELEPORT + state.now.a,
            };
            let out = resolved.as_ref().unwrap_or(&before);
            state.out_changed |= resolved.as_ref().is_some_and(|r| *r != before);
            for (target, change) in changes((state.now.x, &before), (x, out)) {
                if model::rank_bucket(&target) == bucket {
                    *pushes.entry(target).or_default() += change;
                } else {
                    *outbox.entry(target).or_default() += change;
                }
            }
            state.now.x = x;
            state.out = Some(resolved.unwrap_or(before));
        }
        resolve.clear();
    }
    let mut shown = Vec::new();
    for (url, mut state) in states {
        let before = &state.before;
        state.now.shown = shard::shown_after(state.now.x, before.shown);
        shards.set(&state.slot, state.now);
        if state.now.shown != before.shown {
            shown.push((url.clone(), before.shown, state.now.shown));
        }
        if state.out_changed {
            let raw = serde_json::to_vec(&state.out).expect("serializes");
            txn.set_unchecked(model::rank_row(&url), Bytes::from_static(col::RANK_OUT), raw);
        }
    }
    // Unchecked: every transaction that writes rank cells writes its bucket's mark, checked
    // (a run, or settle's hold of it), and conflicts there.
    shards.write(txn);
    show(txn, &shown, tell).await?;
    Ok(outbox)
}

/// Reads the state of the pages of `due` not read yet, from their shards.
async fn load_ranks(
    txn: &Transaction,
    due: &BTreeSet<String>,
    shards: &mut Shards,
    states: &mut BTreeMap<String, State>,
) -> Result<(), IndexError> {
    let new: Vec<(&String, Slot)> =
        due.iter().filter(|u| !states.contains_key(*u)).map(|u| (u, Slot::of(u))).collect();
    shards.load(txn, new.iter().map(|(_, slot)| slot)).await?;
    for (url, slot) in new {
        let now = shards.get(&slot);
        states.insert(url.clone(), State { slot, now, before: now, out: None, out_changed: false });
    }
    Ok(())
}

/// Writes the shown rank of each page of `shown` (URL, shown before, shown now) to its
/// `k:` row, queues its search document when the rank left its band, and, if it is to
/// `tell`, tells its cluster (the `rank:cluster` its row names, read here) that its rank
/// moved.
async fn show(
    txn: &mut Transaction,
    shown: &[(String, f64, f64)],
    tell: bool,
) -> Result<(), IndexError> {
    let keys: Vec<(Bytes, Bytes)> = match tell {
        true => shown
            .iter()
            .map(|(url, ..)| (model::rank_row(url), Bytes::from_static(col::RANK_CLUSTER)))
            .collect(),
        false => Vec::new(),
    };
    let mut clusters = txn.get_many(&keys).await?.into_iter();
    for (url, before, now) in shown {
        let cluster = clusters.next().flatten();
        txn.set_unchecked(
            model::rank_row(url),
            Bytes::from_static(col::RANK),
            model::rank_text(*now),
        );
        if search::band(*now) != search::band(*before) {
            search::queue(txn, url);
        }
        tell_cluster(txn, &cluster, true);
    }
    Ok(())
}

/// Tells the cluster a page's `rank:cluster` names that its rank `moved` (a cluster that
/// chooses by PageRank, see [`crate::cluster`]).
fn tell_cluster(txn: &mut Transaction, cluster: &Option<Bytes>, moved: bool) {
    if let Some(hash) =
        cluster.as_deref().filter(|_| moved).and_then(|h| std::str::from_utf8(h).ok())
    {
        model::signals::tell_cluster(txn, hash);
    }
}

/// Reads `rank:out` of the pages of `urls` not read yet.
async fn load_outs(
    txn: &Transaction,
    urls: &[&String],
    states: &mut BTreeMap<String, State>,
) -> Result<(), IndexError> {
    let new: Vec<&String> =
        urls.iter().copied().filter(|u| states.get(*u).is_some_and(|s| s.out.is_none())).collect();
    let keys: Vec<(Bytes, Bytes)> =
        new.iter().map(|u| (model::rank_row(u), Bytes::from_static(col::RANK_OUT))).collect();
    for (url, cell) in new.into_iter().zip(txn.get_many(&keys).await?) {
        states.get_mut(url).expect("read").out = Some(out_of(url, &cell)?);
    }
    Ok(())
}

/// For each URL of `urls`, whether it is a page and its out-set: the pages its links count
/// for ([`model::pages_counted_for`]), itself left out; none for a URL that is no page.
async fn out_sets(
    txn: &Transaction,
    urls: &BTreeSet<String>,
) -> Result<BTreeMap<String, (bool, Vec<String>)>, IndexError> {
    if urls.is_empty() {
        return Ok(BTreeMap::new());
    }
    let keys = model::cells_of(urls.iter().map(|u| model::page(u)), &[col::META, col::LINKS]);
    let cells = txn.get_many(&keys).await?;
    let mut pages: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (url, cells) in urls.iter().zip(cells.chunks(2)) {
        let meta: Option<Meta> =
            cells[0]
                .as_ref()
                .map(|m| serde_json::from_slice(m))
                .transpose()
                .map_err(|e| IndexError::corrupt(format!("page:meta of {url}"), e))?;
        if !meta.is_some_and(|m| m.kind == PageKind::Page) {
            continue;
        }
        let linked: Vec<(String, String)> = match &cells[1] {
            Some(raw) => serde_json::from_slice(raw)
                .map_err(|e| IndexError::corrupt(format!("page:links of {url}"), e))?,
            None => Vec::new(),
        };
        pages.insert(url, linked.into_iter().map(|(t, _)| t).collect());
    }
    let wanted: BTreeSet<&str> = pages.values().flatten().map(String::as_str).collect();
    let counted = model::pages_counted_for(txn, wanted).await?;
    Ok(urls
        .iter()
        .map(|url| {
            let set = pages.get(url.as_str()).map(|linked| {
                let set: BTreeSet<&String> = linked
                    .iter()
                    .filter_map(|t| counted.get(t.as_str()).and_then(Option::as_ref))
                    .filter(|t| *t != url)
                    .collect();
                set.into_iter().cloned().collect::<Vec<_>>()
            });
            (url.clone(), (set.is_some(), set.unwrap_or_default()))
        })
        .collect())
}

/// Writes a push row for each target of `outbox` with a change, and tells its bucket.
fn write_pushes(txn: &mut Transaction, outbox: BTreeMap<String, f64>) {
    let ts = txn.start_ts().0;
    let mut told = BTreeSet::new();
    for (target, change) in outbox {
        if change != 0.0 {
            told.insert(model::rank_bucket(&target));
            txn.set_unchecked(
                model::push(&target, ts),
                Bytes::from_static(col::PUSH),
                Bytes::from(change.to_string()),
            );
        }
    }
    for b in told {
        txn.notify(model::rank_head(b), Bytes::from_static(col::RANK_DIRTY));
    }
}

/// What a run took from its bucket's rows: the pushes summed by target, and the targets to
/// resolve again.
struct Taken {
    pushes: BTreeMap<String, f64>,
    resolve: BTreeSet<String>,
    /// URLs that became or stopped being pages: their sources are resolved again too.
    sources_of: BTreeSet<String>,
    mark: u64,
    folded: bool,
    more: bool,
}

/// Takes the pushes and the words to resolve (one URL's, or a list's) committed at or after
/// `mark` (older ones a crash left after the run that took them), as indegree takes its
/// change rows: a run that read them all moves the mark to its start and deletes them at its
/// commit without a lock; one that may have left some keeps the mark and deletes what it
/// took in its transaction.
fn take_pushes(
    txn: &mut Transaction,
    found: Vec<Vec<Found>>,
    mark: u64,
) -> Result<Taken, IndexError> {
    let more = found.iter().any(|rows| rows.len() >= FOLD_MAX);
    let folded = found.iter().any(|rows| !rows.is_empty());
    let mut taken = Taken {
        pushes: BTreeMap::new(),
        resolve: BTreeSet::new(),
        sources_of: BTreeSet::new(),
        mark: if more { mark } else { txn.start_ts().0 },
        folded,
        more,
    };
    for (rows, column) in found.into_iter().zip(TAKEN) {
        for found in rows {
            let taken_before = found.commit_ts.0 < mark;
            if !taken_before {
                take_one(&mut taken, &found, column)?;
            }
            if taken_before || !more {
                txn.delete_at_commit(found.row, column);
            } else {
                txn.delete_unchecked(found.row, Bytes::from_static(column));
            }
        }
    }
    Ok(taken)
}

/// What one row of `column` says, into `taken`.
fn take_one(taken: &mut Taken, found: &Found, column: &[u8]) -> Result<(), IndexError> {
    if column == col::RESOLVES {
        let list = std::str::from_utf8(&found.value)
            .map_err(|_| IndexError::corrupt("a rank:resolves list", found.value.escape_ascii()))?;
        taken.resolve.extend(list.split(' ').filter(|u| !u.is_empty()).map(str::to_string));
        return Ok(());
    }
    let target = model::push_target(&found.row)
        .ok_or_else(|| IndexError::corrupt("a push row's key", found.row.escape_ascii()))?;
    if column == col::RESOLVE {
        taken.resolve.insert(target.to_string());
        if found.value.as_ref() == b"s" {
            taken.sources_of.insert(target.to_string());
        }
    } else {
        let change = number(&found.value, "rank:push", target)?;
        *taken.pushes.entry(target.to_string()).or_default() += change;
    }
    Ok(())
}

/// [`hold_mark`] of every bucket: for a transaction that writes shards of any.
pub(crate) async fn hold_every_mark(txn: &mut Transaction) -> Result<(), perc_txn::TxnError> {
    for b in 0..model::RANK_BUCKETS {
        hold_mark(txn, b).await?;
    }
    Ok(())
}

/// Rewrites the mark of `bucket` as it is, in `txn`: every transaction that writes rank
/// cells or takes the bucket's rows writes the mark, checked, so a run beside this one
/// conflicts with it.
pub async fn hold_mark(txn: &mut Transaction, bucket: u8) -> Result<(), perc_txn::TxnError> {
    let head = model::rank_head(bucket);
    let mark = txn.get(&head, col::RANK_FOLDED).await?;
    txn.set(
        head,
        Bytes::from_static(col::RANK_FOLDED),
        mark.unwrap_or_else(|| Bytes::from_static(b"0")),
    );
    Ok(())
}

/// The change of what each target gets between a source of rank and out-set `before` and
/// the same source `now`, for each target whose weight differs.
fn changes(before: (f64, &Out), now: (f64, &Out)) -> Vec<(String, f64)> {
    let (w_before, w_now) = (weight(before.0, before.1), weight(now.0, now.1));
    if before.1 == now.1 {
        // The same targets (a move of x alone, the common case): one change for all.
        let change = w_now - w_before;
        return match change != 0.0 {
            true => now.1.targets.iter().map(|t| (t.clone(), change)).collect(),
            false => Vec::new(),
        };
    }
    let old: BTreeSet<&String> = before.1.targets.iter().collect();
    let new: BTreeSet<&String> = now.1.targets.iter().collect();
    old.union(&new)
        .filter_map(|t| {
            let change = if new.contains(t) { w_now } else { 0.0 }
                - if old.contains(t) { w_before } else { 0.0 };
            (change != 0.0).then(|| ((*t).clone(), change))
        })
        .collect()
}

pub struct Rank;

#[async_trait]
impl Observer for Rank {
    async fn observe(
        &self,
        txn: &mut Transaction,
        row: &Bytes,
        _column: &Bytes,
    ) -> Result<(), ObserverError> {
        run(txn, row).await
    }
}
