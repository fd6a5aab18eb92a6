//! Running the observers: until nothing is pending (`perc crawl`, `replay`, `wait`), or
//! until stopped (`perc worker`, `perc serve`), with the progress line on a terminal and
//! the periodic report off one.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use perc_notify::{Engine, ObserverStats, Workers};
use tokio_util::sync::CancellationToken;

use crate::{Pipeline, PipelineError, Result};

/// How often a process that runs observers looks whether an error stopped them.
pub(crate) const FATAL_CHECK_EVERY: Duration = Duration::from_millis(250);

/// Pending notifications a report counts at most (each look is a scan).
pub(crate) const BACKLOG_COUNTED: usize = 100_000;

/// How often a process that waits on others says, off a terminal, what it waits for.
pub(crate) const BACKLOG_LINE_EVERY: Duration = Duration::from_secs(5);

/// A process's totals at one moment, for the periodic report.
pub(crate) struct Reported {
    at: Instant,
    runs: u64,
    conflicts: u64,
    takeovers: u64,
}

/// How long a watching process waits, with notifications pending and no worker alive,
/// before it says so.
pub(crate) const NOBODY_SAID_AFTER: Duration = Duration::from_secs(3);

/// What [`Pipeline::check_somebody_works`] remembers between looks.
#[derive(Default)]
pub(crate) struct Nobody {
    checked: Option<Instant>,
    /// Since when nobody works.
    since: Option<Instant>,
    said: bool,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct RunSummary {
    pub fetched: u64,
    pub parsed: u64,
    pub failures: u64,
    pub seconds: f64,
}

/// Awaits `work` while `beside` (a loop that never ends: progress reports) runs alongside it,
/// each polled whenever the task wakes. Awaiting a report in a select branch's body instead
/// leaves the pinned `work` unpolled for as long as the body runs; if `work` holds an async
/// lock the report waits for, or is first in its queue, neither moves again (a "futurelock":
/// `perc replay` hung so, one run in about twenty, when a report met the wait's clear of
/// settled notifications).
pub(crate) async fn alongside<T>(
    work: impl std::future::Future<Output = T>,
    beside: impl std::future::Future<Output = ()>,
) -> T {
    tokio::pin!(work);
    tokio::select! {
        out = &mut work => out,
        () = beside => work.await,
    }
}

pub(crate) fn summarize(stats: &[ObserverStats]) -> RunSummary {
    let get = |name: &str| stats.iter().find(|s| s.name == name);
    RunSummary {
        fetched: get("fetch").map_or(0, |s| s.commits),
        parsed: get("parse").map_or(0, |s| s.commits),
        failures: stats.iter().map(|s| s.failures).sum(),
        seconds: 0.0,
    }
}

impl Pipeline {
    /// Runs the workers until no notification is pending; shows progress on a terminal.
    /// When `stop` is cancelled (SIGINT, SIGTERM) it stops taking new work, lets the runs in
    /// flight finish, saves the counters and returns [`PipelineError::Interrupted`].
    pub async fn run_until_quiet(
        &self,
        what: &str,
        stop: &CancellationToken,
    ) -> Result<RunSummary> {
        // A loader whose work other processes do waits on them.
        self.run_quiet(what, self.config.workers.scanners == 0, stop).await
    }

    /// `perc wait`: joins in the work until nothing is pending, and (off a terminal) says the
    /// backlog as it waits, as a loader that only watches does.
    pub async fn wait(&self, stop: &CancellationToken) -> Result<RunSummary> {
        self.run_quiet("wait", true, stop).await
    }

    /// [`Pipeline::run_until_quiet`]; `watching`: off a terminal, print the backlog every
    /// [`BACKLOG_LINE_EVERY`]. When the ranks are deferred (a bulk load, or one killed
    /// before its end), settles them once the rest is quiet, and runs on until quiet again.
    pub(crate) async fn run_quiet(
        &self,
        what: &str,
        watching: bool,
        stop: &CancellationToken,
    ) -> Result<RunSummary> {
        let run = self.run_quiet_once(what, watching, stop).await?;
        if !self.settle_ranks().await? {
            return Ok(run);
        }
        let settled = self.run_quiet_once(what, watching, stop).await?;
        Ok(RunSummary { seconds: run.seconds + settled.seconds, ..settled })
    }

    /// Settles the ranks if they are deferred ([`perc_observers::rank::settle`]); whether it did.
    pub async fn settle_ranks(&self) -> Result<bool> {
        if !perc_observers::rank::deferred(&self.client).await? {
            return Ok(false);
        }
        let pages = perc_observers::rank::settle(&self.client).await?;
        tracing::debug!(pages, "ranks settled");
        Ok(true)
    }

    async fn run_quiet_once(
        &self,
        what: &str,
        watching: bool,
        stop: &CancellationToken,
    ) -> Result<RunSummary> {
        let started = Instant::now();
        tracing::debug!("starting the workers");
        let workers = Workers::start(self.engine.clone(), &tokio::runtime::Handle::current());
        let bar = if std::io::stderr().is_terminal() {
            let b = indicatif::ProgressBar::new_spinner();
            b.enable_steady_tick(Duration::from_millis(120));
            Some(b)
        } else {
            None
        };
        let mut nobody = Nobody::default();
        let mut last = Reported::new(&self.engine);
        let mut backlog_said = Instant::now();
        // The progress lines are written beside the wait, not in a branch of a select over
        // it: a report awaits the engine's clear lock, which the wait may hold or be queued
        // for, and a wait left unpolled meanwhile would never let it go (see [`alongside`]).
        let ticking = async {
            loop {
                tokio::time::sleep(Duration::from_millis(250)).await;
                if self.config.workers.scanners == 0 {
                    self.check_somebody_works(&mut nobody).await;
                }
                let every = self.config.workers.report_ms;
                if every > 0 && last.at.elapsed() >= Duration::from_millis(every) {
                    self.report(&mut last).await;
                }
                if let Some(b) = &bar {
                    let s = summarize(&self.engine.stats());
                    let backlog = self.backlog().await;
                    let rate = s.fetched as f64 / started.elapsed().as_secs_f64().max(0.001);
                    b.set_message(format!(
                        "{what}: {backlog}; here {} fetched, {} parsed, {rate:.1} pages/s",
                        s.fetched, s.parsed
                    ));
                } else if watching && backlog_said.elapsed() >= BACKLOG_LINE_EVERY {
                    // Off a terminal, a process waiting on others says what it waits for now
                    // and then (a closed stderr is no reason to stop).
                    backlog_said = Instant::now();
                    let backlog = self.backlog().await;
                    let _ = writeln!(std::io::stderr(), "perc {what}: {backlog}");
                }
            }
        };
        let waited = alongside(
            async {
                tokio::select! {
                    r = workers.wait() => Some(r),
                    _ = stop.cancelled() => None,
                }
            },
            ticking,
        )
        .await;
        let (interrupted, failed) = match waited {
            Some(r) => (false, r.err()),
            None => (true, None),
        };
        if let Some(b) = bar {
            b.finish_and_clear();
        }
        tracing::debug!(interrupted, "workers stopping");
        workers.shutdown().await;
        if let Some(e) = failed {
            return Err(e.into());
        }
        let summary = summarize(&self.engine.stats());
        self.save_stats().await?;
        if interrupted {
            return Err(PipelineError::Interrupted);
        }
        self.bound_search_queue(true).await;
        Ok(RunSummary { seconds: started.elapsed().as_secs_f64(), ..summary })
    }

    /// For a process that only watches (`workers.scanners = 0`): says so, once, when
    /// notifications wait and no process that runs observers has been alive for
    /// [`NOBODY_SAID_AFTER`], and again when one is.
    pub(crate) async fn check_somebody_works(&self, nobody: &mut Nobody) {
        let now = Instant::now();
        if nobody.checked.is_some_and(|at| now.duration_since(at) < Duration::from_secs(1)) {
            return;
        }
        nobody.checked = Some(now);
        let working = match self.client.liveness().workers().await {
            Ok(all) => all.iter().filter(|(w, alive)| *alive && w.about.scanners > 0).count(),
            Err(e) => {
                tracing::debug!(error = %e, "cannot read the liveness registry");
                return;
            }
        };
        if working > 0 {
            if nobody.said {
                tracing::warn!("{working} worker(s) alive now; waiting for them to finish");
            }
            *nobody = Nobody { checked: nobody.checked, ..Nobody::default() };
            return;
        }
        let since = *nobody.since.get_or_insert(now);
        if !nobody.said && now.duration_since(since) >= NOBODY_SAID_AFTER {
            let pending = self.engine.has_pending().await.unwrap_or(true);
            if pending {
                tracing::warn!(
                    "notifications are waiting, but no worker is alive on this store, and this \
                     process only watches (workers.scanners = 0): start one with `perc \
                     --config FILE worker`, or run this command without workers.scanners = 0 \
                     to do the work here"
                );
                nobody.said = true;
            }
        }
    }

    /// One pass of the collector over the whole store, as the workers make one every
    /// `workers.gc_interval_ms` (`workers.scan_batch` cells a scan): the versions no reader
    /// can need any more are removed.
    pub async fn collect(&self) -> Result<perc_txn::gc::GcReport> {
        Ok(perc_txn::gc::collect(&self.client, self.engine.config().scan_batch).await?)
    }

    /// Runs the observers until `stop` (`perc worker`), reporting every
    /// `workers.report_ms`, then saves the counters.
    ///
    /// An error that stops the engine's runs (a full disk, a store that fails) ends it too,
    /// and is returned: a process that runs no observer must not go on as if it did.
    pub async fn work(&self, stop: &CancellationToken) -> Result<()> {
        let workers = Workers::start(self.engine.clone(), &tokio::runtime::Handle::current());
        let mut last = Reported::new(&self.engine);
        let every = Duration::from_millis(self.config.workers.report_ms);
        let mut reported = Instant::now();
        let fatal = loop {
            tokio::select! {
                _ = stop.cancelled() => break None,
                _ = tokio::time::sleep(FATAL_CHECK_EVERY) => {}
            }
            if let Some(e) = self.engine.fatal() {
                break Some(e);
            }
            if !every.is_zero() && reported.elapsed() >= every {
                self.report(&mut last).await;
                reported = Instant::now();
            }
        };
        workers.shutdown().await;
        if let Some(e) = fatal {
            return Err(e.into());
        }
        self.save_stats().await
    }

    /// "N notifications pending (parse 3, export 10)", counting up to [`BACKLOG_COUNTED`].
    pub(crate) async fn backlog(&self) -> String {
        match self.engine.pending_by_observer(BACKLOG_COUNTED).await {
            Ok(by) if by.is_empty() => "no notification pending".into(),
            Ok(by) => {
                let each: Vec<String> = by.iter().map(|(name, n)| format!("{name} {n}")).collect();
                let total: usize = by.values().sum();
                format!("{total} notifications pending ({})", each.join(", "))
            }
            Err(e) => format!("pending notifications unknown ({e})"),
        }
    }

    /// Saves the counters and logs, at info, what this process did since `last`.
    pub(crate) async fn report(&self, last: &mut Reported) {
        if let Err(e) = self.save_stats().await {
            tracing::warn!(error = %e, "cannot save the observer counters");
        }
        self.bound_search_queue(false).await;
        let now = Reported::new(&self.engine);
        let secs = now.at.duration_since(last.at).as_secs_f64().max(0.001);
        let backlog = self.engine.pending_count(BACKLOG_COUNTED).await;
        let backlog = match backlog {
            Ok(n) if n >= BACKLOG_COUNTED => format!("{n}+"),
            Ok(n) => n.to_string(),
            Err(e) => format!("unknown ({e})"),
        };
        tracing::info!(
            "{:.1} runs/s ({} runs, {} conflicts, {} leases taken over from dead workers in \
             {secs:.0} s); {backlog} notifications pending",
            (now.runs - last.runs) as f64 / secs,
            now.runs - last.runs,
            now.conflicts - last.conflicts,
            now.takeovers - last.takeovers,
        );
        *last = now;
    }
}

impl Reported {
    pub(crate) fn new(engine: &Engine) -> Reported {
        let stats = engine.stats();
        Reported {
            at: Instant::now(),
            runs: stats.iter().map(|s| s.runs).sum(),
            conflicts: stats.iter().map(|s| s.conflicts).sum(),
            takeovers: engine.lease_takeovers(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_report_waiting_on_what_the_work_holds_does_not_wedge_it() {
        // The work takes a lock and keeps it until a report has begun; the report then waits
        // for the lock. Run in a select branch's body, the report would wait forever.
        let lock = tokio::sync::Mutex::new(());
        let reporting = tokio::sync::Notify::new();
        let work = async {
            let _held = lock.lock().await;
            reporting.notified().await;
            "done"
        };
        let report = async {
            loop {
                tokio::task::yield_now().await;
                reporting.notify_one();
                let _turn = lock.lock().await;
            }
        };
        let done = tokio::time::timeout(Duration::from_secs(30), alongside(work, report)).await;
        assert_eq!(done, Ok("done"), "the work was wedged by the report");
    }
}
