//! How long notifications have waited: the age of the oldest pending notification of each
//! observer, the measure of whether a stage keeps up.
//!
//! A notify cell's timestamp is the oracle's, a counter, not a time. So the engine keeps a
//! [`TsClock`]: samples of (timestamp, wall-clock ms) taken as its runs begin, at each of
//! the workers' heartbeats and when a backlog is read, at least [`SAMPLE_EVERY_MS`] apart and
//! at most [`SAMPLES_MAX`] of them.
//! Timestamps only grow, so a cell's timestamp was handed out before the first sample at or
//! above it: that sample's time is when the cell was written at the latest, and its age is
//! read from it (low by at most the gap between two samples). A cell older than every
//! sample (written before this process began, or beyond the samples kept) is given the
//! first sample's time: its age is at least that. One newer than every sample was written
//! since the last: its age is under the gap.

use std::collections::VecDeque;
use std::sync::Mutex;

/// Samples are taken at least this far apart.
pub const SAMPLE_EVERY_MS: u64 = 1_000;

/// Samples kept: two hours at one a second.
pub const SAMPLES_MAX: usize = 7_200;

/// Samples of (timestamp, wall-clock ms), oldest first.
#[derive(Debug, Default)]
pub struct TsClock {
    samples: Mutex<VecDeque<(u64, u64)>>,
}

impl TsClock {
    /// Notes that timestamp `ts` was handed out by `ms` at the latest.
    pub fn note(&self, ts: u64, ms: u64) {
        let mut samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(&(last_ts, last_ms)) = samples.back() {
            if ts <= last_ts || ms < last_ms.saturating_add(SAMPLE_EVERY_MS) {
                return;
            }
        }
        if samples.len() == SAMPLES_MAX {
            samples.pop_front();
        }
        samples.push_back((ts, ms));
    }

    /// When timestamp `ts` was handed out at the latest, as far as the samples tell: the
    /// time of the first sample at or above it. `None` when it is newer than every sample
    /// (it was handed out since the last one: about now).
    pub fn time_of(&self, ts: u64) -> Option<u64> {
        let samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        let at = samples.partition_point(|&(t, _)| t < ts);
        samples.get(at).map(|&(_, ms)| ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timestamp_is_as_old_as_the_first_sample_at_or_above_it() {
        let clock = TsClock::default();
        assert_eq!(clock.time_of(5), None, "no sample: about now");
        clock.note(100, 10_000);
        clock.note(150, 10_500); // too soon after the last: not kept
        clock.note(200, 11_000);
        clock.note(300, 12_500);
        assert_eq!(clock.time_of(50), Some(10_000), "older than every sample: the first's");
        assert_eq!(clock.time_of(100), Some(10_000));
        assert_eq!(clock.time_of(101), Some(11_000));
        assert_eq!(clock.time_of(250), Some(12_500));
        assert_eq!(clock.time_of(301), None, "newer than every sample: about now");
    }

    #[test]
    fn it_keeps_a_bounded_number_of_samples() {
        let clock = TsClock::default();
        for i in 0..(SAMPLES_MAX as u64 + 100) {
            clock.note(i + 1, i * SAMPLE_EVERY_MS);
        }
        assert_eq!(clock.samples.lock().unwrap().len(), SAMPLES_MAX);
        assert_eq!(clock.time_of(1), Some(100 * SAMPLE_EVERY_MS), "the oldest were dropped");
    }
}
