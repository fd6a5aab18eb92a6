//! indegree: a page's in-degree and its alias set, kept incrementally.
//!
//! A page's in-degree is the number of distinct other pages linking to it or to one of its
//! aliases (URLs whose redirect chain ends at it). Nothing here costs the page's in-degree or
//! its number of aliases: every run folds the changes left for it since the last run.
//!
//! - Trigger: `indeg:dirty` of `p:<url>` (weak: set by invert on every change of the page's
//!   inlinks unless the URL was never parsed ([`model::signals::inlinks_changed`]), by
//!   parse when the page starts or stops redirecting or being a page, by alias when its
//!   registration moves, and by the runs below; a popular page is a hot row).
//! - **A URL not fetched, or fetched but neither a page nor a redirect** (most link targets
//!   of a crawl), whose inlinks were not counted at an alias's end: no counting. Its
//!   in-degree shows nowhere, and its change rows wait for the run parse asks for when it
//!   becomes a page or a redirect; the run writes nothing (so it commits nothing) unless its
//!   redirect cell was rewritten (below).
//! - **A page** (no redirect) reads its change rows `d:<url>\0<source>\0<ts>` (invert's ±1
//!   per edge, or a 0 left by an alias as a mark to look at that source again; one row per
//!   writing transaction, so each is written unchecked; see "Taking the change rows"
//!   below), and, if it has
//!   aliases or sources counted through them, for each source its `x:` row and whether the
//!   edge `e:<url>\0<source>` exists. It keeps
//!   `indeg:base` (edges into the URL itself) and `indeg:extra` (sources that reach it only
//!   through aliases: `indeg:adds` set on their `x:` row); in-degree = base + extra. Its alias
//!   set is the `a:<url>\0<alias>` rows.
//! - **An alias** (redirecting) counts its own inlinks at the end of its redirect chain: it
//!   adds its changes into `x:<end>\0<source>`'s `indeg:via` (how many of end's aliases that
//!   source links to) and marks the source with a change row of 0 for `end`; it keeps
//!   `a:<end>\0<url>` and remembers the end in `indeg:alias_of` ("" for a cycle). When its end changes, it
//!   moves what it counted (O(its own inlinks), once per change of a redirect).
//! - Whenever a redirect on a URL's chain was rewritten since its last run (its own, or a
//!   hop's; `indeg:chain` holds their commit timestamps), it tells the URLs redirecting
//!   straight to it (`r:` rows): their chains read the same cells, and may have seen a state
//!   that is gone (a redirect set and unset between two of this URL's runs). Alias tells the
//!   source itself after writing its `r:` row, so a run that missed the row is followed by
//!   one that sees it.
//! - Ranges: a run reads the URL's change rows (if it is counted), its `a:` rows (a page) and
//!   its `r:` rows (when its chain's stamp changed) in one call ([`Ranges`]).
//! - Writes: `indeg:indeg` and `indeg:names` (the page and its aliases, sorted), each only if it
//!   changed. No list of inlinks: readers join them from the `e:` rows (see [`crate::model`]).
//! - Notifies: the page's cluster head (`cluster:dirty`, weakly, the cluster dedup registered
//!   it in; see [`notify_downstream`] for why it rewrites that registration, and why a
//!   cluster of one is not told, its names forwarded instead) on a change.
//! - Returns what follows in this transaction ([`Follow`]; [`crate::runs`] composes it):
//!   the page's export line made again ([`crate::export`]) when its in-degree changed, and
//!   for a cluster of one the forwarding of its names ([`crate::forward`]) when they changed.
//! - Queues: the URL for the search index ([`crate::search`]) when it folded changes (an
//!   edge came or went: its inlinks' anchors changed even when its count did not).
//! - **Taking the change rows.** The URL keeps a mark, `indeg:folded`: every change row
//!   committed before it was folded. A run that reads all of its rows folds those committed
//!   at or after the mark, moves the mark to its own start timestamp (its snapshot holds
//!   every row committed before it), and deletes the rows it read at its commit without
//!   locking them ([`Transaction::delete_at_commit`]: the delete records go in after the
//!   commit point, with the secondaries), since from the commit on the mark says they are
//!   taken, and only this URL's runs read them. A row committed before the mark is one whose
//!   delete a crash lost: it is skipped and deleted again. Every run that folds writes the
//!   mark, so two runs folding the same rows conflict there. A change row so costs its
//!   write (a prewrite and a commit), a delete record and the collection's removal: a
//!   locked delete would add a prewrite, the largest of these writes.
//! - Twice is harmless: the mark says which change rows were folded; the outputs are
//!   written only when different.
//! - **Bounded:** a page's run folds at most `fold_max` change rows (`index.indegree_fold_max`)
//!   and, if it may have left some, keeps the mark, deletes the rows it folded in its
//!   transaction, and notifies itself, so that a popular page's first run after a
//!   bulk load (tens of thousands of sources, each with its `x:` row and edge to read) is
//!   several runs of bounded memory and size. A page's counts fold per row (the base adds up,
//!   a source's `indeg:adds` is decided afresh from the cells each time), so any cut is
//!   correct; an alias's run and a run that ends a spell as an alias take them all.

use crate::IndexError;
use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use perc_notify::ObserverError;
use perc_txn::{Found, RangeScan, Transaction};

use crate::model::{self, col, rows, Forward, Meta};

/// How many redirect hops an alias may be from its page (more than any redirect limit).
pub const ALIAS_HOPS_MAX: usize = 16;

/// What follows a run of indegree in its transaction.
#[derive(Default)]
pub struct Follow {
    /// The page's in-degree changed: its export line shows it.
    pub export: bool,
    /// The names of the page of a cluster of one changed: forwarded to itself.
    pub forward: Option<Forward>,
}

/// The stage, as a run of indegree on the URL's row `row`, folding at most `fold_max` change
/// rows if it is a page (`index.indegree_fold_max`).
pub async fn run(
    txn: &mut Transaction,
    row: &Bytes,
    fold_max: usize,
) -> Result<Follow, ObserverError> {
    let Some(url) = model::url_of(row) else { return Ok(Follow::default()) };
    // The row's cells every run reads (`page:meta` unless the URL is an alias, `indeg:folded`
    // if it is counted), in one store call: the reads below find them read.
    let cells = [col::ALIAS_OF, col::META, col::CHAIN, col::FOLDED]
        .map(|column| (row.clone(), Bytes::from_static(column)));
    txn.get_many(&cells).await?;
    // Where this URL's inlinks were counted last time: absent for a page.
    let counted_at = txn.get(row, col::ALIAS_OF).await?;
    // Not fetched, or not a page: its in-degree shows nowhere, so its change rows wait
    // (parse tells this run again when the URL becomes a page or a redirect). Most link
    // targets of a crawl are such URLs, and their runs then commit nothing.
    let counting = counted_at.is_some() || counted(txn, row).await?;
    let chain = chain_from(txn, url).await?;
    // A page folds its changes per row, so it may take some now and the rest later; an
    // alias's run and the end of a spell as one take them all (see the header).
    let limit = if counted_at.is_none() && chain.hops == 0 { fold_max } else { usize::MAX };
    // The URLs redirecting straight here read every redirect this one's chain reads: if
    // any of them was rewritten since the last run (even if back to what it was, or
    // leaving the end as it was), their ends may have changed too. This holds for a URL
    // not counted too: a redirect that came and went before its first run here leaves
    // aliases that counted through it. A URL never fetched has no redirect cell to have
    // been rewritten ("0"), and no stamp written.
    let stamp = Bytes::from(chain.stamp.clone());
    let before = txn.get(row, col::CHAIN).await?.unwrap_or_else(|| Bytes::from_static(b"0"));
    let restamp = before != stamp;
    let page = counting && chain.hops == 0;
    let ranges = Ranges::read(txn, url, counting.then_some(limit), page, restamp).await?;
    let taken = if counting {
        let mark = u64::try_from(model::count_of(txn.get(row, col::FOLDED).await?)?)
            .map_err(|e| IndexError::corrupt("indeg:folded", e))?;
        let taken = take_changes(txn, ranges.changes, limit, mark)?;
        if taken.more {
            txn.notify(row.clone(), Bytes::from_static(col::INDEG_DIRTY));
        }
        taken
    } else {
        Taken::default()
    };
    let (changes, mark) = (taken.changes, taken.mark);
    let folded = !changes.is_empty();
    if folded {
        // The edges into it changed, whatever its count did: so did the anchors its
        // (or its chain's end's) search document shows.
        crate::search::queue(txn, url);
    }
    let follow = if page {
        as_page(txn, row, url, counted_at, changes, ranges.aliases).await?
    } else if counting {
        let forward = as_alias(txn, row, url, chain.end.clone(), counted_at, changes).await?;
        Follow { export: false, forward }
    } else {
        Follow::default()
    };
    if restamp {
        let told = notify_direct_aliases(txn, &ranges.redirecting);
        // A URL not counted and with no alias to tell keeps no stamp, so that its run
        // still commits nothing (a 404 that links point at); should an alias register
        // later, the stamp differs and it is told.
        if counting || told > 0 {
            txn.set(row.clone(), Bytes::from_static(col::CHAIN), stamp);
        }
    }
    if folded {
        // Written even when unchanged (by a run that leaves rows for later): two runs that
        // fold the same change rows must conflict, or both would count them.
        txn.set(row.clone(), Bytes::from_static(col::FOLDED), mark.to_string());
    }
    Ok(follow)
}

/// Whether a URL's inlinks are counted now: a page's, or an alias's (at its chain's end).
async fn counted(txn: &Transaction, row: &Bytes) -> Result<bool, ObserverError> {
    let meta = model::get_json::<Meta>(txn, row, col::META).await?;
    Ok(meta.is_some_and(|m| m.kind.counts_inlinks()))
}

/// The rows of a URL's ranges that its run reads, read in one call: its change rows, its
/// alias rows and the URLs redirecting straight to it, each only if the run needs them.
struct Ranges {
    /// The first change rows `d:<url>\0<source>\0<ts>`, if the URL is counted.
    changes: Vec<Found>,
    /// Its aliases (`a:<url>\0<alias>`), if it is a page.
    aliases: Vec<String>,
    /// The URLs redirecting straight to it (`r:<url>\0<source>`), if its stamp changed.
    redirecting: Vec<String>,
}

impl Ranges {
    async fn read(
        txn: &Transaction,
        url: &str,
        changes: Option<usize>,
        aliases: bool,
        redirecting: bool,
    ) -> Result<Ranges, ObserverError> {
        let (d, a, r) = (
            model::children(&rows::DELTAS, url),
            model::children(&rows::ALIASES, url),
            model::children(&rows::REDIRECTS, url),
        );
        let mut scans = Vec::new();
        if let Some(limit) = changes {
            scans.push(RangeScan::new(&d.0, &d.1, col::DELTA).first(limit));
        }
        if aliases {
            scans.push(RangeScan::new(&a.0, &a.1, col::ALIAS));
        }
        if redirecting {
            scans.push(RangeScan::new(&r.0, &r.1, col::ALIAS_FROM));
        }
        // No scan asked for, no call made.
        let mut found = txn.scan_each_found(&scans).await?.into_iter();
        let mut next =
            |wanted: bool| if wanted { found.next().unwrap_or_default() } else { Vec::new() };
        let keys = |found: Vec<Found>| model::child_keys_of(found.iter().map(|f| &f.row));
        Ok(Ranges {
            changes: next(changes.is_some()),
            aliases: keys(next(aliases)),
            redirecting: keys(next(redirecting)),
        })
    }
}

/// What a run took from a URL's change rows ([`take_changes`]).
#[derive(Default)]
struct Taken {
    /// Source → net change of its edges into the URL.
    changes: BTreeMap<String, i64>,
    /// The URL's `indeg:folded` after the run: every change row committed before it was
    /// taken.
    mark: u64,
    /// Some rows may be left for a later run.
    more: bool,
}

/// Takes the changes of a URL's first `limit` change rows (`rows`), those committed at or
/// after `mark` (its `indeg:folded`); the older ones were taken by the run that wrote the
/// mark, and only a crash after its commit left them. A run that read every row its snapshot
/// holds moves the mark to its own start: every row it took is then dead by the mark, and is
/// deleted at the commit without a lock. One that may have left some (`limit` reached) keeps
/// the mark, and deletes the rows it took in its transaction (unchecked: every run that
/// folds writes `indeg:folded`, so two runs folding the same rows conflict there).
fn take_changes(
    txn: &mut Transaction,
    rows: Vec<Found>,
    limit: usize,
    mark: u64,
) -> Result<Taken, ObserverError> {
    let more = rows.len() >= limit;
    let mut changes = BTreeMap::new();
    for found in rows {
        let taken_before = found.commit_ts.0 < mark;
        if !taken_before {
            if let Some(source) = model::delta_source(&found.row) {
                *changes.entry(source.to_string()).or_default() +=
                    model::count_of(Some(found.value))?;
            }
        }
        if taken_before || !more {
            txn.delete_at_commit(found.row, col::DELTA);
        } else {
            txn.delete_unchecked(found.row, Bytes::from_static(col::DELTA));
        }
    }
    let mark = if more { mark } else { txn.start_ts().0 };
    Ok(Taken { changes, mark, more })
}

/// A page: fold the changes into its counts; after a spell as an alias, count afresh.
async fn as_page(
    txn: &mut Transaction,
    row: &Bytes,
    url: &str,
    counted_at: Option<Bytes>,
    changes: BTreeMap<String, i64>,
    aliases: Vec<String>,
) -> Result<Follow, ObserverError> {
    // The sources whose edges here changed resolve them to this page: told by the run that
    // counts them, which sees this URL a page (a source's own run may not have).
    model::signals::rank_targets_changed(txn, changes.keys().map(String::as_str));
    let (base, extra) = match counted_at {
        Some(old) => {
            // It was an alias: take back what it counted there, and count everything here.
            let sources = own_sources(txn, url).await?;
            model::signals::rank_targets_changed(txn, sources.iter().map(String::as_str));
            let mut via = BTreeMap::new();
            if !old.is_empty() {
                uncount(txn, url, &String::from_utf8_lossy(&old), &sources, &changes, &mut via);
            }
            add_via(txn, via).await?;
            txn.delete(row.clone(), Bytes::from_static(col::ALIAS_OF));
            (sources.len() as i64, recount_extra(txn, url, &sources).await?)
        }
        None => {
            let base =
                model::count_of(txn.get(row, col::BASE).await?)? + changes.values().sum::<i64>();
            let extra = model::count_of(txn.get(row, col::EXTRA).await?)?;
            // A page with no alias in this snapshot has no source counting through one (an
            // alias's run writes its `a:` row and its sources' `indeg:via` in one
            // transaction), and with `indeg:extra` at 0 no flag of an earlier one is left to
            // clear: most pages, whose run then reads no source's `x:` row or edge.
            let extra = if aliases.is_empty() && extra == 0 {
                0
            } else {
                extra + refold_sources(txn, url, changes.keys()).await?
            };
            (base, extra)
        }
    };
    if base < 0 || extra < 0 {
        return Err(IndexError::Inconsistent(format!(
            "{url}: inlink counts below zero (base {base}, extra {extra})"
        ))
        .into());
    }
    model::set_if_changed(txn, row, col::BASE, Bytes::from(base.to_string())).await?;
    model::set_if_changed(txn, row, col::EXTRA, Bytes::from(extra.to_string())).await?;
    let mut names = BTreeSet::from([url.to_string()]);
    names.extend(aliases);
    let names: Vec<String> = names.into_iter().collect();
    let a = model::set_if_changed(txn, row, col::INDEG, Bytes::from((base + extra).to_string()))
        .await?;
    let b = model::set_json_if_changed(txn, row, col::NAMES, &names).await?;
    let forward = if a || b { notify_downstream(txn, row, b).await? } else { None };
    // Its line shows the in-degree (not the names).
    Ok(Follow { export: a, forward })
}

/// An alias: pass its changes on to the end of its chain; move them if the end changed.
async fn as_alias(
    txn: &mut Transaction,
    row: &Bytes,
    url: &str,
    end: Option<String>,
    counted_at: Option<Bytes>,
    changes: BTreeMap<String, i64>,
) -> Result<Option<Forward>, ObserverError> {
    let old = counted_at.as_ref().map(|v| String::from_utf8_lossy(v).into_owned());
    let mut via: BTreeMap<(String, String), i64> = BTreeMap::new();
    let mut forward = None;
    if old.is_none() {
        // It was a page: its counts go (its edges are counted at the end below).
        let mut changed = false;
        for column in [col::INDEG, col::NAMES] {
            changed |= model::delete_if_present(txn, row, column).await?;
        }
        for column in [col::BASE, col::EXTRA] {
            model::delete_if_present(txn, row, column).await?;
        }
        if changed {
            // Its line went in the parse run that made it a redirect.
            forward = notify_downstream(txn, row, true).await?;
        }
    }
    let end_name = end.clone().unwrap_or_default();
    if old.as_deref() == Some(end_name.as_str()) {
        // A source that came (or went) since the last run resolves its link here to the end
        // as it is now: told after the end's page status it may have missed.
        model::signals::rank_targets_changed(txn, changes.keys().map(String::as_str));
        if let Some(end) = &end {
            for (source, d) in changes {
                *via.entry((end.clone(), source)).or_default() += d;
            }
        }
    } else {
        let sources = own_sources(txn, url).await?;
        // Its sources' links to it now resolve to another page (or none).
        model::signals::rank_targets_changed(txn, sources.iter().map(String::as_str));
        if let Some(old) = old.as_deref().filter(|o| !o.is_empty()) {
            uncount(txn, url, old, &sources, &changes, &mut via);
        }
        if let Some(end) = &end {
            for source in &sources {
                *via.entry((end.clone(), source.clone())).or_default() += 1;
            }
            txn.set(model::alias_at(end, url), Bytes::from_static(col::ALIAS), Bytes::new());
            txn.notify(model::page(end), Bytes::from_static(col::INDEG_DIRTY));
        }
        txn.set(row.clone(), Bytes::from_static(col::ALIAS_OF), end_name);
    }
    add_via(txn, via).await?;
    Ok(forward)
}

/// Takes back from `old` what `url` counted there: the sources it had at its last run
/// (those it has now, less the changes not yet passed on), and its membership.
fn uncount(
    txn: &mut Transaction,
    url: &str,
    old: &str,
    sources: &BTreeSet<String>,
    changes: &BTreeMap<String, i64>,
    via: &mut BTreeMap<(String, String), i64>,
) {
    let touched: BTreeSet<&String> = sources.iter().chain(changes.keys()).collect();
    for source in touched {
        let counted = i64::from(sources.contains(source)) - changes.get(source).unwrap_or(&0);
        if counted == 1 {
            *via.entry((old.to_string(), source.clone())).or_default() -= 1;
        }
    }
    txn.delete(model::alias_at(old, url), Bytes::from_static(col::ALIAS));
    txn.notify(model::page(old), Bytes::from_static(col::INDEG_DIRTY));
}

/// Adds to `x:<end>\0<source>`'s `indeg:via`, and marks the source for the end's next run.
async fn add_via(
    txn: &mut Transaction,
    via: BTreeMap<(String, String), i64>,
) -> Result<(), ObserverError> {
    let via: Vec<((String, String), i64)> = via.into_iter().filter(|(_, d)| *d != 0).collect();
    if via.is_empty() {
        return Ok(());
    }
    let keys: Vec<(Bytes, Bytes)> = via
        .iter()
        .map(|((end, source), _)| (model::via(end, source), Bytes::from_static(col::VIA)))
        .collect();
    let now = txn.get_many(&keys).await?;
    let ts = txn.start_ts().0;
    let mut ends = BTreeSet::new();
    for (((end, source), d), cell) in via.iter().zip(now) {
        let count = model::count_of(cell)? + d;
        let at = model::via(end, source);
        match count {
            n if n < 0 => {
                return Err(IndexError::Inconsistent(format!(
                    "{end}: count of aliases linked from {source} below zero"
                ))
                .into())
            }
            0 => txn.delete(at, Bytes::from_static(col::VIA)),
            n => txn.set(at, Bytes::from_static(col::VIA), n.to_string()),
        }
        // A change row of our own (unique, so unchecked) marking the source: the end's next
        // run folds it, and so looks at this source again; a run of the end that began
        // before we commit does not see it, and leaves it.
        txn.set_unchecked(model::delta(end, source, ts), Bytes::from_static(col::DELTA), "0");
        ends.insert(end);
    }
    for end in ends {
        txn.notify(model::page(end), Bytes::from_static(col::INDEG_DIRTY));
    }
    Ok(())
}

/// Re-decides, for each changed source, whether it adds to the page's in-degree through an
/// alias only; returns the change of the page's `indeg:extra`.
async fn refold_sources(
    txn: &mut Transaction,
    url: &str,
    sources: impl Iterator<Item = &String>,
) -> Result<i64, ObserverError> {
    let sources: Vec<&String> = sources.filter(|s| s.as_str() != url).collect();
    let mut keys = Vec::with_capacity(sources.len() * 3);
    for source in &sources {
        let x = model::via(url, source);
        keys.push((x.clone(), Bytes::from_static(col::VIA)));
        keys.push((x, Bytes::from_static(col::ADDS)));
        keys.push((model::edge(url, source), Bytes::from_static(col::EDGE)));
    }
    let cells = txn.get_many(&keys).await?;
    let mut change = 0;
    for (source, c) in sources.iter().zip(cells.chunks(3)) {
        let adds = model::count_of(c[0].clone())? > 0 && c[2].is_none();
        change += set_adds(txn, url, source, c[1].is_some(), adds);
    }
    Ok(change)
}

/// Decides afresh, for every source of the page's aliases, whether it adds to the in-degree;
/// returns the number that do.
async fn recount_extra(
    txn: &mut Transaction,
    url: &str,
    sources: &BTreeSet<String>,
) -> Result<i64, ObserverError> {
    let (start, end) = model::children(&rows::VIAS, url);
    let via: BTreeMap<String, i64> = txn
        .scan(&start, &end, col::VIA)
        .await?
        .into_iter()
        .filter_map(|(r, v)| Some((model::child_key(&r)?.to_string(), v)))
        .map(|(s, v)| Ok((s, model::count_of(Some(v))?)))
        .collect::<Result<_, ObserverError>>()?;
    let flagged: BTreeSet<String> = txn
        .scan(&start, &end, col::ADDS)
        .await?
        .into_iter()
        .filter_map(|(r, _)| Some(model::child_key(&r)?.to_string()))
        .collect();
    let mut extra = 0;
    for source in via.keys().chain(flagged.iter()).collect::<BTreeSet<_>>() {
        let adds =
            source != url && via.get(source).is_some_and(|n| *n > 0) && !sources.contains(source);
        set_adds(txn, url, source, flagged.contains(source), adds);
        extra += i64::from(adds);
    }
    Ok(extra)
}

/// Sets or clears `indeg:adds` of `x:<url>\0<source>`; returns the change in the count.
fn set_adds(txn: &mut Transaction, url: &str, source: &str, was: bool, now: bool) -> i64 {
    match (was, now) {
        (false, true) => {
            txn.set(model::via(url, source), Bytes::from_static(col::ADDS), "1");
            1
        }
        (true, false) => {
            txn.delete(model::via(url, source), Bytes::from_static(col::ADDS));
            -1
        }
        _ => 0,
    }
}

/// The other pages with an edge into `url` itself.
async fn own_sources(txn: &Transaction, url: &str) -> Result<BTreeSet<String>, ObserverError> {
    let mut sources: BTreeSet<String> =
        model::child_keys(txn, &rows::EDGES, url, col::EDGE).await?.into_iter().collect();
    sources.remove(url);
    Ok(sources)
}

/// Tells the URLs redirecting straight to a URL (`sources`) that their chain's end may have
/// changed. Returns how many it told.
fn notify_direct_aliases(txn: &mut Transaction, sources: &[String]) -> usize {
    for source in sources {
        txn.notify(model::page(source), Bytes::from_static(col::INDEG_DIRTY));
    }
    sources.len()
}

/// Tells the page's cluster that its in-degree or its names changed.
///
/// The cluster is the one dedup has registered the page in (`dedup:registered`), and that
/// cell is written back unchanged: a write skew otherwise. A concurrent dedup could move the
/// page to another cluster after this snapshot, that cluster's run could read our names
/// before we commit, and we would tell the old cluster. Writing the cell makes the two
/// transactions conflict, so one of them retries and sees the other.
///
/// A cluster of one is not told: its choice cannot change, and the one thing its run would
/// do, forwarding the member's names to itself ([`crate::forward`]), follows in this
/// transaction instead: returned, when the names changed. The
/// page's `cluster:alone` says so when it names the registered cluster, and is written back
/// unchanged too, so that a cluster run that finds a second member conflicts with this one
/// (see `cluster::mark_alone`).
async fn notify_downstream(
    txn: &mut Transaction,
    row: &Bytes,
    names_changed: bool,
) -> Result<Option<Forward>, ObserverError> {
    let cells = [
        (row.clone(), Bytes::from_static(col::HASH_REGISTERED)),
        (row.clone(), Bytes::from_static(col::ALONE)),
        (row.clone(), Bytes::from_static(col::NAMES)),
        (row.clone(), Bytes::from_static(col::FWD_NAMES)),
    ];
    let [registered, alone, names, forwarded]: [Option<Bytes>; 4] =
        txn.get_many(&cells).await?.try_into().expect("four cells asked");
    let registered = registered.unwrap_or_default();
    model::signals::hold_membership(txn, row, registered.clone());
    if registered.is_empty() {
        return Ok(None);
    }
    let hash = String::from_utf8_lossy(&registered).into_owned();
    if alone.as_ref() != Some(&registered) {
        model::signals::tell_cluster(txn, &hash);
        return Ok(None);
    }
    txn.set(row.clone(), Bytes::from_static(col::ALONE), registered);
    let url = model::url_of(row).filter(|_| names_changed);
    Ok(url.map(|url| Forward {
        hash,
        members: vec![url.to_string()],
        names: vec![names],
        forwarded: vec![forwarded],
        canonical: url.to_string(),
    }))
}

/// A URL's redirect chain, as one snapshot shows it.
struct Chain {
    /// Redirects followed: 0 for a page.
    hops: usize,
    /// The first URL that does not redirect: the URL itself for a page; `None` for a cycle
    /// or a chain longer than [`ALIAS_HOPS_MAX`].
    end: Option<String>,
    /// The commit timestamps of every redirect cell read on the way: changes whenever one of
    /// them is rewritten.
    stamp: String,
}

async fn chain_from(txn: &Transaction, url: &str) -> Result<Chain, ObserverError> {
    let mut current = url.to_string();
    let mut seen = BTreeSet::new();
    let mut stamps = Vec::new();
    for hops in 0..=ALIAS_HOPS_MAX + 1 {
        if !seen.insert(current.clone()) {
            break;
        }
        let cell = (model::page(&current), Bytes::from_static(col::REDIRECT));
        let version = txn.versions(&[cell]).await?.pop().flatten();
        stamps.push(version.as_ref().map_or(0, |v| v.commit_ts.0).to_string());
        let next = version.and_then(|v| v.value).unwrap_or_default();
        if next.is_empty() {
            return Ok(Chain { hops, end: Some(current), stamp: stamps.join(",") });
        }
        current = String::from_utf8_lossy(&next).into_owned();
    }
    Ok(Chain { hops: seen.len(), end: None, stamp: stamps.join(",") })
}
