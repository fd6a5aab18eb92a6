//! Advisory leases that keep two scanners' workers off one notification at a time.
//!
//! Advisory: correctness never depends on them (the ack column makes a second run commit
//! nothing twice); they only save wasted runs. In-process now; the distributed mode backs the
//! same trait with the store, with expiry.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use bytes::Bytes;

pub trait RowLease: Send + Sync + 'static {
    /// Takes the lease on `(row, column)` if nobody holds it.
    fn try_acquire(&self, row: &Bytes, column: &Bytes) -> Option<LeaseGuard>;
}

/// Releases its lease when dropped.
pub struct LeaseGuard {
    release: Option<Box<dyn FnOnce() + Send>>,
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        if let Some(release) = self.release.take() {
            release();
        }
    }
}

/// Leases held in this process's memory.
#[derive(Default, Clone)]
pub struct LocalLease {
    held: Arc<Mutex<HashSet<(Bytes, Bytes)>>>,
}

impl RowLease for LocalLease {
    fn try_acquire(&self, row: &Bytes, column: &Bytes) -> Option<LeaseGuard> {
        let key = (row.clone(), column.clone());
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if !held.insert(key.clone()) {
            return None;
        }
        let set = self.held.clone();
        Some(LeaseGuard {
            release: Some(Box::new(move || {
                set.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
            })),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_holder_at_a_time_and_release_on_drop() {
        let lease = LocalLease::default();
        let (r, c) = (Bytes::from_static(b"r"), Bytes::from_static(b"c"));
        let g = lease.try_acquire(&r, &c).expect("free");
        assert!(lease.try_acquire(&r, &c).is_none());
        assert!(lease.try_acquire(&r, &Bytes::from_static(b"other")).is_some());
        drop(g);
        assert!(lease.try_acquire(&r, &c).is_some());
    }
}
