//! Finding notifications: the scan of the notify family, the pending counts and the
//! backlog's ages that `perc status` shows.

use bytes::Bytes;
use perc_store::{Scan, ScanCell};
use perc_txn::{actions, TxnError};

use super::{collapse, Backlog, Engine, Pending};

impl Engine {
    /// Up to `limit` notify cells from row `start` on, collapsed; and where to continue
    /// (`None`: the end of the table was reached). The clears this engine deferred are made
    /// first ([`Self::flush_clears`]), so that it does not read settled notifications again.
    pub async fn scan(
        &self,
        start: &Bytes,
        limit: usize,
    ) -> Result<(Vec<Pending>, Option<Bytes>), TxnError> {
        let cells = self.notify_cells(start.clone(), limit).await?;
        let full = cells.len() >= limit;
        let mut pending = collapse(cells);
        if !full {
            return Ok((pending, None));
        }
        // The last row may have more cells beyond the limit: leave it for the next batch,
        // unless it is the only row here (then continue after it; what it still has waits
        // for the next round).
        let last_row = pending.last().map(|p| p.row.clone()).expect("a full batch");
        if pending.iter().any(|p| p.row != last_row) {
            pending.retain(|p| p.row != last_row);
            Ok((pending, Some(last_row)))
        } else {
            let mut next = last_row.to_vec();
            next.push(0);
            Ok((pending, Some(next.into())))
        }
    }

    /// Whether any notification is pending (parked ones are not: they left the notify family).
    pub async fn has_pending(&self) -> Result<bool, TxnError> {
        Ok(!self.scan(&Bytes::new(), 1).await?.0.is_empty())
    }

    /// The distinct pending notifications in the first `limit` notify cells.
    pub(super) async fn pending(&self, limit: usize) -> Result<Vec<Pending>, TxnError> {
        Ok(collapse(self.notify_cells(Bytes::new(), limit).await?))
    }

    /// Up to `limit` notify cells from row `start` on, once the deferred clears are made.
    pub(super) async fn notify_cells(
        &self,
        start: Bytes,
        limit: usize,
    ) -> Result<Vec<ScanCell>, TxnError> {
        self.flush_clears().await?;
        let scan = Scan { family: actions::NOTIFY.name, start, end: Bytes::new(), limit };
        Ok(self.store().scan(&scan).await?)
    }

    /// Distinct pending notifications, counting at most `limit` notify cells.
    pub async fn pending_count(&self, limit: usize) -> Result<usize, TxnError> {
        Ok(self.pending(limit).await?.len())
    }

    /// Distinct pending notifications by the observer they wait for (a column no observer
    /// watches: under its column's name), counting at most `limit` notify cells.
    pub async fn pending_by_observer(
        &self,
        limit: usize,
    ) -> Result<std::collections::BTreeMap<String, usize>, TxnError> {
        let mut by = std::collections::BTreeMap::new();
        for p in self.pending(limit).await? {
            let name = match self.registry.get(&p.column) {
                Some(reg) => reg.name.to_string(),
                None => p.column.escape_ascii().to_string(),
            };
            *by.entry(name).or_default() += 1;
        }
        Ok(by)
    }

    /// Per observer that has notifications pending (a column no observer watches: under its
    /// column's name): how many (distinct), and how long the oldest has waited, in ms
    /// (see [`crate::lag`]); counting at most `limit` notify cells.
    pub async fn backlog(
        &self,
        limit: usize,
    ) -> Result<std::collections::BTreeMap<String, Backlog>, TxnError> {
        let now_ts = self.client.oracle().next().await?;
        let now_ms = self.client.clock().now_ms();
        self.ts_clock.note(now_ts.0, now_ms);
        let cells = self.notify_cells(Bytes::new(), limit).await?;
        let mut oldest: std::collections::BTreeMap<String, u64> = Default::default();
        for c in &cells {
            let name = self.observer_name(&c.qualifier);
            let ts = oldest.entry(name).or_insert(u64::MAX);
            *ts = (*ts).min(c.ts.0);
        }
        let mut by = std::collections::BTreeMap::new();
        for p in collapse(cells) {
            let name = self.observer_name(&p.column);
            let b = by.entry(name.clone()).or_insert_with(|| {
                let written = self.ts_clock.time_of(oldest[&name]).unwrap_or(now_ms);
                Backlog { pending: 0, oldest_ms: now_ms.saturating_sub(written) }
            });
            b.pending += 1;
        }
        Ok(by)
    }

    /// Takes a sample of when timestamps are handed out (see [`crate::lag`]): the workers'
    /// heartbeat does, so that a backlog's ages are right within a heartbeat while no run
    /// begins.
    pub(crate) async fn note_time(&self) -> Result<(), TxnError> {
        let ts = self.client.oracle().next().await?;
        self.ts_clock.note(ts.0, self.client.clock().now_ms());
        Ok(())
    }

    pub(super) fn observer_name(&self, column: &[u8]) -> String {
        match self.registry.get(column) {
            Some(reg) => reg.name.to_string(),
            None => column.escape_ascii().to_string(),
        }
    }
}
