//! How many due URLs the recrawl asks for at each tick: a window on the notifications waiting
//! for the observers, steered by how long the oldest of them has waited.
//!
//! A count alone bounds how much waits, not how long: at 14 fetches a second, 2,000 waiting
//! fetches wait two minutes. So the window follows the age of the oldest pending notification
//! (any observer's), as a congestion window follows a round trip: below half of
//! `recrawl.pending_age_s` it grows by [`GROWTH_PER_S`] a second while the recrawl fills it;
//! from half to the whole it stays; above it the window halves (at most once a [`CUT_EVERY_MS`])
//! and the tick asks for nothing. It never passes `recrawl.pending_max`, nor falls under
//! [`WINDOW_MIN`] (the recrawl always moves). It grows slowly, and by the time that passes,
//! not by ticks, so that it cannot outgrow the age that measures it: the age of the oldest
//! notification tells what the window was one wait ago.

/// The smallest window, and where it starts.
pub const WINDOW_MIN: usize = 32;
/// How fast a window in use grows while the oldest notification is young, a second.
pub const GROWTH_PER_S: f64 = 16.0;
/// The least time between two halvings: one old notification is one signal, not one a tick.
pub const CUT_EVERY_MS: u64 = 1_000;

/// The window, between ticks.
#[derive(Debug)]
pub struct Pace {
    window: f64,
    /// Whether the last tick asked for the whole window's room: only a window in use grows
    /// (one that grew while nothing was due would let the next burst bury the observers).
    filled: bool,
    /// When the last tick was, and the last halving (ms).
    tick_ms: Option<u64>,
    cut_ms: Option<u64>,
}

impl Default for Pace {
    fn default() -> Pace {
        Pace { window: WINDOW_MIN as f64, filled: false, tick_ms: None, cut_ms: None }
    }
}

/// What a tick knows: the time, and the notifications waiting.
#[derive(Clone, Copy, Debug)]
pub struct Waiting {
    pub now_ms: u64,
    /// How many wait, and how long the oldest has.
    pub pending: usize,
    pub oldest_ms: u64,
}

impl Pace {
    /// How many notifications may wait now.
    pub fn window(&self) -> usize {
        self.window as usize
    }

    /// The room for this tick, the window moved as the module says first.
    pub fn room(&mut self, w: Waiting, age_max_ms: u64, pending_max: usize) -> usize {
        let floor = WINDOW_MIN.min(pending_max) as f64;
        let since = self.tick_ms.map_or(0, |t| w.now_ms.saturating_sub(t));
        self.tick_ms = Some(w.now_ms);
        if w.oldest_ms >= age_max_ms {
            if self.cut_ms.is_none_or(|c| w.now_ms.saturating_sub(c) >= CUT_EVERY_MS) {
                self.window /= 2.0;
                self.cut_ms = Some(w.now_ms);
            }
            self.window = self.window.max(floor);
            self.filled = false;
            return 0;
        }
        if w.oldest_ms < age_max_ms / 2 && self.filled {
            self.window += GROWTH_PER_S * since as f64 / 1000.0;
        }
        self.window = self.window.clamp(floor, pending_max as f64);
        self.window().saturating_sub(w.pending)
    }

    /// What the tick asked for, out of the `room` it had: the window was in use if it asked
    /// for all of it.
    pub fn asked(&mut self, asked: usize, room: usize) {
        self.filled = room > 0 && asked >= room;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AGE: u64 = 30_000;
    const MAX: usize = 2_000;

    fn at(now_ms: u64, pending: usize, oldest_ms: u64) -> Waiting {
        Waiting { now_ms, pending, oldest_ms }
    }

    /// A tick a second from `from` for `seconds`, each asking for all its room.
    fn filling(pace: &mut Pace, from: u64, seconds: u64, oldest_ms: u64) {
        for s in 0..seconds {
            let room = pace.room(at(from + s * 1000, 0, oldest_ms), AGE, MAX);
            pace.asked(room, room);
        }
    }

    #[test]
    fn a_window_in_use_grows_by_the_time_passed_while_the_oldest_is_young() {
        let mut pace = Pace::default();
        assert_eq!(pace.room(at(0, 0, 0), AGE, MAX), WINDOW_MIN);
        pace.asked(WINDOW_MIN, WINDOW_MIN);
        assert_eq!(pace.room(at(1_000, 0, 1_000), AGE, MAX), WINDOW_MIN + 16);
        pace.asked(WINDOW_MIN + 16, WINDOW_MIN + 16);
        // Ticks five times as often: the same growth a second.
        for i in 1..=5 {
            let room = pace.room(at(1_000 + i * 200, 10, 1_000), AGE, MAX);
            pace.asked(room, room);
        }
        assert_eq!(pace.window(), WINDOW_MIN + 32);
    }

    #[test]
    fn a_window_not_in_use_does_not_grow() {
        let mut pace = Pace::default();
        for s in 0..100 {
            let room = pace.room(at(s * 1000, 0, 0), AGE, MAX);
            pace.asked(room / 2, room);
        }
        assert_eq!(pace.window(), WINDOW_MIN);
    }

    #[test]
    fn it_stops_growing_at_half_the_age_and_halves_past_it_once_a_second() {
        let mut pace = Pace::default();
        filling(&mut pace, 0, 21, 0);
        let grown = pace.window();
        assert_eq!(grown, WINDOW_MIN + 20 * 16);
        filling(&mut pace, 21_000, 5, AGE / 2);
        assert_eq!(pace.window(), grown, "between half and the whole: it stays");
        assert_eq!(pace.room(at(26_000, 0, AGE), AGE, MAX), 0, "past the age: nothing asked");
        assert_eq!(pace.window(), grown / 2);
        assert_eq!(pace.room(at(26_200, 0, AGE), AGE, MAX), 0);
        assert_eq!(pace.window(), grown / 2, "one halving a second");
        for s in 1..=20 {
            assert_eq!(pace.room(at(26_000 + s * 1000, 0, 2 * AGE), AGE, MAX), 0);
        }
        assert_eq!(pace.window(), WINDOW_MIN, "never under the least window");
    }

    #[test]
    fn it_never_passes_pending_max() {
        let mut pace = Pace::default();
        for s in 0..1_000 {
            let room = pace.room(at(s * 1000, 0, 0), AGE, 100);
            pace.asked(room, room);
        }
        assert_eq!(pace.window(), 100);
        assert_eq!(pace.room(at(1_000_000, 0, 0), AGE, 3), 3);
    }
}
