//! invert: link inversion. A page's outlinks become inlink rows of their targets.
//!
//! - Runs: in the page's parse run, after parse wrote `page:links`.
//! - Reads: the links parse computed, and the `page:links` it replaced: since both are written
//!   in one transaction, the links the last run inverted (no copy of them is kept).
//! - Writes: for each target added, or whose anchor changed, `e:<target>\0<source>` =
//!   anchor; for each target no longer linked, deletes that row; for each edge added or
//!   removed (to another page), a change row `d:<target>\0<source>\0<start_ts>` = +1 or -1
//!   (`indeg:delta`, for the target's indegree run to fold and delete).
//! - Unchecked writes: all of them (`set_unchecked`), prewritten in one batched call. The
//!   `e:` rows of a source are written only by the parse runs of that source, each of which
//!   writes the source's `page:links` too (the diff is not empty), so two of them conflict
//!   there; the change rows are new rows, unique to this transaction.
//! - Queues: for the search index ([`crate::search`]), each target whose edge from this
//!   source stays with another anchor.
//! - Notifies: each affected target's `indeg:dirty` (weakly: a page every page links to is a
//!   hot row, and weak notifications never conflict), unless the target was never parsed
//!   (see [`model::signals::inlinks_changed`]: most targets of a crawl, whose runs would
//!   find nothing to do).
//! - Twice is harmless: the second time the links replaced equal the links written, and the
//!   diff is empty.

use std::collections::BTreeMap;

use bytes::Bytes;
use perc_notify::ObserverError;
use perc_txn::Transaction;

use crate::model::{self, col};

/// The stage, in the transaction of the page's parse run: `before` is the page's
/// `page:links` as the last parse run left it (and so as the last inversion saw it), `now`
/// what this run writes.
pub async fn run(
    txn: &mut Transaction,
    row: &Bytes,
    before: &[(String, String)],
    now: &[(String, String)],
) -> Result<(), ObserverError> {
    let Some(source) = model::url_of(row) else { return Ok(()) };
    let now: BTreeMap<&String, &String> = now.iter().map(|(t, a)| (t, a)).collect();
    let before: BTreeMap<&String, &String> = before.iter().map(|(t, a)| (t, a)).collect();
    if now == before {
        return Ok(());
    }
    // Edges that appear (+1) or go (-1), for the targets' counts.
    let mut deltas: Vec<(&String, i64)> = Vec::new();
    for (&target, &anchor) in &now {
        if before.get(target) != Some(&anchor) {
            txn.set_unchecked(
                model::edge(target, source),
                Bytes::from_static(col::EDGE),
                anchor.clone(),
            );
            model::signals::inlinks_changed(txn, target);
            if before.contains_key(target) {
                // The same edge with another anchor: no count changes, so no export line
                // does; the search documents that show the anchor do.
                crate::search::queue(txn, target);
            } else {
                deltas.push((target, 1));
            }
        }
    }
    for &target in before.keys() {
        if !now.contains_key(target) {
            txn.delete_unchecked(model::edge(target, source), Bytes::from_static(col::EDGE));
            model::signals::inlinks_changed(txn, target);
            deltas.push((target, -1));
        }
    }
    deltas.retain(|(target, _)| target.as_str() != source);
    let ts = txn.start_ts().0;
    for (target, d) in deltas {
        txn.set_unchecked(
            model::delta(target, source, ts),
            Bytes::from_static(col::DELTA),
            d.to_string(),
        );
    }
    Ok(())
}
