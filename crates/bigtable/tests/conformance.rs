//! The store conformance suite on the Cloud Bigtable backend, against the emulator: each case
//! starts its own emulator on a free loopback port (nextest runs each case in its own
//! process) and opens a fresh table there. Without the emulator the cases fail, saying how to
//! get it.

use std::sync::Arc;

use perc_bigtable::{BigtableConfig, BigtableStore, Emulator};
use perc_store::conformance::{schema, Fresh};
use perc_store::Store;

async fn fresh() -> Fresh {
    let emulator = Emulator::start().unwrap_or_else(|e| panic!("{e}"));
    let config = BigtableConfig::emulator(emulator.addr(), "conformance");
    let store = BigtableStore::open(&config, schema()).await.expect("open the table");
    let store: Arc<dyn Store> = Arc::new(store);
    (store, Box::new(emulator))
}

perc_store::conformance_tests!(fresh);
