//! The shared conformance suite on the mem and sled backends.

mod mem {
    use std::sync::Arc;

    use perc_store::{conformance, MemStore, Store};

    perc_store::conformance_tests!(|| async {
        let store: Arc<dyn Store> = Arc::new(MemStore::new(conformance::schema()));
        (store, Box::new(()) as Box<dyn std::any::Any + Send>)
    });
}

mod sled {
    use std::sync::Arc;

    use perc_store::{conformance, SledOptions, SledStore, Store};

    perc_store::conformance_tests!(|| async {
        let dir = tempfile::tempdir().expect("temporary directory");
        let store = SledStore::open(dir.path(), conformance::schema(), &SledOptions::default())
            .expect("open sled");
        let store: Arc<dyn Store> = Arc::new(store);
        (store, Box::new(dir) as Box<dyn std::any::Any + Send>)
    });
}
