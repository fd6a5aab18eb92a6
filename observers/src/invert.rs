//! invert: link inversion. A page's outlinks become inlink rows of their targets.
//!
//! - Runs: in the page's parse run, after parse wrote `page:links`.
//! - Reads: the links, and `invert:done` (the links inverted last time).
//! - Writes: for each target added, or whose anchor changed, `e:<target>\0<source>` =
//!   anchor; for each target no longer linked, deletes that row; for each edge added or
//!   removed (to another page), +1 or -1 into `d:<target>\0<source>` (`indeg:delta`, which
//!   only this source's runs, the target's indegree and its aliases' indegree runs touch, so a page
//!   every page links to is no hot cell; a 0 is kept, for indegree to delete); then `invert:done`.
//! - Notifies: each affected target's `indeg:dirty` (weakly: a page every page links to is a
//!   hot row, and weak notifications never conflict).
//! - Twice is harmless: the diff against `invert:done` is empty the second time.

use std::collections::BTreeMap;

use bytes::Bytes;
use perc_notify::ObserverError;
use perc_txn::Transaction;

use crate::model::{self, col};

/// The stage, in the transaction of the page's parse run.
pub async fn run(txn: &mut Transaction, row: &Bytes) -> Result<(), ObserverError> {
    let Some(source) = model::url_of(row) else { return Ok(()) };
    let now: BTreeMap<String, String> =
        model::get_json::<Vec<(String, String)>>(txn, row, col::LINKS)
            .await?
            .unwrap_or_default()
            .into_iter()
            .collect();
    let before: BTreeMap<String, String> =
        model::get_json::<Vec<(String, String)>>(txn, row, col::LINKS_INVERTED)
            .await?
            .unwrap_or_default()
            .into_iter()
            .collect();
    if now == before {
        return Ok(());
    }
    // Edges that appear (+1) or go (-1), for the targets' counts.
    let mut deltas: Vec<(&String, i64)> = Vec::new();
    for (target, anchor) in &now {
        if before.get(target) != Some(anchor) {
            txn.set(model::edge(target, source), Bytes::from_static(col::EDGE), anchor.clone());
            txn.notify(model::page(target), Bytes::from_static(col::INDEG_DIRTY));
            if !before.contains_key(target) {
                deltas.push((target, 1));
            }
        }
    }
    for target in before.keys() {
        if !now.contains_key(target) {
            txn.delete(model::edge(target, source), Bytes::from_static(col::EDGE));
            txn.notify(model::page(target), Bytes::from_static(col::INDEG_DIRTY));
            deltas.push((target, -1));
        }
    }
    deltas.retain(|(target, _)| target.as_str() != source);
    let keys: Vec<(Bytes, Bytes)> = deltas
        .iter()
        .map(|(t, _)| (model::delta(t, source), Bytes::from_static(col::DELTA)))
        .collect();
    let pending = txn.get_many(&keys).await?;
    for ((key, _), ((_, d), old)) in keys.into_iter().zip(deltas.iter().zip(pending)) {
        // Kept at 0 too: indegree deletes the row, and an alias may have marked it.
        let n = model::count_of(old)? + d;
        txn.set(key, Bytes::from_static(col::DELTA), n.to_string());
    }
    let done: Vec<(String, String)> = now.into_iter().collect();
    txn.set(
        row.clone(),
        Bytes::from_static(col::LINKS_INVERTED),
        serde_json::to_vec(&done).expect("serializable"),
    );
    Ok(())
}
