//! The value log's cleaner: one pass marks the names row records refer to, drops the index
//! entries of the rest, moves the live frames of sealed segments that are mostly dead into
//! the active one, and removes those segments.
//!
//! The steps, and what a crash after each leaves (every state reads every live value):
//!
//! 1. Wait for the pins, raise `marking` (puts from now on record their names in `touched`).
//! 2. Walk every row record; the names found are live.
//! 3. Walk the index: an entry whose name is neither live nor touched is removed (under the `touched` lock, so a put either finds the entry and is recorded
//!    first, or finds none and appends a fresh frame). Crash: the entry is back or gone;
//!    either way no row refers to it.
//! 4. A sealed segment whose live frames are less than half its bytes is doomed: each live
//!    frame is copied to the active segment and its entry moved there (only if it still
//!    points at the old place). Crash: the entry points at the old frame or the copy, both
//!    whole; a copy no entry points at is dead and goes in a later pass.
//! 5. The copies are fsynced and sled flushed: every entry now points where it will after a
//!    crash. Then the doomed segments are removed. Crash: a segment left is one no entry
//!    points at, removed by the next pass.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use super::{short, Hash, Loc, Referenced, Values};
use crate::sled_open::{fs_error, io};
use crate::Result;

/// What a cleaning pass did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Cleaned {
    /// Distinct names the row records refer to.
    pub referenced: u64,
    /// Index entries dropped: values no row refers to.
    pub dropped: u64,
    /// Live frames copied out of doomed segments.
    pub moved: u64,
    /// Segments removed.
    pub segments_removed: u64,
    /// The segments' bytes on disk before and after.
    pub bytes_before: u64,
    pub bytes_after: u64,
}

/// A sealed segment is rewritten when less than this share of its bytes is live.
const LIVE_SHARE_MIN: f64 = 0.5;

/// A named point a crash test may stop the process at (the `failpoints` feature): with
/// `PERC_STORE_CRASH_AT` set to `NAME` (or `NAME@N`, the N-th time the point is reached),
/// the process aborts there, as a kill would stop it.
pub(crate) fn crash_point(name: &str) {
    #[cfg(feature = "failpoints")]
    {
        static HITS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let Ok(at) = std::env::var("PERC_STORE_CRASH_AT") else { return };
        let (point, nth) = match at.split_once('@') {
            Some((p, n)) => (p.to_string(), n.parse().unwrap_or(1)),
            None => (at, 1),
        };
        if point == name && HITS.fetch_add(1, Ordering::SeqCst) + 1 == nth {
            std::process::abort();
        }
    }
    #[cfg(not(feature = "failpoints"))]
    let _ = name;
}

/// An index entry: the value's name and where its frame is.
fn decode_entry(key: &[u8], raw: &[u8]) -> Result<(Hash, Loc)> {
    let hash: Hash = key.try_into().map_err(|_| super::corrupt("a name"))?;
    Ok((hash, Loc::decode(raw)?))
}

impl Values {
    /// One cleaning pass. `referenced` walks every row record and calls its argument with each
    /// name a record refers to (every version of every cell).
    pub fn clean(&self, referenced: Referenced<'_>) -> Result<Cleaned> {
        let _one = self.cleaning.lock().expect("cleaning");
        let mut report = Cleaned { bytes_before: self.disk_bytes()?, ..Cleaned::default() };
        let dropped_before = self.dropped.load(Ordering::Relaxed);
        let held_before = self.held.load(Ordering::Relaxed);
        // Segments below `sealed` take no more frames: only they are rewritten.
        let sealed = {
            let active = self.active.lock().expect("active");
            active.as_ref().map_or(self.next_id.load(Ordering::SeqCst) as u32, |a| a.id)
        };
        {
            let _no_puts_in_flight = self.pins.write().expect("pins");
            self.touched.lock().expect("touched").clear();
            self.marking.store(true, Ordering::SeqCst);
        }
        let result = self.mark_and_sweep(referenced, sealed, &mut report);
        self.marking.store(false, Ordering::SeqCst);
        self.touched.lock().expect("touched").clear();
        let kept_raw = result?;
        let appended = self.held.load(Ordering::Relaxed).saturating_sub(held_before);
        self.held.store(kept_raw + appended, Ordering::Relaxed);
        self.dropped.fetch_sub(dropped_before, Ordering::Relaxed);
        report.bytes_after = self.disk_bytes()?;
        Ok(report)
    }

    /// Steps 2-5; returns the value bytes of the entries kept.
    fn mark_and_sweep(
        &self,
        referenced: Referenced<'_>,
        sealed: u32,
        report: &mut Cleaned,
    ) -> Result<u64> {
        let mut live: Vec<u64> = Vec::new();
        referenced(&mut |h| live.push(short(h)))?;
        live.sort_unstable();
        live.dedup();
        report.referenced = live.len() as u64;

        let mut kept_raw = 0u64;
        let mut live_bytes: BTreeMap<u32, u64> = BTreeMap::new();
        for entry in self.index.iter() {
            let (key, raw) = entry.map_err(io)?;
            let (hash, loc) = decode_entry(&key, &raw)?;
            let name = short(&hash);
            let keep = live.binary_search(&name).is_ok()
                || self.touched_or_dropped(&key, &raw, name, report)?;
            if keep {
                kept_raw += u64::from(loc.raw);
                *live_bytes.entry(loc.segment).or_default() += u64::from(loc.frame_len);
            }
        }

        let files: Vec<(u32, std::sync::Arc<std::fs::File>)> = {
            let segments = self.segments.read().expect("segments");
            segments.range(..sealed).map(|(id, f)| (*id, f.clone())).collect()
        };
        let mut doomed = Vec::new();
        for (id, file) in files {
            let len = file.metadata().map_err(fs_error(format!("cannot stat segment {id}")))?.len();
            let live = live_bytes.get(&id).copied().unwrap_or(0);
            if (live as f64) < LIVE_SHARE_MIN * len as f64 {
                doomed.push(id);
            }
        }
        // The live frames of the doomed segments, found by a second walk of the index (a
        // list of every entry kept would hold the whole index in memory).
        if !doomed.is_empty() {
            for entry in self.index.iter() {
                let (key, raw) = entry.map_err(io)?;
                let (hash, loc) = decode_entry(&key, &raw)?;
                if doomed.binary_search(&loc.segment).is_err() {
                    continue;
                }
                let Some(bytes) = self.frame_at(&loc)? else { continue };
                self.append(&hash, &bytes, loc.raw, Some(&loc))?;
                report.moved += 1;
            }
        }
        crash_point("values.clean.after-copy");
        self.sync()?;
        self.db.flush().map_err(io)?;
        crash_point("values.clean.after-flush");
        for id in doomed {
            self.segments.write().expect("segments").remove(&id);
            let path = self.dir.join(super::segment_name(id));
            std::fs::remove_file(&path)
                .map_err(fs_error(format!("cannot remove {}", path.display())))?;
            report.segments_removed += 1;
            crash_point("values.clean.mid-remove");
        }
        Ok(kept_raw)
    }

    /// Whether a put recorded `name` during the pass (its entry is kept); if not, the entry
    /// is removed, under the lock puts record names under.
    fn touched_or_dropped(
        &self,
        key: &sled::IVec,
        raw: &sled::IVec,
        name: u64,
        report: &mut Cleaned,
    ) -> Result<bool> {
        let touched = self.touched.lock().expect("touched");
        if touched.contains(&name) {
            return Ok(true);
        }
        let gone = self.index.compare_and_swap(key, Some(raw), None::<&[u8]>).map_err(io)?;
        report.dropped += u64::from(gone.is_ok());
        Ok(false)
    }
}
