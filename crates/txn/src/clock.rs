//! Wall time, handed in. The transaction layer reads no clock of its own: lock ages, liveness
//! and backoff all go through a [`Clock`], so tests can run on a [`ManualClock`] and make time
//! pass exactly when they mean it to.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;

#[async_trait]
pub trait Clock: Send + Sync + 'static {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
    /// Waits `ms` milliseconds of this clock's time.
    async fn sleep_ms(&self, ms: u64);
}

/// The real clock, sleeping on the tokio timer.
pub struct SystemClock;

#[async_trait]
impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
    }
    async fn sleep_ms(&self, ms: u64) {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
}

/// A clock that moves only when told to. `sleep_ms` advances it by the amount slept and
/// yields, so a backoff loop on a manual clock terminates without real waiting.
pub struct ManualClock {
    now_ms: AtomicU64,
}

impl ManualClock {
    pub fn new(start_ms: u64) -> ManualClock {
        ManualClock { now_ms: AtomicU64::new(start_ms) }
    }
    pub fn advance_ms(&self, ms: u64) {
        self.now_ms.fetch_add(ms, Ordering::SeqCst);
    }
}

#[async_trait]
impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now_ms.load(Ordering::SeqCst)
    }
    async fn sleep_ms(&self, ms: u64) {
        self.advance_ms(ms);
        tokio::task::yield_now().await;
    }
}
