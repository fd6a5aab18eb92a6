//! The observer framework, driven step by step (deterministic) where possible, and with real
//! concurrency where the point is concurrency.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use perc_notify::{
    client_for, Engine, NotifyConfig, NotifyKind, Observer, ObserverError, Pending, Registry,
    RunOutcome, Workers,
};
use perc_oracle::{LocalOracle, Oracle};
use perc_store::{Call, Hook, Hooked, MemStore, Scan, SledOptions, SledStore, Store, Ts};
use perc_txn::gc;
use perc_txn::{Client, Clock, CommitStep, ManualClock, SystemClock, Transaction, TxnConfig};

struct Env {
    store: Arc<dyn Store>,
    oracle: Arc<dyn Oracle>,
    clock: Arc<dyn Clock>,
    manual: Option<Arc<ManualClock>>,
    registry: Arc<Registry>,
    /// The test's own worker, for setup writes and checking reads.
    me: Option<Client>,
}

impl Env {
    async fn new(store: Arc<dyn Store>, registry: Registry, manual: bool) -> Env {
        let oracle: Arc<dyn Oracle> = Arc::new(LocalOracle::open(store.clone(), 64).await.unwrap());
        let (clock, manual): (Arc<dyn Clock>, _) = if manual {
            let m = Arc::new(ManualClock::new(1_000_000));
            (m.clone(), Some(m))
        } else {
            (Arc::new(SystemClock), None)
        };
        let mut env = Env { store, oracle, clock, manual, registry: Arc::new(registry), me: None };
        env.me = Some(env.client().await);
        env
    }

    async fn mem(registry: Registry) -> Env {
        Env::new(Arc::new(MemStore::new(perc_notify::schema())), registry, true).await
    }

    async fn client(&self) -> Client {
        client_for(
            self.store.clone(),
            self.oracle.clone(),
            self.clock.clone(),
            TxnConfig::default(),
            self.registry.clone(),
        )
        .await
        .unwrap()
    }

    async fn engine(&self, config: NotifyConfig) -> Engine {
        Engine::new(self.client().await, self.registry.clone(), config)
    }

    /// An engine with its workers started on this runtime.
    async fn workers(&self, config: NotifyConfig) -> (Arc<Engine>, Workers) {
        let engine = Arc::new(self.engine(config).await);
        let workers = Workers::start(engine.clone(), &tokio::runtime::Handle::current());
        (engine, workers)
    }

    fn me(&self) -> &Client {
        self.me.as_ref().expect("set up in new")
    }

    async fn write(&self, row: &str, column: &str, value: &str) -> Ts {
        let mut t = self.me().begin().await.unwrap();
        t.set(row.to_string(), column.to_string(), value.to_string());
        t.commit().await.unwrap().unwrap()
    }

    async fn read(&self, row: &str, column: &str) -> Option<String> {
        let t = self.me().begin().await.unwrap();
        t.get(row.as_bytes(), column.as_bytes())
            .await
            .unwrap()
            .map(|v| String::from_utf8(v.to_vec()).unwrap())
    }

    async fn notify_cells(&self) -> usize {
        let scan = Scan::whole("notify", usize::MAX);
        self.store.scan(&scan).await.unwrap().len()
    }
}

fn text(v: Option<Bytes>) -> String {
    v.map(|v| String::from_utf8(v.to_vec()).unwrap()).unwrap_or_default()
}

/// Appends its tag to the watched column's value and writes it to the next column.
struct Stage {
    tag: &'static str,
    to: &'static str,
    runs: AtomicU64,
}

#[async_trait]
impl Observer for Stage {
    async fn observe(
        &self,
        txn: &mut Transaction,
        row: &Bytes,
        column: &Bytes,
    ) -> Result<(), ObserverError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        let v = text(txn.get(row, column).await?);
        txn.set(row.clone(), self.to, format!("{v}|{}", self.tag));
        Ok(())
    }
}

fn stage(tag: &'static str, to: &'static str) -> Arc<Stage> {
    Arc::new(Stage { tag, to, runs: AtomicU64::new(0) })
}

/// Counts its runs, records the value it saw, and increments an "effect" counter column in
/// its own transaction, so a double commit would show.
struct Effect {
    runs: AtomicU64,
}

#[async_trait]
impl Observer for Effect {
    async fn observe(
        &self,
        txn: &mut Transaction,
        row: &Bytes,
        column: &Bytes,
    ) -> Result<(), ObserverError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        let seen = text(txn.get(row, column).await?);
        let n: u64 = text(txn.get(row, b"effect").await?).parse().unwrap_or(0);
        txn.set(row.clone(), "seen", seen);
        txn.set(row.clone(), "effect", (n + 1).to_string());
        Ok(())
    }
}

fn effect() -> Arc<Effect> {
    Arc::new(Effect { runs: AtomicU64::new(0) })
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

#[test]
fn chain_of_three_observers_reaches_final_state() {
    rt().block_on(async {
        let (a, b, c) = (stage("A", "b"), stage("B", "c"), stage("C", "d"));
        let mut reg = Registry::new();
        reg.register("A", "a", NotifyKind::Strong, a.clone()).unwrap();
        reg.register("B", "b", NotifyKind::Strong, b.clone()).unwrap();
        reg.register("C", "c", NotifyKind::Strong, c.clone()).unwrap();
        let env = Env::mem(reg).await;
        for i in 0..5 {
            env.write(&format!("row{i}"), "a", &format!("x{i}")).await;
        }
        let engine = env.engine(NotifyConfig::default()).await;
        // One step runs A on every row; its writes fire B, and so on: three steps, then quiet.
        for expect in [5, 5, 5, 0] {
            assert_eq!(engine.step().await.unwrap().ran, expect);
        }
        for i in 0..5 {
            assert_eq!(env.read(&format!("row{i}"), "d").await.unwrap(), format!("x{i}|A|B|C"));
        }
        assert_eq!(
            [
                a.runs.load(Ordering::SeqCst),
                b.runs.load(Ordering::SeqCst),
                c.runs.load(Ordering::SeqCst)
            ],
            [5, 5, 5]
        );
        assert_eq!(env.notify_cells().await, 0);
        let stats = engine.stats();
        assert_eq!(stats.iter().map(|s| s.commits).sum::<u64>(), 15);
        // A change at the head runs the chain again, on that row only.
        env.write("row2", "a", "y").await;
        let total = engine.run_until_quiet().await.unwrap();
        assert_eq!(total.ran, 3);
        assert_eq!(env.read("row2", "d").await.unwrap(), "y|A|B|C");
    });
}

#[test]
fn writes_collapse_and_a_late_write_runs_again() {
    rt().block_on(async {
        let obs = effect();
        let mut reg = Registry::new();
        reg.register("E", "v", NotifyKind::Strong, obs.clone()).unwrap();
        let env = Env::mem(reg).await;
        const K: usize = 10;
        for i in 0..K {
            env.write("r", "v", &format!("v{i}")).await;
        }
        // One notify cell per pending notification, however many writes: a newer one
        // replaces the older (the run clears what it saw, and only the newest counts).
        assert_eq!(env.notify_cells().await, 1);
        let engine = env.engine(NotifyConfig::default()).await;
        let report = engine.step().await.unwrap();
        assert_eq!(report.ran, 1, "K writes collapse into one run");
        assert_eq!(
            env.read("r", "seen").await.unwrap(),
            format!("v{}", K - 1),
            "the run saw the last value"
        );
        assert_eq!(env.notify_cells().await, 0);

        // A write that commits after the run's start_ts: the run does not see it, and it
        // triggers one more run.
        struct LateWriter {
            env_client: Client,
            done: AtomicU64,
        }
        #[async_trait]
        impl Observer for LateWriter {
            async fn observe(
                &self,
                txn: &mut Transaction,
                row: &Bytes,
                column: &Bytes,
            ) -> Result<(), ObserverError> {
                let seen = text(txn.get(row, column).await?);
                txn.set(row.clone(), "seen", seen);
                if self.done.fetch_add(1, Ordering::SeqCst) == 0 {
                    let mut late = self.env_client.begin().await?;
                    late.set(row.clone(), column.clone(), "late");
                    late.commit().await?;
                }
                Ok(())
            }
        }
        let mut reg = Registry::new();
        let env2 = Env::mem(Registry::new()).await;
        let writer_client = client_for(
            env2.store.clone(),
            env2.oracle.clone(),
            env2.clock.clone(),
            TxnConfig::default(),
            {
                let mut r = Registry::new();
                r.register("L", "v", NotifyKind::Strong, effect()).unwrap();
                Arc::new(r)
            },
        )
        .await
        .unwrap();
        let late = Arc::new(LateWriter { env_client: writer_client, done: AtomicU64::new(0) });
        reg.register("L", "v", NotifyKind::Strong, late.clone()).unwrap();
        let env2 = Env { registry: Arc::new(reg), me: None, ..env2 };
        let env2 = Env { me: Some(env2.client().await), ..env2 };
        env2.write("r", "v", "first").await;
        let engine = env2.engine(NotifyConfig::default()).await;
        assert_eq!(engine.step().await.unwrap().ran, 1);
        assert_eq!(env2.read("r", "seen").await.unwrap(), "first");
        assert_eq!(
            env2.notify_cells().await,
            1,
            "the late write's notification survived the clear"
        );
        assert_eq!(engine.step().await.unwrap().ran, 1, "one more run");
        assert_eq!(env2.read("r", "seen").await.unwrap(), "late");
        assert_eq!(engine.step().await.unwrap().ran, 0);
        assert_eq!(late.done.load(Ordering::SeqCst), 2);
    });
}

/// Two engines (separate clients, separate leases: nothing coordinates them but the store)
/// race over the same notifications; every notification's effect commits exactly once.
#[test]
fn racing_workers_commit_each_effect_exactly_once() {
    rt().block_on(async {
        let obs = effect();
        let mut reg = Registry::new();
        reg.register("E", "v", NotifyKind::Strong, obs.clone()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(
            SledStore::open(dir.path(), perc_notify::schema(), &SledOptions::default()).unwrap(),
        );
        let env = Env::new(store, reg, false).await;
        const ROWS: usize = 60;
        for i in 0..ROWS {
            env.write(&format!("row{i:03}"), "v", "x").await;
        }
        let config = NotifyConfig { conflict_retries: 50, ..NotifyConfig::default() };
        let e1 = Arc::new(env.engine(config.clone()).await);
        let e2 = Arc::new(env.engine(config).await);
        let (r1, r2) = tokio::join!(
            tokio::spawn({
                let e = e1.clone();
                async move { e.run_until_quiet().await.unwrap() }
            }),
            tokio::spawn({
                let e = e2.clone();
                async move { e.run_until_quiet().await.unwrap() }
            })
        );
        let (r1, r2) = (r1.unwrap(), r2.unwrap());
        assert_eq!(r1.ran + r2.ran, ROWS, "{r1:?} {r2:?}");
        for i in 0..ROWS {
            assert_eq!(env.read(&format!("row{i:03}"), "effect").await.unwrap(), "1", "row {i}");
        }
        assert_eq!(env.notify_cells().await, 0);
    });
}

#[test]
fn a_crashed_observer_run_reruns_before_the_commit_point_only() {
    rt().block_on(async {
        for step in CommitStep::ALL {
            let obs = effect();
            let mut reg = Registry::new();
            reg.register("E", "v", NotifyKind::Strong, obs.clone()).unwrap();
            let env = Env::mem(reg).await;
            let ts = env.write("r", "v", "x").await;
            let crashing = env.engine(NotifyConfig::default()).await;
            let p = Pending { row: Bytes::from_static(b"r"), column: Bytes::from_static(b"v"), ts };
            assert!(crashing.process_crashing_at(&p, step).await.unwrap());
            crashing.client().deregister().await.unwrap();
            assert_eq!(
                env.notify_cells().await,
                1,
                "{step:?}: a crashed run leaves its notification"
            );

            let engine = env.engine(NotifyConfig::default()).await;
            let report = engine.run_until_quiet().await.unwrap();
            let before = matches!(
                step,
                CommitStep::AfterPrewritePrimary
                    | CommitStep::AfterPrewriteAll
                    | CommitStep::BeforeCommitPrimary
            );
            assert_eq!(report.ran, usize::from(before), "{step:?}: {report:?}");
            assert_eq!(report.skipped, usize::from(!before), "{step:?}: {report:?}");
            assert_eq!(env.read("r", "effect").await.unwrap(), "1", "{step:?}: exactly one effect");
            assert_eq!(env.notify_cells().await, 0);
        }
    });
}

#[test]
fn a_rolled_back_writer_never_runs_an_observer() {
    rt().block_on(async {
        let obs = effect();
        let mut reg = Registry::new();
        reg.register("E", "v", NotifyKind::Strong, obs.clone()).unwrap();
        let env = Env::mem(reg).await;
        let writer = env.client().await;
        let mut t = writer.begin().await.unwrap();
        t.set("r", "v", "uncommitted");
        // Notify cell set, primary never committed; the writer dies.
        t.commit_crashing_at(CommitStep::BeforeCommitPrimary).await.unwrap();
        writer.deregister().await.unwrap();
        assert_eq!(env.notify_cells().await, 1);
        let engine = env.engine(NotifyConfig::default()).await;
        let report = engine.run_until_quiet().await.unwrap();
        assert_eq!(report.ran, 0);
        assert_eq!(report.skipped, 1);
        assert_eq!(obs.runs.load(Ordering::SeqCst), 0, "the observer never saw uncommitted data");
        assert_eq!(env.read("r", "v").await, None);
        assert_eq!(env.notify_cells().await, 0);
    });
}

#[test]
fn a_writer_that_dies_after_its_commit_point_still_notifies() {
    rt().block_on(async {
        for step in [CommitStep::AfterCommitPrimary, CommitStep::MidSecondaries] {
            let obs = effect();
            let mut reg = Registry::new();
            reg.register("E", "v", NotifyKind::Strong, obs.clone()).unwrap();
            let env = Env::mem(reg).await;
            let writer = env.client().await;
            let mut t = writer.begin().await.unwrap();
            t.set("r", "v", "committed");
            t.set("s", "v", "committed too");
            t.commit_crashing_at(step).await.unwrap();
            writer.deregister().await.unwrap();
            let engine = env.engine(NotifyConfig::default()).await;
            let report = engine.run_until_quiet().await.unwrap();
            assert_eq!(report.ran, 2, "{step:?}: {report:?}");
            assert_eq!(env.read("r", "seen").await.unwrap(), "committed");
            assert_eq!(env.read("s", "seen").await.unwrap(), "committed too");
        }
    });
}

/// Sums shard rows into a total: the hot row is only ever notified weakly.
struct Summer {
    shards: usize,
}

#[async_trait]
impl Observer for Summer {
    async fn observe(
        &self,
        txn: &mut Transaction,
        row: &Bytes,
        _column: &Bytes,
    ) -> Result<(), ObserverError> {
        let keys: Vec<(Bytes, Bytes)> = (0..self.shards)
            .map(|i| (Bytes::from(format!("shard{i}")), Bytes::from_static(b"n")))
            .collect();
        let total: u64 = txn
            .get_many(&keys)
            .await?
            .into_iter()
            .map(|v| text(v).parse::<u64>().unwrap_or(0))
            .sum();
        txn.set(row.clone(), "total", total.to_string());
        Ok(())
    }
}

#[test]
fn weak_notifications_on_a_hot_row_cause_no_conflicts() {
    rt().block_on(async {
        const WRITERS: usize = 8;
        const EACH: u64 = 25;
        let mut reg = Registry::new();
        reg.register("sum", "dirty", NotifyKind::Weak, Arc::new(Summer { shards: WRITERS }))
            .unwrap();
        let env = Arc::new(Env::mem(reg).await);
        let conflicts = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for w in 0..WRITERS {
            let (env, conflicts) = (env.clone(), conflicts.clone());
            tasks.push(tokio::spawn(async move {
                let client = env.client().await;
                for k in 1..=EACH {
                    let mut t = client.begin().await.unwrap();
                    t.set(format!("shard{w}"), "n", k.to_string());
                    t.notify("counter", "dirty");
                    if t.commit().await.is_err() {
                        conflicts.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(
            conflicts.load(Ordering::SeqCst),
            0,
            "notifying the hot row conflicts with nothing"
        );
        let engine = env.engine(NotifyConfig::default()).await;
        let report = engine.run_until_quiet().await.unwrap();
        assert_eq!(report.ran, 1, "every weak notification collapsed into one run");
        assert_eq!(
            env.read("counter", "total").await.unwrap(),
            (WRITERS as u64 * EACH).to_string()
        );
    });
}

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

#[test]
fn notification_without_observer_is_cleared() {
    rt().block_on(async {
        let env = Env::mem(Registry::new()).await;
        let client = env.client().await;
        let mut t = client.begin().await.unwrap();
        t.notify("r", "nobody");
        t.commit().await.unwrap();
        assert_eq!(env.notify_cells().await, 1);
        let engine = env.engine(NotifyConfig::default()).await;
        let p = engine.scan(&Bytes::new(), 10).await.unwrap().0.remove(0);
        assert_eq!(engine.process(&p).await.unwrap(), RunOutcome::NoObserver);
        assert_eq!(env.notify_cells().await, 0);
    });
}

/// Writes `seen` on its row and on row `other` when the watched value is "go"; otherwise
/// reads it and writes nothing.
struct WritesOnGo;

#[async_trait]
impl Observer for WritesOnGo {
    async fn observe(
        &self,
        txn: &mut Transaction,
        row: &Bytes,
        column: &Bytes,
    ) -> Result<(), ObserverError> {
        if text(txn.get(row, column).await?) == "go" {
            txn.set(row.clone(), "seen", "yes");
            txn.set("other", "seen", "yes");
        }
        Ok(())
    }
}

#[test]
fn settled_notifications_are_cleared_together() {
    rt().block_on(async {
        let mut reg = Registry::new();
        reg.register("G", "v", NotifyKind::Strong, Arc::new(WritesOnGo)).unwrap();
        reg.register("S", "u", NotifyKind::Strong, stage("S", "w")).unwrap();
        let counted = Arc::new(perc_store::Counted::new(MemStore::new(perc_notify::schema())));
        let env = Env::new(counted.clone(), reg, false).await;
        const ROWS: usize = 40;
        for i in 0..ROWS {
            env.write(&format!("r{i:02}"), "v", "wait").await;
        }
        // A step runs them all, idle, and clears them in one call, not one each.
        let engine = env.engine(NotifyConfig { scan_batch: 1000, ..NotifyConfig::default() }).await;
        let before = counted.counts();
        let report = engine.step().await.unwrap();
        let after = counted.counts();
        assert_eq!(report.ran, ROWS);
        assert_eq!(after.check_and_mutate - before.check_and_mutate, 0);
        assert_eq!(after.mutate_rows - before.mutate_rows, 1);
        assert_eq!(env.notify_cells().await, 0);

        // Runs that commit one row each: their prewrites and commits, and one call for all
        // their clears (none after a commit point).
        for i in 0..ROWS {
            env.write(&format!("r{i:02}"), "u", "x").await;
        }
        let before = counted.counts();
        assert_eq!(engine.step().await.unwrap().ran, ROWS);
        let after = counted.counts();
        // (and the oracle's reservations of timestamp blocks, one per 64 timestamps)
        let conditional = after.check_and_mutate - before.check_and_mutate;
        assert!((2 * ROWS as u64..=2 * ROWS as u64 + 2).contains(&conditional), "{conditional}");
        assert_eq!(after.mutate_rows - before.mutate_rows, 1);
        assert_eq!(env.notify_cells().await, 0);
        assert_eq!(env.read("r07", "w").await.as_deref(), Some("x|S"));

        // Under the workers as well; quiescence means their clears are done.
        for i in 0..ROWS {
            env.write(&format!("r{i:02}"), "v", "still waiting").await;
        }
        let config = NotifyConfig { concurrency: 4, idle_ms: 5, ..NotifyConfig::default() };
        let engine = Arc::new(env.engine(config).await);
        let before = counted.counts();
        let workers = Workers::start(engine.clone(), &tokio::runtime::Handle::current());
        workers.wait().await.unwrap();
        let after = counted.counts();
        assert_eq!(engine.stats()[0].idle, ROWS as u64);
        assert_eq!(env.notify_cells().await, 0);
        assert!(
            after.mutate_rows - before.mutate_rows < ROWS as u64 / 2,
            "{} batched calls for {ROWS} idle runs",
            after.mutate_rows - before.mutate_rows
        );
        workers.shutdown().await;
    });
}

/// Holds the first batch of notify-cell deletes after it is armed: says so, and waits for
/// the test to open the gate.
struct HoldsClears {
    armed: std::sync::atomic::AtomicBool,
    entered: tokio::sync::Semaphore,
    gate: tokio::sync::Semaphore,
}

#[async_trait]
impl Hook for HoldsClears {
    async fn before(&self, call: Call<'_>) {
        let Call::MutateRows(rows) = call else { return };
        let clears = rows.iter().flat_map(|r| &r.mutations).any(|m| {
            matches!(m, perc_store::Mutation::Delete { column, .. } if column.family == "notify")
        });
        if clears && self.armed.swap(false, Ordering::SeqCst) {
            self.entered.add_permits(1);
            self.gate.acquire().await.unwrap().forget();
        }
    }
}

/// A flush of the deferred clears that finds them taken by another flush waits for that
/// one's delete: a quiescence check then never sees a settled notification still there
/// (it used to, and waited `idle_ms` for a run that never came).
#[test]
fn a_flush_waits_for_the_clears_another_flush_is_making() {
    rt().block_on(async {
        let mut reg = Registry::new();
        reg.register("G", "v", NotifyKind::Strong, Arc::new(WritesOnGo)).unwrap();
        let holds = HoldsClears {
            armed: std::sync::atomic::AtomicBool::new(false),
            entered: tokio::sync::Semaphore::new(0),
            gate: tokio::sync::Semaphore::new(0),
        };
        let store = Arc::new(Hooked::new(MemStore::new(perc_notify::schema()), holds));
        let holds = store.hook();
        let env = Env::new(store.clone(), reg, false).await;
        env.write("r", "v", "wait").await;
        let engine = Arc::new(env.engine(NotifyConfig::default()).await);
        holds.armed.store(true, Ordering::SeqCst);
        // The step runs the notification (idle) and flushes its clear: held at the store.
        let step = tokio::spawn({
            let engine = engine.clone();
            async move { engine.step().await.unwrap().ran }
        });
        holds.entered.acquire().await.unwrap().forget();
        let mut check = tokio::spawn({
            let engine = engine.clone();
            async move { engine.has_pending().await.unwrap() }
        });
        let early = tokio::time::timeout(std::time::Duration::from_millis(200), &mut check).await;
        assert!(early.is_err(), "the check returned {early:?} while the clear was being made");
        holds.gate.add_permits(1);
        assert_eq!(step.await.unwrap(), 1);
        assert!(!check.await.unwrap(), "the settled notification was still pending");
    });
}

#[test]
fn a_run_that_writes_nothing_commits_nothing_and_a_commit_clears_its_notification() {
    rt().block_on(async {
        let mut reg = Registry::new();
        reg.register("G", "v", NotifyKind::Strong, Arc::new(WritesOnGo)).unwrap();
        let counted = Arc::new(perc_store::Counted::new(MemStore::new(perc_notify::schema())));
        let env = Env::new(counted.clone(), reg, true).await;
        let engine = env.engine(NotifyConfig::default()).await;
        let ack = "perc.ack:G";

        // Nothing to write: the notification goes, with no transaction (not even the ack),
        // so no conditional mutation and one batched call (the clear).
        env.write("r", "v", "wait").await;
        let p = engine.scan(&Bytes::new(), 10).await.unwrap().0.remove(0);
        let before = counted.counts();
        assert_eq!(engine.process(&p).await.unwrap(), RunOutcome::Ran);
        let after = counted.counts();
        assert_eq!(after.check_and_mutate - before.check_and_mutate, 0);
        assert_eq!(after.mutate_rows - before.mutate_rows, 1);
        assert_eq!(env.notify_cells().await, 0);
        assert_eq!(env.read("r", ack).await, None);
        let stats = engine.stats();
        assert_eq!((stats[0].runs, stats[0].idle, stats[0].commits), (1, 1, 0));
        // The run's start stands in for the ack it did not write: the same notification
        // seen again (another scanner's copy) is cleared without a run.
        assert_eq!(engine.process(&p).await.unwrap(), RunOutcome::Skipped);
        assert_eq!(engine.stats()[0].runs, 1);

        // A run with writes commits (the prewrites of its two rows, the primary's commit)
        // and clears its notification in the call that commits the secondary: one batched
        // call in all.
        env.write("r", "v", "go").await;
        let p = engine.scan(&Bytes::new(), 10).await.unwrap().0.remove(0);
        let before = counted.counts();
        assert_eq!(engine.process(&p).await.unwrap(), RunOutcome::Ran);
        let after = counted.counts();
        assert_eq!(after.check_and_mutate - before.check_and_mutate, 3);
        assert_eq!(after.mutate_rows - before.mutate_rows, 1);
        assert_eq!(env.read("other", "seen").await.as_deref(), Some("yes"));
        assert_eq!(env.notify_cells().await, 0);
        assert_eq!(env.read("r", "seen").await.as_deref(), Some("yes"));
        assert!(env.read("r", ack).await.is_some());
        let stats = engine.stats();
        assert_eq!((stats[0].runs, stats[0].idle, stats[0].commits), (2, 1, 1));
    });
}

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
        let obs = effect();
        let mut reg = Registry::new();
        reg.register("E", "v", NotifyKind::Strong, obs.clone()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(
            SledStore::open(dir.path(), perc_notify::schema(), &SledOptions::default()).unwrap(),
        );
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

/// The same chain, run by background scanners and workers, and `wait` for quiescence.
#[test]
fn workers_run_the_chain_to_quiescence() {
    let rt = rt();
    rt.block_on(async {
        let mut reg = Registry::new();
        reg.register("A", "a", NotifyKind::Strong, stage("A", "b")).unwrap();
        reg.register("B", "b", NotifyKind::Strong, stage("B", "c")).unwrap();
        reg.register("C", "c", NotifyKind::Strong, stage("C", "d")).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(
            SledStore::open(dir.path(), perc_notify::schema(), &SledOptions::default()).unwrap(),
        );
        let env = Env::new(store, reg, false).await;
        const ROWS: usize = 200;
        for i in 0..ROWS {
            env.write(&format!("row{i:04}"), "a", &format!("x{i}")).await;
        }
        let config = NotifyConfig {
            scanners: 3,
            concurrency: 8,
            scan_batch: 16,
            idle_ms: 5,
            gc_interval_ms: 0,
            ..NotifyConfig::default()
        };
        let (engine, workers) = env.workers(config).await;
        workers.wait().await.unwrap();
        for i in 0..ROWS {
            assert_eq!(env.read(&format!("row{i:04}"), "d").await.unwrap(), format!("x{i}|A|B|C"));
        }
        assert!(!engine.has_pending().await.unwrap());
        // More work after quiescence is picked up again, at once: a kick ends the idle
        // scanners' backoff (`idle_max_ms`, a second by default).
        env.write("row0007", "a", "again").await;
        workers.kick();
        workers.wait().await.unwrap();
        assert_eq!(env.read("row0007", "d").await.unwrap(), "again|A|B|C");
        let commits: u64 = engine.stats().iter().map(|s| s.commits).sum();
        assert_eq!(commits, ROWS as u64 * 3 + 3);
        workers.shutdown().await;
    });
}

#[test]
fn idle_scanners_back_off() {
    let rt = rt();
    rt.block_on(async {
        let mut reg = Registry::new();
        reg.register("A", "a", NotifyKind::Strong, stage("A", "b")).unwrap();
        let counted = Arc::new(perc_store::Counted::new(MemStore::new(perc_notify::schema())));
        let store: Arc<dyn Store> = counted.clone();
        let env = Env::new(store, reg, false).await;
        let config = NotifyConfig {
            scanners: 2,
            idle_ms: 1,
            idle_max_ms: 16,
            gc_interval_ms: 0,
            ..NotifyConfig::default()
        };
        let (_engine, workers) = env.workers(config).await;
        workers.wait().await.unwrap();
        // Half a second with nothing to do. A scanner's looks are at least its pause apart
        // (nothing wakes it), so after the ramp (1, 2, 4, 8 ms) it looks at most once every
        // 16 ms; without the backoff it would look every millisecond. (Real time: a manual
        // clock is moved by every task's pauses, the heartbeat's too, which hides the rate.)
        let notify_scans = || counted.scans_of(perc_txn::actions::NOTIFY.name);
        let (scans_before, start) = (notify_scans(), std::time::Instant::now());
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        let scans = notify_scans() - scans_before;
        let ms = start.elapsed().as_millis() as u64;
        assert!(scans <= 2 * (ms / 16 + 6), "{scans} scans by two idle scanners in {ms} ms");
        assert!(scans >= 2, "the idle scanners stopped looking");
        workers.shutdown().await;
    });
}

/// Copies `v` to `w`; on a gated row, first waits for the test to open the gate. Each run
/// says when it starts.
struct Gated {
    gates: std::collections::HashMap<&'static str, Arc<tokio::sync::Semaphore>>,
    started: Arc<tokio::sync::Semaphore>,
}

#[async_trait]
impl Observer for Gated {
    async fn observe(
        &self,
        txn: &mut Transaction,
        row: &Bytes,
        column: &Bytes,
    ) -> Result<(), ObserverError> {
        self.started.add_permits(1);
        let name = std::str::from_utf8(row).unwrap();
        if let Some(gate) = self.gates.get(name) {
            gate.acquire().await.unwrap().forget();
        }
        let v = text(txn.get(row, column).await?);
        txn.set(row.clone(), "w", v);
        Ok(())
    }
}

/// While runs are in flight and nothing else happens, the scanners do not read the notify
/// family again and again (they did: ~700 reads an update of one page at 1k pages, finding
/// the same runs in flight). What they skip is not lost: a notification renewed while its run
/// was in flight runs again when that run ends, and notifications that runs commit are read
/// at once, not after `idle_ms` (a minute here, which the test's bound would not wait for).
#[test]
fn scanners_wait_for_news_while_runs_are_in_flight_and_lose_nothing() {
    let rt = rt();
    rt.block_on(async {
        let gate = |_| Arc::new(tokio::sync::Semaphore::new(0));
        let (gate_a, gate_b) = (gate(()), gate(()));
        let started = Arc::new(tokio::sync::Semaphore::new(0));
        let gated = Arc::new(Gated {
            gates: [("a", gate_a.clone()), ("b", gate_b.clone())].into_iter().collect(),
            started: started.clone(),
        });
        let mut reg = Registry::new();
        reg.register("G", "v", NotifyKind::Strong, gated).unwrap();
        // A chain behind an ungated row: its notifications come from runs' commits.
        reg.register("A", "a", NotifyKind::Strong, stage("A", "b")).unwrap();
        reg.register("B", "b", NotifyKind::Strong, stage("B", "c")).unwrap();
        let counted = Arc::new(perc_store::Counted::new(MemStore::new(perc_notify::schema())));
        let env = Env::new(counted.clone(), reg, false).await;
        let notify_scans = || counted.scans_of(perc_txn::actions::NOTIFY.name);
        env.write("a", "v", "1").await;
        env.write("b", "v", "1").await;
        let config = NotifyConfig {
            scanners: 2,
            concurrency: 4,
            idle_ms: 60_000,
            idle_max_ms: 60_000,
            gc_interval_ms: 0,
            ..NotifyConfig::default()
        };
        let (engine, workers) = env.workers(config).await;
        let bound = std::time::Duration::from_secs(20);
        tokio::time::timeout(bound, async {
            // Both gated runs in flight.
            started.acquire_many(2).await.unwrap().forget();

            // A quarter of a second in which nothing happens: at most a read or two each.
            let before = notify_scans();
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
            let scans = notify_scans() - before;
            assert!(scans <= 4, "{scans} reads of the notify family while two runs were in flight");

            // Work that runs' commits make is found at once, though b's run is in flight.
            env.write("c", "a", "x").await;
            workers.kick();
            while env.read("c", "c").await.as_deref() != Some("x|A|B") {
                tokio::task::yield_now().await;
            }

            // a's notification renewed while its run is in flight (and found so: the kick
            // makes the scanners read it again); its run ends, committing no notification,
            // while b's is still in flight: the renewed one runs anyway.
            env.write("a", "v", "2").await;
            let read_before = notify_scans();
            workers.kick();
            while notify_scans() < read_before + 1 {
                tokio::task::yield_now().await;
            }
            gate_a.add_permits(2);
            while env.read("a", "w").await.as_deref() != Some("2") {
                tokio::task::yield_now().await;
            }
            gate_b.add_permits(1);
            workers.wait().await.unwrap();
        })
        .await
        .expect("every notification ran without waiting out idle_ms");
        assert_eq!(env.read("b", "w").await.as_deref(), Some("1"));
        let runs: u64 = engine.stats().iter().map(|s| s.runs).sum();
        // G: a twice and b once; A and B once each.
        assert_eq!(runs, 5);
        workers.shutdown().await;
    });
}

/// Writes its row's `out`, moving the test's clock on by `slow_ms` during its first run.
struct SlowOnce {
    clock: std::sync::OnceLock<Arc<ManualClock>>,
    slow_ms: u64,
    runs: AtomicU64,
}

#[async_trait]
impl Observer for SlowOnce {
    async fn observe(
        &self,
        txn: &mut Transaction,
        row: &Bytes,
        column: &Bytes,
    ) -> Result<(), ObserverError> {
        if self.runs.fetch_add(1, Ordering::SeqCst) == 0 {
            self.clock.get().expect("set by the test").advance_ms(self.slow_ms);
        }
        let v = text(txn.get(row, column).await?);
        txn.set(row.clone(), "out", v);
        Ok(())
    }
}

/// A run whose store lease is running out (another process may take the notification once
/// it expires) commits nothing and leaves its notification for a later scan, whose run
/// commits it.
#[test]
fn a_run_whose_store_lease_runs_out_leaves_its_notification_uncommitted() {
    rt().block_on(async {
        // 800 ms in a 1 s lease: past the last quarter, well inside the 5 s liveness TTL.
        let slow = Arc::new(SlowOnce {
            clock: std::sync::OnceLock::new(),
            slow_ms: 800,
            runs: AtomicU64::new(0),
        });
        let mut reg = Registry::new();
        reg.register("S", "v", NotifyKind::Strong, slow.clone()).unwrap();
        let env = Env::mem(reg).await;
        let clock = env.manual.clone().expect("a manual clock");
        slow.clock.set(clock.clone()).ok();
        let client = env.client().await;
        let lease = Arc::new(perc_notify::StoreLease::new(
            env.store.clone(),
            clock,
            1_000,
            client.id(),
            client.liveness().clone(),
        ));
        let engine =
            Engine::with_lease(client, env.registry.clone(), NotifyConfig::default(), lease);
        env.write("r", "v", "x").await;
        let p = engine.scan(&Bytes::new(), 10).await.unwrap().0.remove(0);
        assert_eq!(engine.process(&p).await.unwrap(), RunOutcome::Busy);
        assert_eq!(env.read("r", "out").await, None, "nothing committed");
        assert_eq!(env.notify_cells().await, 1, "the notification waits");
        // The lease is released; a later scan's run is quick, and commits.
        let p = loop {
            let (mut found, _) = engine.scan(&Bytes::new(), 10).await.unwrap();
            let p = found.remove(0);
            match engine.process(&p).await.unwrap() {
                RunOutcome::Busy => tokio::task::yield_now().await,
                outcome => break (p, outcome),
            }
        };
        assert_eq!(p.1, RunOutcome::Ran);
        assert_eq!(env.read("r", "out").await.as_deref(), Some("x"));
        assert_eq!(slow.runs.load(Ordering::SeqCst), 2);
    });
}
