//! A scanner's rounds: what it keeps through one, and the pause between two, which news,
//! finished runs and gathered notifications coming due cut short, down to a floor that keeps
//! rereading a backlog to a share of the scanner's time.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use bytes::Bytes;

use super::Shared;

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

/// What a scanner keeps through a round of the notify family, and from one round to the
/// next.
pub(super) struct Round {
    /// Where this round began: a round that began part-way reads on from the first row when
    /// it reaches the end, before it pauses.
    pub(super) from: Bytes,
    /// Whether it found any notification.
    pub(super) found: bool,
    /// What the news count was when this round began: more since means read again at once.
    pub(super) news_at: u64,
    /// The earliest moment a notification held back this round is due, and how many were.
    pub(super) due: Option<u64>,
    pub(super) held: u64,
    /// Rounds in a row that found nothing: the idle pause doubles with each.
    pub(super) empty_rounds: u32,
    /// The earliest stage this round, and the last, found notifications of: work upstream
    /// of the weak notifications of later stages, which then wait longer (up to
    /// UPSTREAM_WINDOWS windows) so that they run after it (an export after the in-degree
    /// and the canonical it shows).
    pub(super) upstream_now: usize,
    pub(super) upstream_last: usize,
    /// When this round began (ms), and how long it has waited for permits since.
    pub(super) began: u64,
    pub(super) waited_ms: u64,
}

impl Round {
    /// The first round of a scanner starting at `from`, now (ms).
    pub(super) fn new(from: Bytes, news_at: u64, now: u64) -> Round {
        Round {
            from,
            found: false,
            news_at,
            due: None,
            held: 0,
            empty_rounds: 0,
            upstream_now: usize::MAX,
            upstream_last: usize::MAX,
            began: now,
            waited_ms: 0,
        }
    }
}

/// The end of a round that read the whole notify family: pauses (idle after a round that
/// found nothing; until the first held-back notification is due; until news), then forgets
/// the notifications no longer seen and begins the next round.
pub(super) async fn end_round(shared: &Shared, round: &mut Round, busy_runs: usize) {
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
pub(super) struct Seen {
    pub(super) first: u64,
    pub(super) last: u64,
}

/// A notification not seen for this many gathering windows is forgotten (another worker ran
/// it). Measured from when it was last seen, not first: one held back for the
/// [`super::UPSTREAM_WINDOWS`] windows is seen again every round meanwhile, and forgetting it by
/// its first sighting would begin its wait again, for ever while the stages upstream stay
/// busy (under a steady recrawl an in-degree waited so, 3,500 of them at once).
const FORGET_WINDOWS: u64 = 10;

/// Forgets the notifications last seen `horizon` ms or longer before `now`, and gives back
/// the table's memory once it is mostly empty. A bulk load leaves the table sized for its
/// thousands of gathered notifications, and every round walks the whole table: left at that
/// size, the walk cost an update at 100k pages ~11 ms of CPU, against ~3 at 1k.
pub(super) fn forget_seen(seen: &mut HashMap<(Bytes, Bytes), Seen>, now: u64, horizon: u64) {
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
pub(super) fn idle_pause(idle_ms: u64, idle_max_ms: u64, empty_rounds: u32) -> u64 {
    let doubled = idle_ms.saturating_mul(1u64 << empty_rounds.saturating_sub(1).min(32));
    doubled.min(idle_max_ms.max(idle_ms))
}

#[cfg(test)]
mod tests {
    use super::super::UPSTREAM_WINDOWS;
    use super::*;

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
