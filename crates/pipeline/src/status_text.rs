//! `perc status` as text: the one rendering the CLI prints and `GET /v1/status?format=text`
//! answers, so a status read through a server looks the same as one read from the store.

use std::fmt::Write as _;

use crate::Status;

/// A line into `text` (formatting into a String cannot fail).
macro_rules! line {
    ($text:expr, $($arg:tt)*) => {{
        let _ = writeln!($text, $($arg)*);
    }};
}

/// The "not pages" line: each reason with its count, most frequent first.
pub fn by_reason(not_pages: &std::collections::BTreeMap<String, usize>) -> String {
    let mut all: Vec<(&String, &usize)> = not_pages.iter().collect();
    all.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    all.iter().map(|(why, n)| format!("{n} {why}")).collect::<Vec<_>>().join(", ")
}

impl Status {
    /// What `perc status` prints (and `GET /v1/status?format=text` answers).
    pub fn to_text(&self) -> String {
        let mut text = String::new();
        let st = self;
        let r = &st.report;
        let not_pages: usize = r.not_pages.values().sum();
        line!(text, "pages indexed:                 {}", r.pages);
        line!(text, "duplicate clusters (2+ pages): {}", r.duplicate_clusters);
        line!(text, "URLs fetched or loaded:        {} ({} answered)", r.fetched, r.answered);
        if not_pages > 0 {
            line!(text, "  not pages:                   {not_pages} ({})", by_reason(&r.not_pages));
        }
        line!(text, "URLs waiting to be fetched:    {}", r.waiting);
        line!(text, "pending notifications:         {}", st.pending);
        if st.locks > 0 {
            line!(
                text,
                "open locks:                    {} (commits in flight, or left by a process that \
             died: the next reader resolves them)",
                st.locks
            );
        }
        let oracle = &st.oracle;
        match st.oracle_server.as_str() {
            "" => line!(
                text,
                "oracle:                        in this process, {} timestamps reserved",
                oracle.reserved_to
            ),
            server => line!(
                text,
                "oracle:                        {server}, epoch {}, {} timestamps reserved",
                oracle.epoch,
                oracle.reserved_to
            ),
        }
        if !st.workers.is_empty() {
            let alive = st.workers.iter().filter(|w| w.alive).count();
            line!(text, "\nprocesses on this store ({alive} alive):");
            for w in &st.workers {
                line!(
                    text,
                    "  {:<24} {:<9} {:<5} up {:>8}  heartbeat {:>8} ago  {} scanner(s)  {} lease(s)",
                    w.worker.to_string(),
                    if w.kind.is_empty() { "-" } else { &w.kind },
                    if w.alive { "alive" } else { "dead" },
                    duration(w.age_ms),
                    duration(w.heartbeat_age_ms),
                    w.scanners,
                    w.leases
                );
            }
        }
        if !st.hosts.is_empty() {
            let mut hosts: Vec<_> = st.hosts.iter().collect();
            hosts.sort_by(|a, b| b.1[0].cmp(&a.1[0]).then(a.0.cmp(b.0)));
            let shown = hosts.len().min(HOSTS_SHOWN);
            line!(text, "\nhosts crawled ({}, the {shown} most asked):", hosts.len());
            line!(text, "  {:<40} {:>9} {:>7} {:>10}", "host", "requests", "failed", "requests/s");
            for (host, [requests, failed, first, last]) in hosts.into_iter().take(HOSTS_SHOWN) {
                // The rate over the span from its first request to its last, across runs.
                let secs = last.saturating_sub(*first) as f64 / 1000.0;
                let rate = if *requests > 1 && secs > 0.0 {
                    format!("{:.1}", (requests - 1) as f64 / secs)
                } else {
                    "-".into()
                };
                line!(text, "  {host:<40} {requests:>9} {failed:>7} {rate:>10}");
            }
        }
        line!(
            text,
            "\n{:<10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>9} {:>10}",
            "observer",
            "runs",
            "commits",
            "skipped",
            "conflicts",
            "failures",
            "parked",
            "pending",
            "oldest (s)"
        );
        let mut names: std::collections::BTreeSet<&String> = st.counters.keys().collect();
        names.extend(st.pending_by_observer.keys());
        for name in names {
            let [runs, commits, skipped, conflicts, failures, parked] =
                st.counters.get(name).copied().unwrap_or_default();
            let pending = st.pending_by_observer.get(name).copied().unwrap_or(0);
            let oldest = st.oldest_pending_ms.get(name).copied().unwrap_or(0) as f64 / 1000.0;
            line!(text, "{name:<10} {runs:>9} {commits:>9} {skipped:>9} {conflicts:>9} {failures:>9} {parked:>7} {pending:>9} {oldest:>10.1}");
        }
        if !st.parked.is_empty() {
            line!(text, "\nparked notifications ({}):", st.parked.len());
            for f in &st.parked {
                line!(text, "  {} {}: {}", f.row.escape_ascii(), f.column.escape_ascii(), f.detail);
            }
        }
        text
    }
}

/// Hosts `perc status` lists, the most asked first.
const HOSTS_SHOWN: usize = 10;

/// A duration for people: 850ms, 12.3s, 4m05s, 2h10m.
fn duration(ms: u64) -> String {
    match ms {
        0..1_000 => format!("{ms}ms"),
        1_000..60_000 => format!("{:.1}s", ms as f64 / 1000.0),
        60_000..3_600_000 => format!("{}m{:02}s", ms / 60_000, ms / 1000 % 60),
        _ => format!("{}h{:02}m", ms / 3_600_000, ms / 60_000 % 60),
    }
}
