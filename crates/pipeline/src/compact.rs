//! `perc compact`: one pass of the collector over the whole store, then the sled store's
//! files rewritten to hold only live data (`perc_store::sled_compact`). sled gives back its
//! log's space only slowly, so a store on disk is two to five times what it holds after a
//! large load; a compaction brings it to what it holds. Offline: the store must not be in
//! use by another process (sled's lock file refuses a second opener).

use perc_store::{Compacted, SledStore};
use perc_txn::gc::GcReport;

use crate::config::{Backend, Config};
use crate::error::{PipelineError, Result};
use crate::open::{sled_options, Create, Fetching};
use crate::Pipeline;

/// Cells a scan of the collection pass reads.
pub(crate) const GC_BATCH: usize = 4096;

/// What [`compact`] did.
#[derive(Clone, Debug)]
pub struct Compaction {
    pub collected: GcReport,
    pub files: Compacted,
}

/// Collects the configured sled store's old versions, then compacts its files.
pub async fn compact(config: Config) -> Result<Compaction> {
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
    let collected = app.collect().await;
    app.close().await?;
    let collected = collected?;
    let options = sled_options(&config.store);
    let data = config.store.data.clone();
    let files = tokio::task::spawn_blocking(move || SledStore::compact(&data, &options))
        .await
        .map_err(|e| PipelineError::Setup(format!("the compaction stopped: {e}")))??;
    Ok(Compaction { collected, files })
}
