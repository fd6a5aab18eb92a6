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

/// A store whose log sled does not compress (`zstd_level` 0; the default compresses).
mod sled_uncompressed {
    use std::sync::Arc;

    use perc_store::{conformance, SledOptions, SledStore, Store};

    perc_store::conformance_tests!(|| async {
        let dir = tempfile::tempdir().expect("temporary directory");
        let options = SledOptions { zstd_level: 0, ..SledOptions::default() };
        let store = SledStore::open(dir.path(), conformance::schema(), &options).expect("open");
        let store: Arc<dyn Store> = Arc::new(store);
        (store, Box::new(dir) as Box<dyn std::any::Any + Send>)
    });
}

/// Group commit of `mutate_rows` keeps the contract on both local backends.
mod coalesced_mem {
    use std::sync::Arc;

    use perc_store::{conformance, Coalesced, MemStore, Store};

    perc_store::conformance_tests!(|| async {
        let store: Arc<dyn Store> = Arc::new(Coalesced::new(MemStore::new(conformance::schema())));
        (store, Box::new(()) as Box<dyn std::any::Any + Send>)
    });
}

mod coalesced_sled {
    use std::sync::Arc;

    use perc_store::{conformance, Coalesced, SledOptions, SledStore, Store};

    perc_store::conformance_tests!(|| async {
        let dir = tempfile::tempdir().expect("temporary directory");
        let store = SledStore::open(dir.path(), conformance::schema(), &SledOptions::default())
            .expect("open sled");
        // Several merged calls in flight, as the pipeline runs it.
        let store: Arc<dyn Store> = Arc::new(Coalesced::with_lanes(store, 3));
        (store, Box::new(dir) as Box<dyn std::any::Any + Send>)
    });
}

/// Concurrent callers share calls, and every row of every caller is written: with one merged
/// call in flight at a time, and with several.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writes_share_calls_and_all_land() {
    for lanes in [1, 4] {
        concurrent_writes(lanes).await;
    }
}

async fn concurrent_writes(lanes: usize) {
    use std::sync::Arc;

    use perc_store::{
        conformance, Coalesced, Column, ColumnRead, Counted, Hooked, MemStore, Mutation,
        RowMutation, Store, Ts, TsRange,
    };

    let counted = Arc::new(Counted::new(MemStore::new(conformance::schema())));
    let store = Arc::new(Coalesced::with_lanes(Hooked::new(counted.clone(), SlowWrites), lanes));
    let family = conformance::schema().families()[0].name;
    let col = Column::new(family, "c");
    let tasks: Vec<_> = (0..64u64)
        .map(|i| {
            let (store, col) = (store.clone(), col.clone());
            tokio::spawn(async move {
                for j in 0..20u64 {
                    let row = format!("r{i:02}-{j:02}");
                    let m =
                        Mutation::Put { column: col.clone(), ts: Ts(1), value: row.clone().into() };
                    store
                        .mutate_rows(&[RowMutation { row: row.into(), mutations: vec![m] }])
                        .await?;
                }
                Ok::<_, perc_store::StoreError>(())
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    let calls = counted.counts().mutate_rows;
    assert!(
        calls < 64 * 20,
        "{lanes} lanes: {calls} calls for {} writes: nothing was merged",
        64 * 20
    );
    assert_eq!(counted.counts().batched_rows, 64 * 20);
    for i in 0..64u64 {
        for j in 0..20u64 {
            let row = format!("r{i:02}-{j:02}");
            let got = store
                .read_row(row.as_bytes(), &[ColumnRead::newest(col.clone(), TsRange::ALL)])
                .await
                .unwrap();
            assert_eq!(got[0][0].value, row.as_bytes(), "{row}");
        }
    }
}

/// Makes batched writes take a while, as a real store's do: callers arrive while every lane
/// is busy.
struct SlowWrites;

#[async_trait::async_trait]
impl perc_store::Hook for SlowWrites {
    async fn before(&self, call: perc_store::Call<'_>) {
        if let perc_store::Call::MutateRows(_) = call {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }
}
