//! Notifications, driven step by step where possible: a chain of observers reaches its final
//! state, writes collapse into one run, racing runs commit once, a crash before or after a
//! commit point, weak notifications on a hot row, and the clearing of settled ones.

mod common;

use common::*;

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
        let (_, reg) = one_effect();
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
        let (_, reg) = one_effect();
        let dir = tempfile::tempdir().unwrap();
        let store = sled(dir.path());
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
            let (_, reg) = one_effect();
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
        let (obs, reg) = one_effect();
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
            let (_, reg) = one_effect();
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
        let (before, rounds_before) = (counted.counts(), counted.scans_of("notify"));
        let workers = Workers::start(engine.clone(), &tokio::runtime::Handle::current());
        workers.wait().await.unwrap();
        let (after, rounds) = (counted.counts(), counted.scans_of("notify") - rounds_before);
        assert_eq!(engine.stats()[0].idle, ROWS as u64);
        assert_eq!(env.notify_cells().await, 0);
        // How the runs fall into the scanners' rounds depends on the machine's load: at most
        // one call of clears a round (before it reads the notify family), and one at the end.
        let calls = after.mutate_rows - before.mutate_rows;
        assert!(
            calls <= rounds + 1,
            "{calls} batched calls for {ROWS} idle runs in {rounds} rounds"
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
