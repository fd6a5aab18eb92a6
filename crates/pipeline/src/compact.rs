//! `perc compact`: one pass of the collector over the whole store, then the sled store's
//! files rewritten from its live data (`perc_store::SledStore::compact`). sled gives back its
//! log's space only slowly, so a store on disk is two to six times what it holds after a
//! large load; a compaction makes it 1.1-3.2 times smaller (docs/benchmarks.md,
//! "datapath" and "scaling"). Offline: the store must not be in use by another process
//! (sled's lock file refuses a second opener).

use perc_store::{Compacted, SledStore};
use perc_txn::gc::GcReport;
use tokio_util::sync::CancellationToken;

use crate::config::{Backend, Config};
use crate::error::{PipelineError, Result};
use crate::open::{sled_options, Create, Fetching};
use crate::Pipeline;

/// What [`compact`] did.
#[derive(Clone, Debug)]
pub struct Compaction {
    pub collected: GcReport,
    pub files: Compacted,
}

/// Collects the configured sled store's old versions, then compacts its files. `stop`
/// (SIGINT, SIGTERM) ends the collection pass, or drops the copy, and the store stays as it
/// was ([`PipelineError::Interrupted`]); once the copy is whole, the compaction finishes.
pub async fn compact(config: Config, stop: &CancellationToken) -> Result<Compaction> {
    if config.store.backend != Backend::Sled {
        return Err(PipelineError::Input(format!(
            "perc compact rewrites a sled store's files; the {} store needs no compaction \
             from perc (Bigtable compacts its own files; a memory store has none)",
            match config.store.backend {
                Backend::Bigtable => "bigtable",
                _ => "memory",
            }
        )));
    }
    let app = Pipeline::open(config.clone(), Fetching::Offline, Create::No).await?;
    // A collection pass cut short is as safe as one a crash ends: each of its writes stands
    // alone.
    let collected = tokio::select! {
        collected = app.collect() => Some(collected),
        () = stop.cancelled() => None,
    };
    app.close().await?;
    let Some(collected) = collected else { return Err(PipelineError::Interrupted) };
    let collected = collected?;
    let options = sled_options(&config.store);
    let data = config.store.data.clone();
    let stop = stop.clone();
    let files = tokio::task::spawn_blocking(move || {
        SledStore::compact(&data, &options, &|| stop.is_cancelled())
    })
    .await
    .map_err(|e| PipelineError::Setup(format!("the compaction stopped: {e}")))?;
    match files? {
        Some(files) => Ok(Compaction { collected, files }),
        None => Err(PipelineError::Interrupted),
    }
}
