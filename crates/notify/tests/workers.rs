//! The workers with real concurrency: scanners run a chain to quiescence, back off when
//! idle, and lose nothing while runs are in flight.

mod common;

use common::*;

/// The same chain, run by background scanners and workers, and `wait` for quiescence.
#[test]
fn workers_run_the_chain_to_quiescence() {
    let rt = rt();
    rt.block_on(async {
        let reg = chain();
        let dir = tempfile::tempdir().unwrap();
        let store = sled(dir.path());
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

/// Makes every read of the notify family take `ms` longer, and counts them: the reread of
/// a long backlog, in small.
struct SlowNotifyReads {
    ms: u64,
    reads: AtomicU64,
}

#[async_trait]
impl Hook for SlowNotifyReads {
    async fn before(&self, call: Call<'_>) {
        if matches!(call, Call::Scan(scan) if scan.family == perc_txn::actions::NOTIFY.name) {
            self.reads.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(std::time::Duration::from_millis(self.ms)).await;
        }
    }
}

/// Passes a count from row "x" to row "y" and back, one more each time, up to `last`.
struct PingPong {
    last: u64,
}

#[async_trait]
impl Observer for PingPong {
    async fn observe(
        &self,
        txn: &mut Transaction,
        row: &Bytes,
        column: &Bytes,
    ) -> Result<(), ObserverError> {
        let n: u64 = text(txn.get(row, column).await?).parse().unwrap();
        if n < self.last {
            let other = if row.as_ref() == b"x" { "y" } else { "x" };
            txn.set(other, "n", (n + 1).to_string());
        }
        Ok(())
    }
}

/// A scanner that took `d` to read the notifications pauses at least 4d before reading them
/// again, whatever news comes meanwhile, while the workers are busy: reading a backlog costs
/// at most a fifth of a scanner's time however long it is. Before, every commit that
/// notified began a new read at once: with thousands of fetches waiting their turn, a first
/// crawl of many seeds spent its CPU rereading them.
#[test]
fn a_scanner_pauses_four_times_as_long_as_it_read_while_the_workers_are_busy() {
    const READ_MS: u64 = 40;
    const STEPS: u64 = 12;
    let rt = rt();
    rt.block_on(async {
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let started = Arc::new(tokio::sync::Semaphore::new(0));
        let gated = Arc::new(Gated {
            gates: [("g", gate.clone())].into_iter().collect(),
            started: started.clone(),
        });
        let mut reg = Registry::new();
        reg.register("G", "v", NotifyKind::Strong, gated).unwrap();
        reg.register("P", "n", NotifyKind::Strong, Arc::new(PingPong { last: STEPS })).unwrap();
        let hook = SlowNotifyReads { ms: READ_MS, reads: AtomicU64::new(0) };
        let store = Arc::new(Hooked::new(MemStore::new(perc_notify::schema()), hook));
        let env = Env::new(store.clone(), reg, false).await;
        let reads = || store.hook().reads.load(Ordering::SeqCst);
        // A run that holds its worker to the end: the workers stay busy.
        env.write("g", "v", "1").await;
        let config = NotifyConfig {
            scanners: 1,
            concurrency: 4,
            idle_ms: 60_000,
            idle_max_ms: 60_000,
            gc_interval_ms: 0,
            ..NotifyConfig::default()
        };
        let (_engine, workers) = env.workers(config).await;
        started.acquire().await.unwrap().forget();

        // Each step commits the next step's notification: news at once, every time.
        let (began, reads_before) = (std::time::Instant::now(), reads());
        env.write("x", "n", "0").await;
        workers.kick();
        let last_row = if STEPS.is_multiple_of(2) { "x" } else { "y" };
        while env.read(last_row, "n").await != Some(STEPS.to_string()) {
            tokio::task::yield_now().await;
        }
        let took_ms = began.elapsed().as_millis() as u64;
        let read = reads() - reads_before;
        // A read and its pause take at least 5 x READ_MS; the first read may come right
        // away, and a round that began part-way reads twice.
        let most = took_ms / (5 * READ_MS) + 3;
        assert!(
            read <= most,
            "{read} reads of the notifications in {took_ms} ms (at most {most}): a scanner \
             read again on news without pausing"
        );
        assert!(read >= STEPS, "a step is found by a read: {read} reads for {STEPS} steps");
        gate.add_permits(1);
        workers.wait().await.unwrap();
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
