//! The observers whose runs are several stages in one transaction: the one place that says
//! which stage follows which. A stage (its module) reads and writes its own cells and
//! returns what it changed; a run here decides what follows from that, in the same
//! transaction, so that the follower reads what its leader just wrote without a run of its
//! own (one transaction and its store calls instead of several a page).
//!
//! ```text
//!   parse run     parse ─┬─ meta changed ─────────► export
//!                        ├─ joined a cluster ─────► cluster::found ─► (a new cluster's choice:
//!                        │                                              follow_choice)
//!                        │                          or tell the cluster
//!                        ├──────────────────────► invert
//!                        └──────────────────────► alias
//!   cluster run   cluster ─► follow_choice: export of the members whose canonical moved,
//!                                           forward of the names to the canonical
//!   indegree run  indegree ─┬─ in-degree changed ─► export
//!                           └─ a cluster of one's names changed ─► forward
//! ```
//!
//! The other observers (fetch, discover, near, and export for notifications an earlier
//! version left) are one stage each, in their modules.
//!
//! The contract of each run is its stages' contracts in order; here only what the
//! composition adds:
//! - [`Parse`]. Trigger: `crawl:raw` of `p:<url>` (strong). Reads and writes: parse's, then
//!   export's when `page:meta` changed, dedup's, cluster's first choice
//!   ([`cluster::found`]) for a page that alone makes a new cluster (else the cluster is
//!   told), invert's, alias's. Notifies: what those stages notify (discover, the page's and
//!   its targets' indegree, clusters).
//! - [`Cluster`]. Trigger: `cluster:dirty` of `c:<hash>` (weak). Reads and writes: cluster's
//!   choice, then export's for each member whose canonical moved and forward's. Notifies:
//!   the clusters near its entry when the entry changed.
//! - [`InDegree`]. Trigger: `indeg:dirty` of `p:<url>` (weak). Reads and writes: indegree's,
//!   then export's when the in-degree changed and forward's when a cluster of one's names
//!   changed. Notifies: the page's cluster, the aliases its chain concerns, itself when it
//!   left change rows for later.
//! - Twice is harmless: every stage writes only what differs from what it reads, and the
//!   followers read what their leader wrote in the same transaction, so a second run of
//!   the same input finds every value as the first left it and writes nothing (parse
//!   queues the page for the search index again, which changes no document).

use async_trait::async_trait;
use bytes::Bytes;
use perc_notify::{Observer, ObserverError};
use perc_txn::Transaction;

use crate::{alias, cluster, dedup, export, forward, indegree, invert, model, parse};

/// A run of parse (`crawl:raw`, strong), and the page-local stages after it.
pub struct Parse;

#[async_trait]
impl Observer for Parse {
    async fn observe(
        &self,
        txn: &mut Transaction,
        row: &Bytes,
        _column: &Bytes,
    ) -> Result<(), ObserverError> {
        let Some(parsed) = parse::run(txn, row).await? else { return Ok(()) };
        if parsed.meta_changed {
            export::run(txn, row).await?;
        }
        let url = model::url_of(row).unwrap_or_default();
        if parsed.meta_changed || parsed.links != parsed.links_before {
            model::signals::rank_targets_changed(txn, [url]);
        }
        if parsed.page_changed {
            model::signals::rank_sources_changed(txn, url);
        }
        if let Some(joined) = dedup::run(txn, row, parsed.simhash).await? {
            let url = model::url_of(row).unwrap_or_default();
            match cluster::found(txn, &joined.hash, url, &joined.simhash).await? {
                Some(choice) => follow_choice(txn, choice).await?,
                None => model::signals::tell_cluster(txn, &joined.hash),
            }
        }
        invert::run(txn, row, &parsed.links_before, &parsed.links).await?;
        alias::run(txn, row).await?;
        Ok(())
    }
}

/// A run of cluster on a cluster's head (`cluster:dirty`, weak), and what its choice moves.
pub struct Cluster;

#[async_trait]
impl Observer for Cluster {
    async fn observe(
        &self,
        txn: &mut Transaction,
        row: &Bytes,
        _column: &Bytes,
    ) -> Result<(), ObserverError> {
        match cluster::run(txn, row).await? {
            Some(choice) => follow_choice(txn, choice).await,
            None => Ok(()),
        }
    }
}

/// A run of indegree on a URL (`indeg:dirty`, weak), and what its counts move.
pub struct InDegree {
    /// The most change rows a page's run folds (`index.indegree_fold_max`, 4096 by default).
    pub fold_max: usize,
}

#[async_trait]
impl Observer for InDegree {
    async fn observe(
        &self,
        txn: &mut Transaction,
        row: &Bytes,
        _column: &Bytes,
    ) -> Result<(), ObserverError> {
        let follow = indegree::run(txn, row, self.fold_max).await?;
        if follow.export {
            export::run(txn, row).await?;
        }
        if let Some(f) = &follow.forward {
            forward::run(txn, f).await?;
        }
        Ok(())
    }
}

/// What follows a cluster's choice: the export lines of the members whose canonical moved
/// (their cells read in one call), and the forwarding of the members' names.
async fn follow_choice(
    txn: &mut Transaction,
    choice: cluster::Choice,
) -> Result<(), ObserverError> {
    txn.get_many(&export::cells(&choice.moved)).await?;
    for member_row in &choice.moved {
        export::run(txn, member_row).await?;
    }
    forward::run(txn, &choice.forward).await
}
