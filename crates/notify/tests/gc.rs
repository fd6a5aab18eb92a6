//! Garbage collection of old versions under live transactions and pending notifications.

mod common;

use common::*;

async fn write_records(store: &Arc<dyn Store>, row: &str) -> usize {
    let scan = Scan {
        family: "write",
        start: Bytes::from(row.to_string()),
        end: Bytes::from(format!("{row}\0")),
        limit: usize::MAX,
    };
    store.scan(&scan).await.unwrap().len()
}

#[test]
fn gc_keeps_what_live_transactions_read_and_pending_notifications() {
    rt().block_on(async {
        let mut reg = Registry::new();
        reg.register("E", "watched", NotifyKind::Strong, effect()).unwrap();
        let env = Env::mem(reg).await;
        for i in 0..20 {
            env.write("cell", "c", &format!("v{i}")).await;
        }
        // A long reader holds its snapshot at v19.
        let reader_client = env.client().await;
        let reader = reader_client.begin().await.unwrap();
        for i in 20..40 {
            env.write("cell", "c", &format!("v{i}")).await;
        }
        env.write("other", "watched", "pending").await; // a notification nobody processed
                                                        // Every worker publishes where it is (the workers' heartbeat loop does this).
        let gc_client = env.client().await;
        env.me().heartbeat().await.unwrap();
        reader_client.heartbeat().await.unwrap();
        let report = gc::collect(&gc_client, 7).await.unwrap();
        assert_eq!(report.safe_point, reader.start_ts(), "{report:?}");
        assert_eq!(
            text(reader.get(b"cell", b"c").await.unwrap()),
            "v19",
            "the live reader's version survived"
        );
        assert_eq!(env.read("cell", "c").await.unwrap(), "v39");
        assert_eq!(write_records(&env.store, "cell").await, 21, "v19 and the 20 newer versions");
        assert_eq!(env.notify_cells().await, 1, "the pending notification survived");
        // The reader ends: everything but the newest goes.
        drop(reader);
        reader_client.heartbeat().await.unwrap();
        env.me().heartbeat().await.unwrap();
        let report = gc::collect(&gc_client, 7).await.unwrap();
        assert!(report.write_records_removed >= 20, "{report:?}");
        assert_eq!(write_records(&env.store, "cell").await, 1);
        assert_eq!(env.read("cell", "c").await.unwrap(), "v39");
        assert_eq!(env.notify_cells().await, 1);
        // A deleted cell disappears entirely.
        let mut t = env.me().begin().await.unwrap();
        t.delete("cell", "c");
        t.commit().await.unwrap();
        for c in [env.me(), &reader_client] {
            c.heartbeat().await.unwrap();
        }
        gc::collect(&gc_client, 7).await.unwrap();
        assert_eq!(write_records(&env.store, "cell").await, 0);
        assert_eq!(env.read("cell", "c").await, None);
    });
}

#[test]
fn gc_cleans_a_row_in_one_call_and_around_a_locked_cell() {
    rt().block_on(async {
        let counted = Arc::new(perc_store::Counted::new(MemStore::new(perc_notify::schema())));
        let env = Env::new(counted.clone(), Registry::new(), true).await;
        for i in 0..5 {
            for c in ["a", "b", "c"] {
                env.write("row", c, &format!("{c}{i}")).await;
            }
        }
        let gc_client = env.client().await;
        env.me().heartbeat().await.unwrap();
        let before = counted.counts();
        let report = gc::collect(&gc_client, 4096).await.unwrap();
        assert_eq!((report.cells_cleaned, report.write_records_removed), (3, 12), "{report:?}");
        assert_eq!(
            counted.counts().check_and_mutate - before.check_and_mutate,
            1,
            "the row's three cells cleaned in one call"
        );
        assert_eq!(write_records(&env.store, "row").await, 3);
        // Garbage again in every cell, and a lock on `b` (a writer between prewrite and commit).
        for i in 5..8 {
            for c in ["a", "b", "c"] {
                env.write("row", c, &format!("{c}{i}")).await;
            }
        }
        let lock = perc_store::RowMutation {
            row: Bytes::from_static(b"row"),
            mutations: vec![perc_store::Mutation::Put {
                column: perc_store::Column::new("lock", Bytes::from_static(b"b")),
                ts: Ts(1),
                value: Bytes::from_static(b"not a real lock: GC only looks for one"),
            }],
        };
        env.store.mutate_rows(&[lock]).await.unwrap();
        env.me().heartbeat().await.unwrap();
        let report = gc::collect(&gc_client, 4096).await.unwrap();
        assert_eq!((report.cells_cleaned, report.write_records_removed), (2, 6), "{report:?}");
        // `a` and `c` keep their newest write record; `b` all four of its.
        assert_eq!(write_records(&env.store, "row").await, 1 + 4 + 1);
        for c in ["a", "c"] {
            assert_eq!(env.read("row", c).await.unwrap(), format!("{c}7"));
        }
    });
}

#[test]
fn store_does_not_grow_with_updates_when_collected() {
    rt().block_on(async {
        let (_, reg) = one_effect();
        let dir = tempfile::tempdir().unwrap();
        let store = sled(dir.path());
        let env = Env::new(store, reg, true).await;
        let engine = env.engine(NotifyConfig::default()).await;
        let gc_client = env.client().await;
        for round in 0..300 {
            env.write("r", "v", &format!("value {round}")).await;
            engine.run_until_quiet().await.unwrap();
            if round % 50 == 49 {
                env.me().heartbeat().await.unwrap();
                engine.client().heartbeat().await.unwrap();
                gc::collect(&gc_client, 64).await.unwrap();
                // v, seen, effect and the ack: one committed version each, whatever the round.
                assert_eq!(write_records(&env.store, "r").await, 4, "round {round}");
            }
        }
        assert_eq!(env.read("r", "effect").await.unwrap(), "300");
    });
}
