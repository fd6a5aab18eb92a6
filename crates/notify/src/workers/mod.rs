//! Scanners and workers: the framework running on its own, on a runtime handed in.
//!
//! Each scanner walks the notify family from a random start, wrapping around, and hands every
//! pending notification to a worker task; a semaphore bounds the runs in flight. What a run
//! of this process is answering is skipped, and after a round a scanner waits for news (a
//! run committed notifications, a renewed notification's run ended, a kick) or `idle_ms`,
//! rather than reading again at once the runs still in flight. Scanners
//! publish where they are, and one that finds another scanner's position inside the batch it
//! just read (right behind it, about to redo its work) jumps to a new random place: the
//! paper's fix for scanners bunching up like buses. Random starts are drawn from rows where
//! notifications were recently seen, since row keys (URLs) are not uniform bytes.
//!
//! While the workers are busy, a weak notification is held back for up to
//! [`NotifyConfig::gather_ms`](crate::NotifyConfig) after a scanner first sees it: in a bulk
//! load the runs it would trigger one by one (a page's in-degree, once per inlink as the
//! linking pages arrive) collapse into one. An idle worker runs it at once.
//!
//! Scanners of other processes are invisible here, but their leases are not: a scanner whose
//! last batch was mostly refused leases (someone else was running those very notifications)
//! jumps to a new random place too, so workers sharing a store spread out without talking.
//!
//! Beside the scanners run a heartbeat (liveness and low watermark) and, if configured, the
//! garbage collector. [`Workers::wait`] returns at quiescence: no notification pending and
//! no run in flight, cascades included.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::runtime::Handle;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

mod background;
mod pause;

use background::{collector, heartbeat};
use pause::{end_round, idle_pause, Round, Seen};

use crate::engine::{Engine, Pending};
use crate::observer::NotifyKind;
use perc_store::Ts;
use perc_txn::TxnError;

/// How many gathering windows a weak notification waits, under load, while an earlier stage
/// has work: measured on a 5000-page replay, 4 windows (2 s) let exports run before the
/// in-degrees and canonicals they show had settled (7.2-7.3 observer transactions a page),
/// 16 (8 s) did not (5.8), at the same speed.
const UPSTREAM_WINDOWS: u64 = 16;

const SAMPLE_ROWS: usize = 256;

/// The most runs that wait on the network may wait for a permit at once (each a small task);
/// the notifications past it wait in the store for a later round.
const IO_WAITING_MAX: u64 = 16_384;

struct Shared {
    engine: Arc<Engine>,
    /// Set once, by `shutdown`; every task's waits end on it (a cancellation is never missed,
    /// unlike a wake-up sent while a task was not waiting).
    stop: CancellationToken,
    wake: tokio::sync::Notify,
    permits: Arc<Semaphore>,
    /// The permits of runs that wait on the network ([`crate::Observer::waits_on_io`]), and
    /// how many such runs wait for one.
    io_permits: Arc<Semaphore>,
    io_waiting: AtomicU64,
    /// Each scanner's current position.
    positions: Mutex<Vec<Bytes>>,
    /// Rows where notifications were seen lately: the pool of random starts.
    sample: Mutex<Vec<Bytes>>,
    /// Weak notifications being gathered: when a scanner first and last saw each (ms).
    first_seen: Mutex<HashMap<(Bytes, Bytes), Seen>>,
    /// The notifications this process's runs are answering (see [`Running`]).
    running: Mutex<HashMap<(Bytes, Bytes), Running>>,
    /// Runs that ended after a scanner found their notification newer than the run's: the
    /// newer one still waits (see [`Shared::news`]).
    refound: AtomicU64,
    handle: Handle,
}

/// A notification a run of this process is answering: the newest notify cell it was
/// dispatched for, and whether a scanner has since found a newer one.
struct Running {
    ts: Ts,
    newer: bool,
}

impl Shared {
    /// Whether a run here answers the notification `key` (found with its newest cell at
    /// `ts`); if so, and `ts` is newer than the run's, it is read again when the run ends.
    fn refind(&self, key: &(Bytes, Bytes), ts: Ts) -> bool {
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        match running.get_mut(key) {
            Some(run) => {
                run.newer |= ts > run.ts;
                true
            }
            None => false,
        }
    }

    /// Notes a run about to answer `key` up to `ts`; false if one already does (another
    /// scanner dispatched it since [`Self::refind`]).
    fn start_running(&self, key: &(Bytes, Bytes), ts: Ts) -> bool {
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        match running.entry(key.clone()) {
            std::collections::hash_map::Entry::Occupied(_) => false,
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(Running { ts, newer: false });
                true
            }
        }
    }

    /// The run answering `key` ended: news, if a newer notification was found meanwhile.
    fn end_running(&self, key: &(Bytes, Bytes)) {
        let run = self.running.lock().unwrap_or_else(|e| e.into_inner()).remove(key);
        if run.is_some_and(|r| r.newer) {
            self.refound.fetch_add(1, Ordering::SeqCst);
            self.wake.notify_waiters();
        }
    }

    /// A count that grows whenever a notification may be pending that a scanner's last read
    /// did not find, or found but could not dispatch: a run here committed notifications, or
    /// a run ended whose notification was found newer while it ran. A scanner that found
    /// only work in flight reads again when it grows (or when kicked, for the loader's
    /// writes, or after `idle_ms`, for other processes'), not in a loop that finds the same
    /// runs in flight (~700 reads of the notify family an update did).
    fn news(&self) -> u64 {
        self.engine.notifying_commits.load(Ordering::SeqCst) + self.refound.load(Ordering::SeqCst)
    }

    /// Keeps a few of `batch`'s rows in the sample random starts are drawn from.
    fn sample_rows(&self, batch: &[Pending], rng: &mut SmallRng) {
        let mut sample = self.sample.lock().unwrap_or_else(|e| e.into_inner());
        for p in batch.iter().take(4) {
            if sample.len() < SAMPLE_ROWS {
                sample.push(p.row.clone());
            } else {
                let i = rng.random_range(0..SAMPLE_ROWS);
                sample[i] = p.row.clone();
            }
        }
    }

    /// Whether the weak notification `key` waits to be gathered with more: while the
    /// workers are busy, until `window` after a scanner first saw it (then `round` notes
    /// when it is due). One not held back is forgotten.
    fn held_back(
        &self,
        key: &(Bytes, Bytes),
        window: u64,
        busy_runs: usize,
        round: &mut Round,
    ) -> bool {
        let now = self.engine.client().clock().now_ms();
        let mut seen = self.first_seen.lock().unwrap_or_else(|e| e.into_inner());
        let sighting = seen.entry(key.clone()).or_insert(Seen { first: now, last: now });
        sighting.last = now;
        let first = sighting.first;
        let busy = self.engine.in_flight.load(Ordering::SeqCst) >= busy_runs;
        if busy && now < first + window {
            let at = first + window;
            round.due = Some(round.due.map_or(at, |d| d.min(at)));
            round.held += 1;
            return true;
        }
        seen.remove(key);
        false
    }
}

pub struct Workers {
    shared: Arc<Shared>,
    tasks: Vec<JoinHandle<()>>,
}

impl Workers {
    /// Starts the scanners, the heartbeat and (if `gc_interval_ms > 0`) the collector on
    /// `handle`.
    pub fn start(engine: Arc<Engine>, handle: &Handle) -> Workers {
        let config = engine.config().clone();
        // Published with the first heartbeat, below: other processes see who works.
        engine.client().set_scanners(config.scanners as u32);
        let shared = Arc::new(Shared {
            permits: Arc::new(Semaphore::new(config.concurrency.max(1))),
            io_permits: Arc::new(Semaphore::new(config.io_concurrency.max(1))),
            io_waiting: AtomicU64::new(0),
            positions: Mutex::new(vec![Bytes::new(); config.scanners]),
            sample: Mutex::new(Vec::new()),
            first_seen: Mutex::new(HashMap::new()),
            running: Mutex::new(HashMap::new()),
            refound: AtomicU64::new(0),
            stop: CancellationToken::new(),
            wake: tokio::sync::Notify::new(),
            handle: handle.clone(),
            engine,
        });
        let mut tasks = Vec::new();
        for i in 0..config.scanners {
            let shared = shared.clone();
            tasks.push(handle.spawn(async move { scanner(shared, i).await }));
        }
        let s = shared.clone();
        tasks.push(handle.spawn(async move { heartbeat(s).await }));
        if config.gc_interval_ms > 0 {
            // The collector takes the rows the workers' commits empty, as they commit.
            shared.engine.client().collect_promptly(true);
            let s = shared.clone();
            tasks.push(handle.spawn(async move { collector(s).await }));
        }
        Workers { shared, tasks }
    }

    pub fn engine(&self) -> &Arc<Engine> {
        &self.shared.engine
    }

    /// Wakes idle scanners (after writing notifications from outside the framework).
    pub fn kick(&self) {
        self.shared.wake.notify_waiters();
    }

    /// Returns once no notification is pending and no run is in flight. Notifications that
    /// keep failing count as pending until they are parked.
    pub async fn wait(&self) -> Result<(), TxnError> {
        let engine = &self.shared.engine;
        let mut quiet_looks = 0;
        loop {
            // Registered before in_flight is read: the last run's end after the read wakes it.
            let quiet = engine.quiet.notified();
            if let Some(e) = engine.fatal() {
                return Err(e);
            }
            let started = engine.started.load(Ordering::SeqCst);
            // The scan only when nothing runs: a run in flight means not quiet yet.
            if engine.in_flight.load(Ordering::SeqCst) == 0 {
                let pending = match engine.has_pending().await {
                    Ok(p) => p,
                    Err(e) => {
                        engine.note(&e);
                        return Err(e);
                    }
                };
                if !pending
                    && engine.in_flight.load(Ordering::SeqCst) == 0
                    && engine.started.load(Ordering::SeqCst) == started
                {
                    return Ok(());
                }
                // Nothing runs and something is pending: make sure a scanner looks now.
                // (Not on every progress: a woken scanner reads the notifications again, and
                // with thousands held back for gathering that read is the cost.)
                if pending {
                    self.kick();
                }
            }
            // Without progress here (a loader whose workers run elsewhere), look less often
            // the longer the wait: each look is a scan of the notify family.
            let config = engine.config();
            let pause = idle_pause(config.idle_ms, config.idle_max_ms, quiet_looks);
            tokio::select! {
                _ = quiet => quiet_looks = 0,
                _ = engine.client().clock().sleep_ms(pause) => quiet_looks += 1,
            }
        }
    }

    /// Stops every task and waits for runs in flight to finish.
    pub async fn shutdown(self) {
        self.shared.stop.cancel();
        for t in self.tasks {
            let _ = t.await;
        }
        // Runs in flight hold permits: taking them all means they are done.
        let config = self.shared.engine.config();
        let n = config.concurrency.max(1) as u32;
        let _ = self.shared.permits.acquire_many(n).await;
        let _ = self.shared.io_permits.acquire_many(config.io_concurrency.max(1) as u32).await;
        // Left uncleared, they would only run again, finding nothing.
        if let Err(e) = self.shared.engine.flush_clears().await {
            tracing::warn!(error = %e, "clearing settled notifications failed");
        }
    }
}

fn random_start(shared: &Shared, rng: &mut SmallRng) -> Bytes {
    let sample = shared.sample.lock().unwrap_or_else(|e| e.into_inner());
    if sample.is_empty() || rng.random_bool(0.1) {
        Bytes::new()
    } else {
        sample[rng.random_range(0..sample.len())].clone()
    }
}

async fn scanner(shared: Arc<Shared>, me: usize) {
    let engine = shared.engine.clone();
    let config = engine.config().clone();
    let mut rng = SmallRng::seed_from_u64(config.seed.wrapping_add(me as u64));
    let mut pos = random_start(&shared, &mut rng);
    let mut round = Round::new(pos.clone(), shared.news(), engine.client().clock().now_ms());
    let busy_runs = (config.concurrency / 2).max(1);
    // The last batch: how many runs it dispatched, and the refusal count before it.
    let mut last_dispatched = 0u64;
    let mut refused_before = engine.lease_refused.load(Ordering::Relaxed);
    while !shared.stop.is_cancelled() && engine.fatal().is_none() {
        shared.positions.lock().unwrap_or_else(|e| e.into_inner())[me] = pos.clone();
        let (batch, next) = match engine.scan(&pos, config.scan_batch).await {
            Ok(b) => b,
            Err(e) => {
                engine.note(&e);
                tracing::warn!(error = %e, "notification scan failed");
                engine.client().clock().sleep_ms(config.idle_ms).await;
                continue;
            }
        };
        if let (Some(first), Some(last)) = (batch.first(), batch.last()) {
            let behind = {
                let positions = shared.positions.lock().unwrap_or_else(|e| e.into_inner());
                right_behind(me, &positions, &first.row, &last.row)
            };
            let refused = engine.lease_refused.load(Ordering::Relaxed) - refused_before;
            let crowded = last_dispatched >= 4 && refused * 2 >= last_dispatched;
            if behind || crowded {
                last_dispatched = 0;
                pos = random_start(&shared, &mut rng);
                round.from = pos.clone();
                continue;
            }
            shared.sample_rows(&batch, &mut rng);
            round.found = true;
        }
        refused_before = engine.lease_refused.load(Ordering::Relaxed);
        last_dispatched = match dispatch(&shared, batch, &mut round, busy_runs).await {
            Some(n) => n,
            None => return,
        };
        match next {
            Some(n) => pos = n,
            None => {
                // Wrapped around. After a whole round with nothing found, idle until woken.
                pos = Bytes::new();
                if !std::mem::take(&mut round.from).is_empty() {
                    continue;
                }
                end_round(&shared, &mut round, busy_runs).await;
            }
        }
    }
}

/// Hands each notification of `batch` to a run, but those a run of this process answers,
/// those held back for gathering, and network runs past [`IO_WAITING_MAX`]: how many it
/// dispatched; `None` once the workers are stopping.
async fn dispatch(
    shared: &Arc<Shared>,
    batch: Vec<Pending>,
    round: &mut Round,
    busy_runs: usize,
) -> Option<u64> {
    let engine = &shared.engine;
    let config = engine.config();
    let mut dispatched = 0;
    for p in batch {
        let key = (p.row.clone(), p.column.clone());
        if shared.refind(&key, p.ts) {
            continue;
        }
        let reg = engine.registration(&p.column);
        let weak = reg.is_some_and(|r| r.kind == NotifyKind::Weak);
        let stage = reg.map_or(usize::MAX, |r| r.stage);
        let upstream = round.upstream_now.min(round.upstream_last);
        round.upstream_now = round.upstream_now.min(stage);
        if config.gather_ms > 0 && weak {
            let window = if upstream < stage { UPSTREAM_WINDOWS } else { 1 } * config.gather_ms;
            if shared.held_back(&key, window, busy_runs, round) {
                continue;
            }
        }
        // A run that waits on the network takes a permit of its own pool, in a task of
        // its own that waits its turn: this scanner goes on to the notifications behind
        // it rather than wait for a slow host. The pool's semaphore is first come, first
        // served, so the waiting runs go in the order the scanners found them: under a
        // backlog no fetch waits longer than the ones found before it (a scanner that
        // took whatever permit was free as it passed served the rows it reaches first
        // after each pause, and the last rows waited for ever).
        let io = reg.is_some_and(|r| r.observer.waits_on_io());
        if io && shared.io_waiting.load(Ordering::SeqCst) >= IO_WAITING_MAX {
            continue;
        }
        if !shared.start_running(&key, p.ts) {
            continue;
        }
        dispatched += 1;
        let permit = match io {
            true => {
                shared.io_waiting.fetch_add(1, Ordering::SeqCst);
                None
            }
            false => {
                let asked = engine.client().clock().now_ms();
                let permit = shared.permits.clone().acquire_owned().await;
                round.waited_ms += engine.client().clock().now_ms().saturating_sub(asked);
                match permit {
                    Ok(p) => Some(p),
                    Err(_) => {
                        shared.end_running(&key);
                        return None;
                    }
                }
            }
        };
        spawn_run(shared.clone(), p, key, io, permit);
    }
    Some(dispatched)
}

/// Runs `p` on a task of its own: with `permit`, at once; without (a run that waits on the
/// network), once it has a permit of the network pool.
fn spawn_run(
    shared: Arc<Shared>,
    p: Pending,
    key: (Bytes, Bytes),
    io: bool,
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
) {
    shared.handle.clone().spawn(async move {
        let engine = &shared.engine;
        let permit = match permit {
            Some(p) => p,
            None => {
                let turn = tokio::select! {
                    p = shared.io_permits.clone().acquire_owned() => p.ok(),
                    () = shared.stop.cancelled() => None,
                };
                shared.io_waiting.fetch_sub(1, Ordering::SeqCst);
                match turn {
                    Some(p) => p,
                    None => {
                        shared.end_running(&key);
                        return;
                    }
                }
            }
        };
        engine.begin_tracked();
        // A stop abandons a run that waits on the network (a host that takes its time): its
        // notification stays, and is run again after a restart.
        let run = engine.process_tracked(&p);
        let done = match io {
            true => tokio::select! {
                r = run => Some(r),
                () = shared.stop.cancelled() => None,
            },
            false => Some(run.await),
        };
        if let Some(Err(e)) = done {
            if engine.fatal().is_none() {
                tracing::warn!(error = %e, row = %p.row.escape_ascii(), "notification processing failed");
            }
        }
        shared.end_running(&key);
        drop(permit);
    });
}

/// Whether scanner `me`, having just read rows `first..=last`, is right behind another
/// scanner: one whose position lies inside that range is about to (or just did) process the
/// same notifications.
fn right_behind(me: usize, positions: &[Bytes], first: &Bytes, last: &Bytes) -> bool {
    positions.iter().enumerate().any(|(i, p)| i != me && !p.is_empty() && p > first && p <= last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scanner_inside_my_batch_means_i_am_right_behind_it() {
        let b = |s: &'static str| Bytes::from_static(s.as_bytes());
        let positions = [b("c"), b("m"), b("")];
        // Scanner 0 read c..=k: nobody else is in there.
        assert!(!right_behind(0, &positions, &b("c"), &b("k")));
        // Scanner 0 read c..=p: scanner 1 at m is just ahead of it.
        assert!(right_behind(0, &positions, &b("c"), &b("p")));
        // Its own position and an unplaced scanner never count.
        assert!(!right_behind(1, &positions, &b("d"), &b("m")));
        assert!(!right_behind(2, &[b(""), b("")], &b("a"), &b("z")));
    }
}
