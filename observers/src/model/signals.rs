//! Signals: the writes by which one stage tells another that its input changed, or holds a
//! cell another stage writes so that the two conflict instead of skewing. Each is a write
//! into the model, not a call of the other stage; the stage it concerns reads it in its own
//! run.

use std::collections::BTreeMap;

use bytes::Bytes;
use perc_txn::Transaction;

use super::{cluster_head, col, page, push, rank_bucket, rank_head, resolves};

/// The columns of a URL's row that say whether indegree may count its inlinks: a URL on
/// which neither was ever written (never parsed, never an alias) is not counted, and the
/// parse run that makes it a page or a redirect notifies its run (`page:meta` is written
/// first by parse, `indeg:alias_of` only by a run that counted).
const COUNTED_PROBES: &[&[u8]] = &[col::META, col::ALIAS_OF];

/// Tells `target`'s run that its inlinks changed (invert's edges and change rows): unless
/// the URL was never parsed, when the run would not count them and the parse that makes it
/// a page or a redirect tells the run itself. Decided when the transaction commits, after
/// its commit timestamp is drawn (`Transaction::notify_if_written`), so a parse that races
/// it either is seen there or starts a run that sees its change rows. On the std docs this
/// spares ~5 runs a page that would find nothing to do.
pub fn inlinks_changed(txn: &mut Transaction, target: &str) {
    txn.notify_if_written(page(target), Bytes::from_static(col::INDEG_DIRTY), COUNTED_PROBES);
}

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

/// Tells the cluster of `hash` that its membership or a member's vote changed: its run
/// chooses again (weakly: many members, one head).
pub fn tell_cluster(txn: &mut Transaction, hash: &str) {
    txn.notify(cluster_head(hash), Bytes::from_static(col::CLUSTER_DIRTY));
}

/// Tells the rank of each of `urls` that what its links resolve to may have changed (a
/// page's links or what it is, an alias's chain): its run resolves its out-set again.
pub fn rank_targets_changed<'a>(txn: &mut Transaction, urls: impl IntoIterator<Item = &'a str>) {
    tell_rank(txn, urls, b"1");
}

/// Tells the rank that `url` became or stopped being a page: the run resolves again the
/// out-sets of its sources (those linking to it, and those reaching it through an alias),
/// enumerated in the run, after this commit (an enumeration here could miss a source that
/// links to it in a transaction running beside this one, whose own resolution saw it as
/// it was).
pub fn rank_sources_changed(txn: &mut Transaction, url: &str) {
    tell_rank(txn, [url], b"s");
}

fn tell_rank<'a>(
    txn: &mut Transaction,
    urls: impl IntoIterator<Item = &'a str>,
    word: &'static [u8],
) {
    let ts = txn.start_ts().0;
    let mut buckets: BTreeMap<u8, Vec<&str>> = BTreeMap::new();
    for url in urls {
        buckets.entry(rank_bucket(url)).or_default().push(url);
    }
    for (b, urls) in buckets {
        // A word a URL, or, for more, one row listing them: indegree names every source of
        // the edges its run folded, ~20 a page in a bulk load, each a row to write, take
        // and collect.
        match urls.as_slice() {
            [url] => txn.set_unchecked(
                push(url, ts),
                Bytes::from_static(col::RESOLVE),
                Bytes::from_static(word),
            ),
            _ => {
                debug_assert_eq!(word, b"1", "a list of URLs is resolved, not its sources");
                let (row, list) = resolves(b, &urls, ts);
                txn.set_unchecked(row, Bytes::from_static(col::RESOLVES), list);
            }
        }
        txn.notify(rank_head(b), Bytes::from_static(col::RANK_DIRTY));
    }
}
