//! How many due URLs the recrawl asks for at each tick: a window on the notifications waiting
//! for the observers, steered by how long the oldest of them has waited.
//!
//! A count alone bounds how much waits, not how long: at 14 fetches a second, 2,000 waiting
//! fetches wait two minutes. So the window follows the age of the oldest pending notification
//! (any observer's), as a congestion window follows a round trip: below half of
//! `recrawl.pending_age_s` it grows by a step at each tick the recrawl filled it; from half to
//! the whole it stays; above it the window halves and the tick asks for nothing. It never
//! passes `recrawl.pending_max`, nor falls under [`WINDOW_MIN`] (the recrawl always moves).
//! The step is small so that the window cannot outgrow the age that measures it: the age of
//! the oldest notification tells what the window was one wait ago.

/// The smallest window, where it starts, and what it grows by at each tick.
pub const WINDOW_MIN: usize = 32;
pub const WINDOW_STEP: usize = 16;

/// The window, between ticks.
#[derive(Debug)]
pub struct Pace {
    window: usize,
    /// Whether the last tick asked for the whole window's room: only a window in use grows
    /// (one that grew while nothing was due would let the next burst bury the observers).
    filled: bool,
}

impl Default for Pace {
    fn default() -> Pace {
        Pace { window: WINDOW_MIN, filled: false }
    }
}

impl Pace {
    /// How many notifications may wait now.
    pub fn window(&self) -> usize {
        self.window
    }

    /// The room for this tick: `pending` notifications wait, the oldest for `oldest_ms`;
    /// the window moves as the module says first.
    pub fn room(
        &mut self,
        pending: usize,
        oldest_ms: u64,
        age_max_ms: u64,
        pending_max: usize,
    ) -> usize {
        let floor = WINDOW_MIN.min(pending_max);
        if oldest_ms >= age_max_ms {
            self.window = (self.window / 2).max(floor);
            self.filled = false;
            return 0;
        }
        if oldest_ms < age_max_ms / 2 && self.filled {
            self.window += WINDOW_STEP;
        }
        self.window = self.window.clamp(floor, pending_max);
        self.window.saturating_sub(pending)
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

    #[test]
    fn a_window_in_use_grows_while_the_oldest_is_young() {
        let mut pace = Pace::default();
        assert_eq!(pace.room(0, 0, AGE, MAX), WINDOW_MIN);
        pace.asked(WINDOW_MIN, WINDOW_MIN);
        assert_eq!(pace.room(0, 1_000, AGE, MAX), WINDOW_MIN + WINDOW_STEP);
        pace.asked(WINDOW_MIN + WINDOW_STEP, WINDOW_MIN + WINDOW_STEP);
        assert_eq!(pace.room(10, 1_000, AGE, MAX), WINDOW_MIN + 2 * WINDOW_STEP - 10);
    }

    #[test]
    fn a_window_not_in_use_does_not_grow() {
        let mut pace = Pace::default();
        for _ in 0..100 {
            let room = pace.room(0, 0, AGE, MAX);
            pace.asked(room / 2, room);
        }
        assert_eq!(pace.window(), WINDOW_MIN);
    }

    #[test]
    fn it_stops_growing_at_half_the_age_and_halves_past_it() {
        let mut pace = Pace::default();
        for _ in 0..20 {
            let room = pace.room(0, 0, AGE, MAX);
            pace.asked(room, room);
        }
        let grown = pace.window();
        assert_eq!(grown, WINDOW_MIN + 19 * WINDOW_STEP);
        let room = pace.room(0, AGE / 2, AGE, MAX);
        pace.asked(room, room);
        assert_eq!(pace.window(), grown, "between half and the whole: it stays");
        assert_eq!(pace.room(0, AGE, AGE, MAX), 0, "past the age: nothing asked");
        assert_eq!(pace.window(), grown / 2);
        for _ in 0..20 {
            assert_eq!(pace.room(0, 2 * AGE, AGE, MAX), 0);
        }
        assert_eq!(pace.window(), WINDOW_MIN, "never under the least window");
    }

    #[test]
    fn it_never_passes_pending_max() {
        let mut pace = Pace::default();
        for _ in 0..1_000 {
            let room = pace.room(0, 0, AGE, 100);
            pace.asked(room, room);
        }
        assert_eq!(pace.window(), 100);
        assert_eq!(pace.room(0, 0, AGE, 3), 3);
    }
}
