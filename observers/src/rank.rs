//! rank: a page's in-degree and its own inlinks.
//!
//! - Trigger: `rank:dirty` of `p:<url>` (weak: set by invert and alias on every change of the
//!   page's inlinks or aliases, and by parse when the page starts or stops redirecting; a
//!   popular page is a hot row).
//! - Reads: `page:redirect`; the alias set (`r:` rows, followed hop by hop); the page's count
//!   of inlinks (`rank:base`) and the changes invert left since (`d:<url>\0…`); the inlink
//!   rows of its aliases only (`e:<alias>\0…`, with one point read per source into the page
//!   itself, so that a source linking to several names counts once). The cost follows the
//!   changes and the aliases' in-degrees, never the page's own in-degree.
//! - Writes: `rank:base` (the count with the changes folded in, which it deletes),
//!   `rank:indeg` (distinct other source pages linking to the page or an alias) and
//!   `rank:names` (the page and its aliases, sorted), each only if it changed. No list of
//!   inlinks: readers join them from the `e:` rows (see [`crate::model`]). An alias
//!   instead passes the notification on to the end of its redirect chain (not hop by hop,
//!   which would circle forever around a redirect cycle), and holds no rank itself.
//! - Notifies: the page's cluster head (`cluster:dirty`, the cluster dedup registered it in;
//!   see [`notify_downstream`] for why it rewrites that registration) and its export, weakly,
//!   on a change.
//! - Twice is harmless: the values are recomputed from the current rows; unchanged, nothing
//!   is written or notified.

use std::collections::BTreeSet;

use async_trait::async_trait;
use bytes::Bytes;
use perc_notify::{Observer, ObserverError};
use perc_txn::Transaction;

use crate::model::{self, col};

/// How many redirect hops an alias may be from its page (more than any redirect limit).
pub const ALIAS_HOPS_MAX: usize = 16;

pub struct Rank;

#[async_trait]
impl Observer for Rank {
    async fn observe(
        &self,
        txn: &mut Transaction,
        row: &Bytes,
        _column: &Bytes,
    ) -> Result<(), ObserverError> {
        let Some(url) = model::url_of(row) else { return Ok(()) };
        let redirect = txn.get(row, col::REDIRECT).await?.unwrap_or_default();
        if !redirect.is_empty() {
            // Tell the end of the chain, not the next hop: hop-by-hop forwarding would circle
            // forever around a redirect cycle. A cycle has no end, and no page to tell.
            if let Some(end) = chain_end(txn, &String::from_utf8_lossy(&redirect)).await? {
                txn.notify(model::page(&end), Bytes::from_static(col::RANK_DIRTY));
            }
            let a = model::delete_if_present(txn, row, col::INDEG).await?;
            let b = model::delete_if_present(txn, row, col::NAMES).await?;
            if a || b {
                notify_downstream(txn, row).await?;
            }
            return Ok(());
        }
        let names: Vec<String> = alias_set(txn, url).await?.into_iter().collect();
        let in_degree = in_degree(txn, row, url, &names).await?;
        let a =
            model::set_if_changed(txn, row, col::INDEG, Bytes::from(in_degree.to_string())).await?;
        let b = model::set_json_if_changed(txn, row, col::NAMES, &names).await?;
        if a || b {
            notify_downstream(txn, row).await?;
        }
        Ok(())
    }
}

/// Distinct other pages with an edge into `url` or one of its aliases. Edges into `url` itself
/// are counted (`rank:base`, plus invert's pending changes, folded in here); the aliases'
/// edges are read, and each of their sources is checked against `url`'s edges with a point
/// read, so a source that links to several names counts once.
async fn in_degree(
    txn: &mut Transaction,
    row: &Bytes,
    url: &str,
    names: &[String],
) -> Result<u64, ObserverError> {
    let (start, end) = model::children("d:", url);
    let pending = txn.scan(&start, &end, col::DELTA).await?;
    let mut own = model::count_of(txn.get(row, col::BASE).await?)?;
    for (delta_row, v) in &pending {
        own += model::count_of(Some(v.clone()))?;
        txn.delete(delta_row.clone(), Bytes::from_static(col::DELTA));
    }
    if own < 0 {
        return Err(ObserverError::Failed(format!("{url}: inlink count {own} below zero")));
    }
    if !pending.is_empty() {
        model::set_if_changed(txn, row, col::BASE, Bytes::from(own.to_string())).await?;
    }
    // Sources of the aliases' edges that do not also link to the page itself.
    let aliases: Vec<String> = names.iter().filter(|n| n.as_str() != url).cloned().collect();
    let sources: BTreeSet<String> = model::inlinks(txn, &aliases)
        .await?
        .into_iter()
        .map(|l| l.from)
        .filter(|s| s != url)
        .collect();
    let keys: Vec<(Bytes, Bytes)> =
        sources.iter().map(|s| (model::edge(url, s), Bytes::from_static(col::EDGE))).collect();
    let extra = txn.get_many(&keys).await?.iter().filter(|e| e.is_none()).count();
    Ok(own as u64 + extra as u64)
}

/// Tells the page's cluster and its export that its rank changed.
///
/// The cluster is the one dedup has registered the page in (`dedup:registered`), and that
/// cell is written back unchanged: a write skew otherwise. A concurrent dedup could move the
/// page to another cluster after this snapshot, that cluster's forward could read our inlinks
/// before we commit, and we would tell the old cluster. Writing the cell makes the two
/// transactions conflict, so one of them retries and sees the other.
async fn notify_downstream(txn: &mut Transaction, row: &Bytes) -> Result<(), ObserverError> {
    let registered = txn.get(row, col::DEDUP_DONE).await?.unwrap_or_default();
    txn.set(row.clone(), Bytes::from_static(col::DEDUP_DONE), registered.clone());
    if !registered.is_empty() {
        txn.notify(
            model::cluster_head(&String::from_utf8_lossy(&registered)),
            Bytes::from_static(col::CLUSTER_DIRTY),
        );
    }
    txn.notify(row.clone(), Bytes::from_static(col::EXPORT_DIRTY));
    Ok(())
}

/// Where a redirect chain starting at `first` ends: the first URL that does not redirect.
/// `None` for a cycle or a chain longer than [`ALIAS_HOPS_MAX`].
pub async fn chain_end(txn: &Transaction, first: &str) -> Result<Option<String>, ObserverError> {
    let mut current = first.to_string();
    let mut seen = BTreeSet::new();
    for _ in 0..=ALIAS_HOPS_MAX {
        if !seen.insert(current.clone()) {
            return Ok(None);
        }
        let next = txn.get(&model::page(&current), col::REDIRECT).await?.unwrap_or_default();
        if next.is_empty() {
            return Ok(Some(current));
        }
        current = String::from_utf8_lossy(&next).into_owned();
    }
    Ok(None)
}

/// The page's URL and every URL whose redirect chain ends at it.
pub async fn alias_set(txn: &Transaction, url: &str) -> Result<BTreeSet<String>, ObserverError> {
    let mut names: BTreeSet<String> = BTreeSet::from([url.to_string()]);
    let mut frontier = vec![url.to_string()];
    for _ in 0..ALIAS_HOPS_MAX {
        let mut next = Vec::new();
        for name in &frontier {
            let (start, end) = model::children("r:", name);
            for (r, _) in txn.scan(&start, &end, col::ALIAS_FROM).await? {
                if let Some(source) = model::child_key(&r) {
                    if names.insert(source.to_string()) {
                        next.push(source.to_string());
                    }
                }
            }
        }
        if next.is_empty() {
            break;
        }
        frontier = next;
    }
    Ok(names)
}
