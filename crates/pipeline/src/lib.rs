//! perc's front door: one process's perc (the store, the oracle, the observers and the
//! workers) assembled from a validated [`Config`], and the verbs every user of perc calls.
//! The binary, the server, the benchmarks and the tests open a [`Pipeline`] rather than
//! wiring the layers themselves.
//!
//! Where each part lives: `open` assembles it ([`Pipeline::open`], [`Builder`]); `load` puts
//! work in (`crawl`, `replay`, `refetch`, the recrawl); `query` reads the index
//! (`canonical`, `page`, `export`, the search queue); `run` runs the observers
//! (`run_until_quiet`, `wait`, `work`) with the progress line; `status` and [`status_text`]
//! are `perc status`; `stats` keeps the counters in the store; [`config`] is the
//! configuration and its checks, `error` [`PipelineError`], [`diff`] the semantic diff of two
//! exports (`perc diff`, `perc replay --expect`), `compact` the offline rewrite of a store.

mod compact;
pub mod config;
pub mod diff;
mod error;
mod load;
mod open;
mod pace;
mod query;
mod run;
mod stats;
mod status;
pub mod status_text;

use std::sync::Arc;
use std::time::Instant;

use perc_notify::Engine;
use perc_store::Store;
use perc_txn::Client;

pub use crate::compact::{compact, Compaction};
pub use crate::config::{Backend, Config, ConfigError, MEMORY};
pub use crate::error::{PipelineError, Result};
pub use crate::open::{open_store, shared_oracle, sled_options, Builder, Create, Fetching};
pub use load::{crawl_scope, Refetched, Replayed};
/// What a process around the pipeline needs of the layers below it: the URL rules a seed or
/// a request's URL is checked by, the WARC recorder a crawl writes through, and the server
/// of the timestamp oracle (`perc oracle`).
pub use perc_crawl::urls::had_userinfo;
pub use perc_crawl::{normalize, warc::Recorder};
/// What the verbs hand back, from the layer that defines them.
pub use perc_observers::model::{CrawlScope, ExportLine};
pub use perc_observers::search::{importance, Documents, Queued, SearchDoc};
pub use perc_observers::{PageInfo, Report};
pub use perc_oracle::{serve as serve_oracle, OracleError};
pub use query::page_record;
pub use run::RunSummary;
pub use status::{Status, WorkerStatus};

use stats::{StoredHosts, StoredStats};

/// One process's indexing system over one store: what [`Pipeline::open`] assembles, and
/// the verbs the binary, the server, the benchmarks and the tests call. Its parts are
/// reached through [`Pipeline::client`], [`Pipeline::engine`] and [`Pipeline::store`] by the
/// layers that work below the verbs (the benchmarks, the tests).
pub struct Pipeline {
    store: Arc<dyn Store>,
    /// The calls that reached the store backend from this process, by kind.
    calls: Arc<perc_store::Counted<Arc<dyn Store>>>,
    client: Client,
    engine: Arc<Engine>,
    config: Config,
    /// The live fetcher's politeness layer, which counts requests per host (none offline).
    polite: Option<Arc<open::Polite>>,
    /// Where pages come from (the fetch observer's source): sitemaps are read through it.
    source: Arc<dyn perc_crawl::Source>,
    /// This process's counters as far as they have been added to the stored ones.
    saved: std::sync::Mutex<StoredStats>,
    hosts_saved: std::sync::Mutex<StoredHosts>,
    /// When the search queue's size was last checked ([`Pipeline::bound_search_queue`]).
    queue_checked: std::sync::Mutex<Option<Instant>>,
    /// The recrawl's window on the notifications waiting ([`pace`]).
    pace: std::sync::Mutex<pace::Pace>,
}

impl Pipeline {
    /// Deregisters this process's clients and makes every commit durable.
    pub async fn close(self) -> Result<()> {
        self.client.deregister().await?;
        self.engine.client().deregister().await?;
        // Everything the observers committed without a flush is made durable before exit.
        self.store.sync().await?;
        Ok(())
    }

    /// What politeness does with each host this process crawls, now (none offline).
    pub fn host_states(&self) -> Vec<perc_crawl::HostState> {
        self.polite.as_ref().map_or_else(Vec::new, |p| p.host_states())
    }

    /// This process's observer counters (runs, commits, ...), as they are now.
    pub fn observer_stats(&self) -> Vec<perc_notify::ObserverStats> {
        self.engine.stats()
    }

    /// The calls this process made to the store backend so far, by kind (RPCs on Bigtable).
    pub fn store_calls(&self) -> perc_store::OpCounts {
        self.calls.counts()
    }

    /// The configuration it was opened with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The transactions' client: loaders' commits are made durable before they return.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The engine that runs the observers.
    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// The store, as the transactions see it (calls counted, small writes coalesced).
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Now on the pipeline's clock, in ms since the epoch.
    pub fn now_ms(&self) -> u64 {
        self.client.clock().now_ms()
    }

    /// Tells the observers' engine of an error met outside its runs (a recrawl's or a search
    /// indexer's write): a full disk stops the engine as one met in a run does, and so ends
    /// [`Pipeline::work`] with it.
    pub fn note(&self, e: &PipelineError) {
        if let PipelineError::OutOfSpace(se) = e {
            self.engine.note(&perc_txn::TxnError::Store(se.clone()));
        }
    }

    /// This process's worker id, as other processes see it in locks and leases.
    pub fn worker_id(&self) -> perc_txn::ClientId {
        self.engine.client().id()
    }
}
