//! The indexing pipeline: eleven stages, each doing one job and writing what the next one
//! watches (spec §6), and the loaders and queries around them. Six are observers with runs of
//! their own; dedup, invert and alias run inside parse's transaction (they read only the
//! page's own row, which parse has just written: one run per page, not four), forward inside
//! cluster's (it reads what cluster's choice read), and export inside the transaction of
//! whichever of parse, indegree and cluster changed what a page's line shows. (Export is
//! registered as an observer too, for the notifications older versions left in a store.)
//! Cluster runs only for clusters of more than one page: the first member's parse run makes
//! a new cluster's choice ([`cluster::found`]), and a cluster of one is not told of its
//! member's changes (its indegree run forwards the names).
//!
//! A stage never calls another: it returns what it changed, and [`runs`] composes each
//! observer's run from its stages. Stages tell each other of changes only by writing into
//! the model ([`model::signals`]: a notification, a held cell); the search queue
//! ([`search`]) is data that several stages append to.
//!
//! ```text
//!   loader ─► crawl:want ─► fetch ─► crawl:raw ─► parse ─┬─► (+ export, dedup, ────┐
//!                                                        │   a new cluster's choice)│
//!     (replay writes crawl:raw directly)      one run:   ├─► (+ invert) ───────────┤ indeg:dirty
//!                                                        ├─► (+ alias) ────────────┘   │
//!                                                        └─► page:follow ─► discover   ▼
//!              cluster (+ forward, export) ◄────────────── cluster:dirty ◄─ indegree (+ export)
//!                                 │ near:dirty of the clusters near one whose entry in the
//!                                 ▼ band index changed (it wrote its own near:list)
//!                               near (a near-duplicate's list)
//! ```
//!
//! Every derived value is recomputed from the rows it depends on whenever one of them changes,
//! and written only if it differs, so once the workers are quiescent the export is the same
//! whatever order the changes came in: that of a fresh run over the final state of the web.

pub mod alias;
pub mod cluster;
pub mod dedup;
pub mod discover;
pub mod export;
pub mod fetch;
pub mod forward;
pub mod indegree;
pub mod invert;
mod load;
pub mod model;
pub mod near;
pub mod parse;
pub(crate) mod query;
pub mod rank;
pub mod runs;
pub mod search;
mod upgrade;

use std::sync::Arc;

use perc_crawl::Source;
use perc_notify::{NotifyKind, ObserverError, Registry, RegistryError};
use perc_txn::TxnError;

pub use load::{known_urls, load_recorded, next_due, recrawl_due, refetch, seed, seed_more};
pub use query::{
    canonical, export, export_each, fetch_state, links_each, page_count, page_info, report,
    report_since, PageInfo, Report,
};
pub use upgrade::{upgrade, Upgraded, LAYOUT};

use model::col;

/// Every observer of the pipeline, fetching through `source`; fetches schedule the next
/// by `schedule`; an in-degree run folds at most `fold_max` inlink changes.
pub fn registry_with(
    source: Arc<dyn Source>,
    schedule: model::Schedule,
    fold_max: usize,
) -> Result<Registry, RegistryError> {
    let mut r = Registry::new();
    let fetch = fetch::Fetch { source, schedule };
    r.register("fetch", col::WANT, NotifyKind::Strong, Arc::new(fetch))?;
    r.register("parse", col::RAW, NotifyKind::Strong, Arc::new(runs::Parse))?;
    r.register(
        "discover",
        col::FOLLOW,
        NotifyKind::Strong,
        Arc::new(discover::Discover::default()),
    )?;
    r.register(
        "indegree",
        col::INDEG_DIRTY,
        NotifyKind::Weak,
        Arc::new(runs::InDegree { fold_max }),
    )?;
    r.register(cluster::CLUSTER, col::CLUSTER_DIRTY, NotifyKind::Weak, Arc::new(runs::Cluster))?;
    r.register("near", col::NEAR_DIRTY, NotifyKind::Weak, Arc::new(near::Near))?;
    r.register("rank", col::RANK_DIRTY, NotifyKind::Weak, Arc::new(rank::Rank))?;
    // Nothing notifies export now (it runs in its inputs' writers' transactions); a store
    // written by an earlier version may still hold its notifications.
    r.register("export", col::EXPORT_DIRTY, NotifyKind::Weak, Arc::new(export::Export))?;
    Ok(r)
}

/// Why the index could not do what was asked: the store below failed (a conflict, an
/// outage, a full disk), or what it holds is not what the pipeline wrote.
#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    #[error(transparent)]
    Txn(#[from] TxnError),
    /// A stored value that cannot be read (`what`: where it is).
    #[error("the index is corrupt: {what}: {problem}")]
    Corrupt { what: String, problem: String },
    /// Stored values that contradict each other (a count below zero): a bug, not bad input.
    #[error("the index is inconsistent: {0}")]
    Inconsistent(String),
    /// A page row whose content an observer cannot work with (its URL does not parse).
    #[error("{row}: {problem}")]
    BadRow { row: String, problem: String },
    /// A store written by a later perc, in a layout this one cannot read.
    #[error(
        "the store is of layout {found}, written by a later perc; this one reads layouts up \
         to {reads}"
    )]
    Layout { found: u64, reads: u64 },
    /// A configured canonical rule that is not the one the store's canonical URLs were
    /// chosen by.
    #[error(
        "index.canonical_by is {asked}, but this store's canonical URLs were chosen by \
         {stored}: a store keeps the rule it was built with (build another store, in another \
         store.data, for {asked})"
    )]
    Rule { stored: &'static str, asked: &'static str },
}

impl perc_txn::Retryable for IndexError {
    fn is_retryable(&self) -> bool {
        matches!(self, IndexError::Txn(t) if t.is_retryable())
    }
}

impl IndexError {
    pub fn corrupt(what: impl Into<String>, problem: impl std::fmt::Display) -> IndexError {
        IndexError::Corrupt { what: what.into(), problem: problem.to_string() }
    }
}

/// Observers report the store's errors as the framework's (conflicts are retried) and the
/// index's own as failures (counted, retried with backoff, parked if they persist).
impl From<IndexError> for ObserverError {
    fn from(e: IndexError) -> ObserverError {
        match e {
            IndexError::Txn(t) => ObserverError::Txn(t),
            other => ObserverError::Failed(other.to_string()),
        }
    }
}
