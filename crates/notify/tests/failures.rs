//! Observer runs that fail, panic or meet a registry mistake: counted, backed off, parked
//! in the store, recovered; and parked records of an older store moved once.

mod common;

use common::*;

#[test]
fn failing_observer_is_parked_then_recovers() {
    rt().block_on(async {
        struct Flaky {
            fail: std::sync::atomic::AtomicBool,
        }
        #[async_trait]
        impl Observer for Flaky {
            async fn observe(
                &self,
                txn: &mut Transaction,
                row: &Bytes,
                _c: &Bytes,
            ) -> Result<(), ObserverError> {
                if self.fail.load(Ordering::SeqCst) {
                    return Err(ObserverError::Failed("bad input: no title".into()));
                }
                txn.set(row.clone(), "ok", "yes");
                Ok(())
            }
        }
        let flaky = Arc::new(Flaky { fail: true.into() });
        let mut reg = Registry::new();
        reg.register("flaky", "v", NotifyKind::Strong, flaky.clone()).unwrap();
        let env = Env::mem(reg).await;
        env.write("r", "v", "x").await;
        let config =
            NotifyConfig { failures_max: 3, failure_backoff_ms: 100, ..NotifyConfig::default() };
        let engine = env.engine(config).await;
        let manual = env.manual.clone().unwrap();
        let mut outcomes = Vec::new();
        for _ in 0..6 {
            let r = engine.step().await.unwrap();
            outcomes.push((r.failed, r.busy, r.parked));
            manual.advance_ms(10_000);
        }
        assert_eq!(outcomes[..3], [(1, 0, 0), (1, 0, 0), (0, 0, 1)], "{outcomes:?}");
        assert_eq!(env.notify_cells().await, 0, "a parked notification left the notify family");
        let failed = engine.failed_list().await.unwrap();
        assert_eq!(failed.len(), 1);
        assert_eq!(failed[0].detail, "flaky: bad input: no title");
        let stats = engine.stats();
        assert_eq!((stats[0].failures, stats[0].parked), (3, 1));
        // Fixed, and the row changes again: it runs, and its failed record goes.
        flaky.fail.store(false, Ordering::SeqCst);
        env.write("r", "v", "y").await;
        assert_eq!(engine.run_until_quiet().await.unwrap().ran, 1);
        assert!(engine.failed_list().await.unwrap().is_empty());
        assert_eq!(env.read("r", "ok").await.unwrap(), "yes");
    });
}

/// An observer that panics on one row (a bug some page finds) fails that run as an error
/// would, under the workers: the notification is parked with the panic's message, the other
/// rows are indexed, and the workers go quiet. (A panic unwinding through a worker left its
/// run counted in flight, and `wait` never returned.)
#[test]
fn a_panicking_observer_is_parked_and_the_workers_go_quiet() {
    rt().block_on(async {
        let mut reg = Registry::new();
        let fragile = Arc::new(Echo { panics_on: Some(b"bad") });
        reg.register("fragile", "v", NotifyKind::Strong, fragile).unwrap();
        let env = Env::new(Arc::new(MemStore::new(perc_notify::schema())), reg, false).await;
        quiet_with_bad_parked(&env, "fragile: panicked: no title on this page").await;
    });
}

/// Writes `ok` = "yes" in row `<row>-out` for each notified row; panics on row `panics_on`
/// (a bug some page finds).
struct Echo {
    panics_on: Option<&'static [u8]>,
}

#[async_trait]
impl Observer for Echo {
    async fn observe(
        &self,
        txn: &mut Transaction,
        row: &Bytes,
        _c: &Bytes,
    ) -> Result<(), ObserverError> {
        if self.panics_on == Some(row.as_ref()) {
            panic!("no title on this page");
        }
        let out = format!("{}-out", String::from_utf8_lossy(row));
        txn.set(out, "ok", "yes");
        Ok(())
    }
}

/// Notifies rows `bad`, `good` and `good2` (column `v`), and runs workers that park a
/// notification at its first failure: they go quiet with `bad`'s notification parked with
/// `detail`, and the other two rows' runs written (`ok` = "yes" in row `<row>-out`).
async fn quiet_with_bad_parked(env: &Env, detail: &str) {
    for row in ["bad", "good", "good2"] {
        env.write(row, "v", "x").await;
    }
    let config =
        NotifyConfig { failures_max: 1, idle_ms: 5, gc_interval_ms: 0, ..NotifyConfig::default() };
    let (engine, workers) = env.workers(config).await;
    tokio::time::timeout(std::time::Duration::from_secs(60), workers.wait())
        .await
        .expect("the workers go quiet after a panic")
        .unwrap();
    let failed = engine.failed_list().await.unwrap();
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0].detail, detail);
    for row in ["good", "good2"] {
        assert_eq!(env.read(&format!("{row}-out"), "ok").await.unwrap(), "yes");
    }
    assert_eq!(env.notify_cells().await, 0);
    workers.shutdown().await;
}

/// A panic elsewhere in a run than in the observer (here in its commit's store call, as a bug
/// in the transaction layer would panic) fails the run as an error would, too: the
/// notification is parked, the other rows are indexed, and the workers go quiet.
#[test]
fn a_panic_in_a_runs_commit_is_parked_and_the_workers_go_quiet() {
    rt().block_on(async {
        /// Panics in the store call that prewrites `bad-out`.
        struct Boom;
        #[async_trait]
        impl Hook for Boom {
            async fn before(&self, call: Call<'_>) {
                if matches!(call, Call::CheckAndMutate(row) if row == b"bad-out") {
                    panic!("the prewrite of bad-out broke");
                }
            }
        }
        let mut reg = Registry::new();
        reg.register("echo", "v", NotifyKind::Strong, Arc::new(Echo { panics_on: None })).unwrap();
        let store = Arc::new(Hooked::new(MemStore::new(perc_notify::schema()), Boom));
        let env = Env::new(store, reg, false).await;
        quiet_with_bad_parked(&env, "echo: panicked: the prewrite of bad-out broke").await;
    });
}

/// A failed record as an older perc kept it: in the notified row, family `failed`.
fn legacy_failed_record(row: &str, column: &str, detail: &str) -> perc_store::RowMutation {
    perc_store::RowMutation {
        row: Bytes::from(row.to_string()),
        mutations: vec![perc_store::Mutation::Put {
            column: perc_store::Column::new(
                perc_notify::FAILED.name,
                Bytes::from(column.to_string()),
            ),
            ts: Ts::ZERO,
            value: Bytes::from(detail.to_string()),
        }],
    }
}

#[test]
fn parked_records_of_an_older_store_move_to_their_family_once() {
    rt().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let open = || async {
            let store: Arc<dyn Store> = Arc::new(
                SledStore::open(dir.path(), perc_notify::schema(), &SledOptions::default())
                    .unwrap(),
            );
            store
        };
        let store = open().await;
        store
            .mutate_rows(&[
                legacy_failed_record("p:a", "parse:dirty", "parse: bad input"),
                legacy_failed_record("p:b", "export:dirty", "export: no page"),
            ])
            .await
            .unwrap();
        let env = Env::new(store.clone(), Registry::new(), true).await;
        let engine = env.engine(NotifyConfig::default()).await;
        // Not listed until moved: the list reads only the new family.
        assert!(engine.failed_list().await.unwrap().is_empty());
        engine.load_parked().await.unwrap();
        let listed: Vec<(String, String, String)> = engine
            .failed_list()
            .await
            .unwrap()
            .into_iter()
            .map(|f| {
                (
                    String::from_utf8(f.row.to_vec()).unwrap(),
                    String::from_utf8(f.column.to_vec()).unwrap(),
                    f.detail,
                )
            })
            .collect();
        assert_eq!(
            listed,
            [
                ("p:a".into(), "parse:dirty".into(), "parse: bad input".into()),
                ("p:b".into(), "export:dirty".into(), "export: no page".into()),
            ]
        );
        let legacy = Scan::whole(perc_notify::FAILED.name, usize::MAX);
        assert!(store.scan(&legacy).await.unwrap().is_empty(), "the old records were left");
        // Once a store: a record in the old family written after the move is not read again
        // (no perc writes one any more), so a start does not scan the whole table each time.
        store.mutate_rows(&[legacy_failed_record("p:c", "parse:dirty", "late")]).await.unwrap();
        drop((engine, env, store));
        let store = open().await;
        let env = Env::new(store.clone(), Registry::new(), true).await;
        let engine = env.engine(NotifyConfig::default()).await;
        engine.load_parked().await.unwrap();
        assert_eq!(engine.failed_list().await.unwrap().len(), 2, "moved twice, or lost on reopen");
        assert_eq!(store.scan(&legacy).await.unwrap().len(), 1);
    });
}

#[test]
fn backoff_holds_a_failed_notification_until_due() {
    rt().block_on(async {
        struct Fails;
        #[async_trait]
        impl Observer for Fails {
            async fn observe(
                &self,
                _: &mut Transaction,
                _: &Bytes,
                _: &Bytes,
            ) -> Result<(), ObserverError> {
                Err(ObserverError::Failed("always".into()))
            }
        }
        let mut reg = Registry::new();
        reg.register("fails", "v", NotifyKind::Strong, Arc::new(Fails)).unwrap();
        let env = Env::mem(reg).await;
        env.write("r", "v", "x").await;
        let engine = env
            .engine(NotifyConfig {
                failures_max: 10,
                failure_backoff_ms: 100,
                ..NotifyConfig::default()
            })
            .await;
        assert_eq!(engine.step().await.unwrap().failed, 1);
        // Not due yet: the notification is left alone (and still pending).
        assert_eq!(engine.step().await.unwrap().busy, 1);
        assert!(engine.has_pending().await.unwrap());
        env.manual.as_ref().unwrap().advance_ms(1_000);
        assert_eq!(engine.step().await.unwrap().failed, 1);
    });
}

#[test]
fn registry_refuses_ambiguity() {
    let mut reg = Registry::new();
    reg.register("A", "a", NotifyKind::Strong, effect()).unwrap();
    let e = reg.register("B", "a", NotifyKind::Strong, effect()).unwrap_err();
    assert!(e.to_string().contains("already has observer \"A\""), "{e}");
    let e = reg.register("A", "b", NotifyKind::Strong, effect()).unwrap_err();
    assert!(e.to_string().contains("used twice"), "{e}");
    let e = reg.register("C", "perc.ack:A", NotifyKind::Strong, effect()).unwrap_err();
    assert!(e.to_string().contains("reserved"), "{e}");
}
