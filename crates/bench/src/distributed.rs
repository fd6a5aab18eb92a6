//! Distributed mode's figures: the oracle server's timestamps/s over loopback (one caller,
//! many), replay on the Cloud Bigtable emulator with 1, 2 and 3 workers sharing the table
//! (each worker its own engine, client, lease and oracle connection, as separate processes
//! have), with store calls per indexed page, and how soon a worker's work is taken over
//! when it dies in the middle of it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use perc_bigtable::{BigtableConfig, BigtableStore, Emulator};
use perc_crawl::warc::Recorded;
use perc_notify::Workers;
use perc_oracle::{ClientConfig, LocalOracle, Oracle, RemoteOracle};
use perc_pipeline::{Backend, Config, Pipeline};
use perc_store::{Call, Counted, Hook, Hooked, MemStore, Schema, Store};

use crate::table::{rate, scaled, Table};

async fn oracle_server() -> Result<String> {
    let store: Arc<dyn Store> = Arc::new(MemStore::new(Schema::new([perc_oracle::FAMILY])));
    let oracle = Arc::new(LocalOracle::open(store, 1_000_000).await?);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?.to_string();
    tokio::spawn(perc_oracle::serve(listener, oracle));
    Ok(addr)
}

async fn oracle_rates(t: &mut Table, scale: f64) -> Result<()> {
    let addr = oracle_server().await?;
    for (clients, callers) in [(1usize, 1usize), (1, 16), (1, 256), (1, 1024), (8, 128)] {
        let mut conns = Vec::new();
        for _ in 0..clients {
            conns.push(Arc::new(RemoteOracle::connect(&addr, ClientConfig::default()).await?));
        }
        let total = clients * callers;
        let per = scaled(if total == 1 { 20_000 } else { 2_000_000 }, scale) / total as u64;
        let start = Instant::now();
        let tasks: Vec<_> = (0..total)
            .map(|i| {
                let c = conns[i % clients].clone();
                tokio::spawn(async move {
                    for _ in 0..per {
                        c.next().await?;
                    }
                    Ok::<_, perc_oracle::OracleError>(())
                })
            })
            .collect();
        for task in tasks {
            task.await??;
        }
        let n = per * total as u64;
        t.add(
            format!("oracle.next() over loopback, {clients} client(s) x {callers} caller(s)"),
            rate(n, start.elapsed().as_secs_f64()),
            "timestamps/s; a client's waiting callers share one request (goal >= 2 M/s)",
        );
    }
    Ok(())
}

/// CPU seconds (user + system) process `pid` has used so far; 0 where /proc is not there.
pub(crate) fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command's closing parenthesis: utime and stime are the 12th and 13th.
    let rest = stat.rsplit(')').next().unwrap_or_default();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

async fn replay_on_emulator(t: &mut Table, scale: f64, workers: usize) -> Result<()> {
    let emulator = Emulator::start().map_err(|e| anyhow!(e))?;
    let addr = oracle_server().await?;
    let config = BigtableConfig::emulator(emulator.addr(), "bench");
    let bt: Arc<dyn Store> = Arc::new(BigtableStore::open(&config, perc_notify::schema()).await?);
    let store = Arc::new(Counted::new(bt));
    let shared: Arc<dyn Store> = store.clone();
    // Each worker is a pipeline of its own, as a `perc worker` process is, on the one table.
    let mut config = Config::defaults();
    config.store.backend = Backend::Bigtable;
    config.workers.gc_interval_ms = 0;
    let open = async || -> Result<Pipeline> {
        let oracle: Arc<dyn Oracle> =
            Arc::new(RemoteOracle::connect(&addr, ClientConfig::default()).await?);
        Ok(Pipeline::builder(config.clone()).store(shared.clone()).oracle(oracle).open().await?)
    };
    let n = scaled(500, scale) as usize;
    let web = perc_synth::Web::new(perc_synth::Spec::new(n, 7));
    let recorded: Vec<Recorded> =
        web.responses().map(|(url, response)| Recorded { url, response }).collect();
    let mut running = Vec::new();
    let mut engines = Vec::new();
    for _ in 0..workers {
        let worker = open().await?;
        running.push(Workers::start(worker.engine().clone(), &tokio::runtime::Handle::current()));
        engines.push(worker.engine().clone());
    }
    let loader = open().await?.client().clone();
    let before = store.counts();
    let cpu_before = cpu_seconds(emulator.pid());
    let start = Instant::now();
    perc_observers::load_recorded(&loader, &recorded).await?;
    running[0].wait().await?;
    let secs = start.elapsed().as_secs_f64();
    let after = store.counts();
    let emulator_cores = (cpu_seconds(emulator.pid()) - cpu_before) / secs;
    for w in running {
        w.shutdown().await;
    }
    let indexed = perc_observers::export(&loader).await?.len();
    let runs: u64 = engines.iter().flat_map(|e| e.stats()).map(|s| s.commits).sum();
    let refused: u64 = engines.iter().map(|e| e.lease_refusals()).sum();
    let calls = (after.row_ops() - before.row_ops()) as f64 / indexed as f64;
    t.add(
        format!("replay on the emulator, {n} pages, {workers} worker(s)"),
        rate(n as u64, secs),
        format!(
            "{indexed} pages indexed; {calls:.1} store calls per page ({:.1} conditional \
             mutations, {:.1} reads, {:.1} scans); {:.1} observer runs per page, {:.1} \
             leases refused per page; the emulator used {emulator_cores:.2} cores",
            (after.check_and_mutate - before.check_and_mutate) as f64 / indexed as f64,
            (after.read_row + after.read_rows - before.read_row - before.read_rows) as f64
                / indexed as f64,
            (after.scan - before.scan) as f64 / indexed as f64,
            runs as f64 / indexed as f64,
            refused as f64 / indexed as f64
        ),
    );
    Ok(())
}

/// Makes a store stop answering, for ever, once frozen: what a worker killed with SIGKILL
/// looks like to the table (no release, no deregistration, no more heartbeats).
struct Freeze(AtomicBool);

#[async_trait::async_trait]
impl Hook for Freeze {
    async fn before(&self, _call: Call<'_>) {
        if self.0.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
    }
}

/// Two workers replay on the emulator with the default liveness (5 s) and lease (30 s) TTLs;
/// one stops dead in the middle of the work. How long until the other takes over a
/// notification the dead one had leased, and until everything is indexed.
async fn takeover_on_emulator(t: &mut Table, scale: f64) -> Result<()> {
    let emulator = Emulator::start().map_err(|e| anyhow!(e))?;
    let addr = oracle_server().await?;
    let table = BigtableConfig::emulator(emulator.addr(), "takeover");
    let bt: Arc<dyn Store> = Arc::new(BigtableStore::open(&table, perc_notify::schema()).await?);
    let frozen = Arc::new(Hooked::new(bt.clone(), Freeze(AtomicBool::new(false))));
    let mut config = Config::defaults();
    config.store.backend = Backend::Bigtable;
    config.workers.gc_interval_ms = 0;
    let open = async |store: Arc<dyn Store>| -> Result<Pipeline> {
        let oracle: Arc<dyn Oracle> =
            Arc::new(RemoteOracle::connect(&addr, ClientConfig::default()).await?);
        Ok(Pipeline::builder(config.clone()).store(store).oracle(oracle).open().await?)
    };
    let n = scaled(400, scale) as usize;
    let web = perc_synth::Web::new(perc_synth::Spec::new(n, 7));
    let recorded: Vec<Recorded> =
        web.responses().map(|(url, response)| Recorded { url, response }).collect();
    let loader = open(bt.clone()).await?.client().clone();
    perc_observers::load_recorded(&loader, &recorded).await?;
    let doomed = open(frozen.clone()).await?;
    let survivor = open(bt.clone()).await?;
    let handle = tokio::runtime::Handle::current();
    // The doomed worker's tasks stay stuck on the frozen store: never shut down.
    std::mem::forget(Workers::start(doomed.engine().clone(), &handle));
    let running = Workers::start(survivor.engine().clone(), &handle);
    let commits = |p: &Pipeline| p.engine().stats().iter().map(|s| s.commits).sum::<u64>();
    let deadline = Instant::now() + Duration::from_secs(600);
    while commits(&doomed) < 50 {
        anyhow::ensure!(Instant::now() < deadline, "the doomed worker never got going");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    frozen.hook().0.store(true, Ordering::SeqCst);
    let stopped = Instant::now();
    let mut first_takeover = None;
    {
        let done = running.wait();
        tokio::pin!(done);
        loop {
            tokio::select! {
                r = &mut done => { r?; break; }
                _ = tokio::time::sleep(Duration::from_millis(5)) => {
                    if first_takeover.is_none() && survivor.engine().lease_takeovers() > 0 {
                        first_takeover = Some(stopped.elapsed().as_secs_f64());
                    }
                }
            }
        }
    }
    let all_done = stopped.elapsed().as_secs_f64();
    running.shutdown().await;
    let indexed = perc_observers::page_count(&loader).await?;
    let taken = survivor.engine().lease_takeovers();
    t.add(
        format!("a worker stops dead mid-replay of {n} pages; the other takes over"),
        match first_takeover {
            Some(s) => format!("{s:.1} s"),
            None => "no lease was held".into(),
        },
        format!(
            "to the first of {taken} leases taken over (liveness TTL {} s, lease TTL {} s; \
             goal <= liveness TTL + one scan pass); all {indexed} pages indexed {all_done:.1} \
             s after the stop",
            config.txn.liveness_ttl_ms / 1000,
            config.workers.lease_ttl_ms / 1000
        ),
    );
    Ok(())
}

pub fn run(scale: f64) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async {
        println!("# perc-bench distributed (scale {scale}; 2 worker threads; Bigtable emulator)");
        let mut t = Table::new();
        oracle_rates(&mut t, scale).await?;
        t.print("the oracle server over loopback");
        let mut t = Table::new();
        for workers in 1..=3 {
            replay_on_emulator(&mut t, scale, workers).await?;
        }
        takeover_on_emulator(&mut t, scale).await?;
        t.print("replay on the Cloud Bigtable emulator");
        Ok(())
    })
}
