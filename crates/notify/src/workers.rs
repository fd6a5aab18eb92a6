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

use crate::engine::{Engine, Pending};
use crate::observer::NotifyKind;
use perc_store::Ts;
use perc_txn::gc;
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

/// The table of notifications being gathered keeps room for this many whatever it holds
/// (see [`forget_seen`]).
const SEEN_KEPT: usize = 256;

/// A scanner's pause after a round is at least this many times the time the round took to
/// read and dispatch (its waits for a permit left out), whatever news comes, unless the
/// workers fall idle: rereading a backlog costs a fixed share of a core however long the
/// backlog is. Without it a scanner reread the whole backlog after every commit that
/// notified: a first crawl of 5,000 seeds, every fetch dispatched and waiting its turn,
/// spent most of its CPU rereading them and fetched ~10 pages a second, against ~400 from
/// one seed.
const PAUSE_PER_READ: u64 = 4;

/// How many notifications held back for gathering one finished run pays the reread of: a
/// scanner that held back `n` waits for `n / REREAD_PER_RUN` runs to finish (or for the
/// workers to fall idle, or the first to come due) before reading them all again.
const REREAD_PER_RUN: u64 = 32;

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

/// What a scanner keeps through a round of the notify family, and from one round to the
/// next.
struct Round {
    /// Where this round began: a round that began part-way reads on from the first row when
    /// it reaches the end, before it pauses.
    from: Bytes,
    /// Whether it found any notification.
    found: bool,
    /// What the news count was when this round began: more since means read again at once.
    news_at: u64,
    /// The earliest moment a notification held back this round is due, and how many were.
    due: Option<u64>,
    held: u64,
    /// Rounds in a row that found nothing: the idle pause doubles with each.
    empty_rounds: u32,
    /// The earliest stage this round, and the last, found notifications of: work upstream
    /// of the weak notifications of later stages, which then wait longer (up to
    /// UPSTREAM_WINDOWS windows) so that they run after it (an export after the in-degree
    /// and the canonical it shows).
    upstream_now: usize,
    upstream_last: usize,
    /// When this round began (ms), and how long it has waited for permits since.
    began: u64,
    waited_ms: u64,
}

async fn scanner(shared: Arc<Shared>, me: usize) {
    let engine = shared.engine.clone();
    let config = engine.config().clone();
    let mut rng = SmallRng::seed_from_u64(config.seed.wrapping_add(me as u64));
    let mut pos = random_start(&shared, &mut rng);
    let mut round = Round {
        from: pos.clone(),
        found: false,
        news_at: shared.news(),
        due: None,
        held: 0,
        empty_rounds: 0,
        upstream_now: usize::MAX,
        upstream_last: usize::MAX,
        began: engine.client().clock().now_ms(),
        waited_ms: 0,
    };
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

/// The end of a round that read the whole notify family: pauses (idle after a round that
/// found nothing; until the first held-back notification is due; until news), then forgets
/// the notifications no longer seen and begins the next round.
async fn end_round(shared: &Shared, round: &mut Round, busy_runs: usize) {
    let config = shared.engine.config();
    let now = shared.engine.client().clock().now_ms();
    let until_due = round.due.map(|d| d.saturating_sub(now).max(1));
    round.empty_rounds = if round.found { 0 } else { round.empty_rounds.saturating_add(1) };
    let idle = idle_pause(config.idle_ms, config.idle_max_ms, round.empty_rounds);
    let pause = match (round.found, until_due) {
        (false, _) => idle,
        // Some of what was found is being gathered: look again when the first is due, or
        // earlier once enough runs finished to pay for reading it again.
        (true, Some(until_due)) => until_due,
        // All of it is running, here or elsewhere: look again when news comes.
        (true, None) => config.idle_ms,
    };
    let gathered = (round.held > 0).then_some(round.held / REREAD_PER_RUN);
    let read_ms = now.saturating_sub(round.began).saturating_sub(round.waited_ms);
    let floor = if round.found { PAUSE_PER_READ.saturating_mul(read_ms) } else { 0 };
    pause_round(shared, Pause { ms: pause, floor, busy_runs, gathered, news_at: round.news_at })
        .await;
    round.news_at = shared.news();
    round.began = shared.engine.client().clock().now_ms();
    round.waited_ms = 0;
    // Forget notifications no longer seen (another worker ran them).
    let horizon = FORGET_WINDOWS * config.gather_ms.max(1);
    forget_seen(&mut shared.first_seen.lock().unwrap_or_else(|e| e.into_inner()), now, horizon);
    round.found = false;
    round.due = None;
    round.held = 0;
    round.upstream_last = std::mem::replace(&mut round.upstream_now, usize::MAX);
}

/// When a scanner first and last saw a weak notification it holds back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Seen {
    first: u64,
    last: u64,
}

/// A notification not seen for this many gathering windows is forgotten (another worker ran
/// it). Measured from when it was last seen, not first: one held back for the
/// [`UPSTREAM_WINDOWS`] windows is seen again every round meanwhile, and forgetting it by
/// its first sighting would begin its wait again, for ever while the stages upstream stay
/// busy (under a steady recrawl an in-degree waited so, 3,500 of them at once).
const FORGET_WINDOWS: u64 = 10;

/// Forgets the notifications last seen `horizon` ms or longer before `now`, and gives back
/// the table's memory once it is mostly empty. A bulk load leaves the table sized for its
/// thousands of gathered notifications, and every round walks the whole table: left at that
/// size, the walk cost an update at 100k pages ~11 ms of CPU, against ~3 at 1k.
fn forget_seen(seen: &mut HashMap<(Bytes, Bytes), Seen>, now: u64, horizon: u64) {
    seen.retain(|_, s| now.saturating_sub(s.last) < horizon);
    if seen.capacity() > 4 * seen.len().max(SEEN_KEPT) {
        seen.shrink_to(2 * seen.len().max(SEEN_KEPT));
    }
}

/// A scanner's pause between two rounds: `ms`, or less (see [`pause_round`]).
struct Pause {
    ms: u64,
    /// Nothing but a stop or idle workers ends the pause before this many ms
    /// ([`PAUSE_PER_READ`]); it lasts at least this long.
    floor: u64,
    busy_runs: usize,
    /// When the round held notifications back for gathering, how many runs pay for
    /// rereading them.
    gathered: Option<u64>,
    /// The news count ([`Shared::news`]) when the round began.
    news_at: u64,
}

/// Waits `ms` between two rounds of a scanner, or less: until stopped, kicked, there is news
/// since `news_at` ([`Shared::news`]: notifications this round may not have found), nothing
/// runs any more, or, when the round held notifications back for gathering (`gathered` =
/// `Some(runs)`), a run finishes while fewer than `busy_runs` are in flight after at least
/// `runs` finished during the pause (the workers may be turning idle, and gathered
/// notifications then run at once). A run finishing while the workers are busy does not end
/// the pause: under load that happens hundreds of times a second; nor one of the first
/// `runs`, which pay for rereading what the last round held back (before, a round every run
/// read the backlog of weak notifications again: ~750 notify cells a page). Whatever ends
/// it, the pause lasts `floor` unless the workers fall idle or the scanner stops.
async fn pause_round(shared: &Shared, pause: Pause) {
    let Pause { ms, floor, busy_runs, gathered, news_at } = pause;
    let engine = &shared.engine;
    let clock = engine.client().clock();
    let start = clock.now_ms();
    let until = start + ms.max(floor);
    let floor_until = start + floor;
    let finished = || {
        let in_flight = engine.in_flight.load(Ordering::SeqCst);
        (engine.started.load(Ordering::SeqCst).saturating_sub(in_flight as u64), in_flight)
    };
    let (finished_before, _) = finished();
    // Something asked for a new round: it begins once the floor has passed.
    let mut asked = false;
    loop {
        let now = clock.now_ms();
        if now >= until || (asked && now >= floor_until) {
            return;
        }
        // Registered before the news is read: news that comes after the read wakes them.
        let woken = shared.wake.notified();
        let progress = engine.progress.notified();
        if shared.news() != news_at {
            asked = true;
            if now >= floor_until {
                return;
            }
        }
        let wake_at = if asked { floor_until } else { until };
        tokio::select! {
            _ = shared.stop.cancelled() => return,
            _ = woken => asked = true,
            _ = progress => {
                let (done, in_flight) = finished();
                if in_flight == 0 {
                    return;
                }
                asked |= gathered.is_some_and(|runs| {
                    in_flight < busy_runs && done.saturating_sub(finished_before) >= runs
                });
            }
            _ = clock.sleep_ms(wake_at - now) => {}
        }
    }
}

/// The pause of an idle scanner after `empty_rounds` rounds in a row that found nothing:
/// `idle_ms`, doubled with each further one, up to `idle_max_ms` (never below `idle_ms`).
fn idle_pause(idle_ms: u64, idle_max_ms: u64, empty_rounds: u32) -> u64 {
    let doubled = idle_ms.saturating_mul(1u64 << empty_rounds.saturating_sub(1).min(32));
    doubled.min(idle_max_ms.max(idle_ms))
}

/// Whether scanner `me`, having just read rows `first..=last`, is right behind another
/// scanner: one whose position lies inside that range is about to (or just did) process the
/// same notifications.
fn right_behind(me: usize, positions: &[Bytes], first: &Bytes, last: &Bytes) -> bool {
    positions.iter().enumerate().any(|(i, p)| i != me && !p.is_empty() && p > first && p <= last)
}

async fn heartbeat(shared: Arc<Shared>) {
    let client = shared.engine.client().clone();
    let every = (client.config().liveness_ttl_ms / 3).max(1);
    while !shared.stop.is_cancelled() {
        if let Err(e) = client.heartbeat().await {
            shared.engine.note(&e);
            if shared.engine.fatal().is_none() {
                tracing::warn!(error = %e, "heartbeat failed");
            }
        }
        if let Err(e) = shared.engine.note_time().await {
            tracing::debug!(error = %e, "cannot sample the time of a timestamp");
        }
        tokio::select! {
            _ = shared.stop.cancelled() => {}
            _ = client.clock().sleep_ms(every) => {}
        }
    }
}

/// The collector's share of the time: a pass starts at most every `gc_interval_ms`, and
/// waits after a pass at least this many times as long as the pass took, so that on a big
/// store (a pass over 100k pages takes half a minute) collecting never takes more than a
/// tenth of the time.
const GC_SHARE: u32 = 10;

/// The wait before the next collection pass, after one that took `took_ms`: what is left of
/// `every_ms`, but at least `(GC_SHARE - 1) × took_ms`.
fn gc_wait_ms(every_ms: u64, took_ms: u64) -> u64 {
    every_ms.saturating_sub(took_ms).max(took_ms.saturating_mul(u64::from(GC_SHARE - 1)))
}

/// Collects old versions in passes over the store. Often enough that a row rewritten every
/// few seconds (a page recrawled at a high rate) carries few old versions each time it is
/// rewritten: the versions are bytes every rewrite writes again into sled's log (at ~400
/// refetches a second the log grew 30-70 MiB a minute collected every minute, ~10 MiB a
/// minute collected every 10 s).
async fn collector(shared: Arc<Shared>) {
    let engine = shared.engine.clone();
    let every = engine.config().gc_interval_ms;
    let mut wait = every;
    while !shared.stop.is_cancelled() {
        tokio::select! {
            _ = shared.stop.cancelled() => return,
            _ = engine.client().clock().sleep_ms(wait) => {}
        }
        let clock = engine.client().clock();
        let started = clock.now_ms();
        match gc::collect(engine.client(), engine.config().scan_batch).await {
            Ok(r) => tracing::debug!(?r, "garbage collection pass"),
            Err(e) => {
                engine.note(&e);
                tracing::warn!(error = %e, "garbage collection failed");
            }
        }
        wait = gc_wait_ms(every, clock.now_ms().saturating_sub(started));
    }
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

    #[test]
    fn the_collector_takes_at_most_a_tenth_of_the_time() {
        // A quick pass: the next starts `every` after this one started.
        assert_eq!(gc_wait_ms(10_000, 300), 9_700);
        // A pass of 30 s (a big store): nine times as long before the next.
        assert_eq!(gc_wait_ms(10_000, 30_000), 270_000);
        assert_eq!(gc_wait_ms(10_000, 1_000), 9_000);
        assert_eq!(gc_wait_ms(10_000, 2_000), 18_000);
        assert_eq!(gc_wait_ms(u64::MAX, u64::MAX), u64::MAX);
    }

    #[test]
    fn the_idle_pause_doubles_up_to_its_cap() {
        let pauses: Vec<u64> = (1..=8).map(|n| idle_pause(20, 1000, n)).collect();
        assert_eq!(pauses, [20, 40, 80, 160, 320, 640, 1000, 1000]);
        assert_eq!(idle_pause(20, 1000, u32::MAX), 1000);
        // A cap below idle_ms is idle_ms.
        assert_eq!(idle_pause(50, 10, 3), 50);
    }

    #[test]
    fn forgetting_old_notifications_gives_back_the_room_a_bulk_load_took() {
        let key = |i: u32| (Bytes::from(format!("p:{i}")), Bytes::from_static(b"indeg:dirty"));
        let at = |ms: u64| Seen { first: ms, last: ms };
        let mut seen: HashMap<(Bytes, Bytes), Seen> = HashMap::new();
        // A bulk load: 100,000 seen at ms 0..1000; then 10 seen at 5000.
        for i in 0..100_000 {
            seen.insert(key(i), at(u64::from(i % 1000)));
        }
        for i in 0..10 {
            seen.insert(key(1_000_000 + i), at(5000));
        }
        // At 5,500 with a horizon of 1,000, the load's are forgotten and the last 10 kept.
        forget_seen(&mut seen, 5500, 1000);
        assert_eq!(seen.len(), 10);
        assert!((0..10).all(|i| seen.contains_key(&key(1_000_000 + i))));
        assert!(seen.capacity() <= 4 * SEEN_KEPT, "capacity {}", seen.capacity());
        // A table that is in use keeps its room: nothing to give back.
        let mut busy: HashMap<(Bytes, Bytes), Seen> =
            (0..1000).map(|i| (key(i), at(5000))).collect();
        let room = busy.capacity();
        forget_seen(&mut busy, 5500, 1000);
        assert_eq!((busy.len(), busy.capacity()), (1000, room));
    }

    /// A notification held back for the upstream windows is seen every round meanwhile: it
    /// keeps its first sighting however long it waits, so its wait ends.
    #[test]
    fn a_notification_seen_every_round_keeps_its_first_sighting() {
        let gather_ms = 500;
        let key = (Bytes::from_static(b"p:a"), Bytes::from_static(b"indeg:dirty"));
        let mut seen = HashMap::from([(key.clone(), Seen { first: 0, last: 0 })]);
        // Rounds every 300 ms through the upstream window, the key seen in each.
        let window = UPSTREAM_WINDOWS * gather_ms;
        let mut now = 0;
        while now < window {
            now += 300;
            seen.get_mut(&key).unwrap().last = now;
            forget_seen(&mut seen, now, FORGET_WINDOWS * gather_ms);
        }
        assert_eq!(seen[&key].first, 0, "its wait began again");
        // Not seen any more: forgotten after the horizon.
        forget_seen(&mut seen, now + FORGET_WINDOWS * gather_ms, FORGET_WINDOWS * gather_ms);
        assert!(seen.is_empty());
    }
}
