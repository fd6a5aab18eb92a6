//! The values of the `lock` and `write` columns, and their byte encodings.
//!
//! ```text
//!   lock@start_ts   = { kind, owner, wall_ms, ttl_ms, primary: None (I am primary)
//!                                                     | Some(row, column) }
//!   write@commit_ts = { kind: put | delete | rollback, start_ts }
//!   write@start_ts  = { kind: rollback, start_ts }      (guards a rolled-back primary)
//! ```

use bytes::{Bytes, BytesMut};
use perc_store::Ts;

use crate::TxnError;

/// A transaction client's identity: the owner recorded in its locks, and its row in the
/// liveness registry ([`crate::liveness`]). A process has one per [`crate::Client`] it opens
/// (perc opens two: the loaders' and the observers').
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClientId(pub u64);

impl ClientId {
    /// Sixteen hex digits: its row key in the liveness registry, and how other tables (the
    /// lease cells) name it.
    pub fn hex(self) -> Bytes {
        Bytes::from(format!("{:016x}", self.0))
    }

    /// The id [`ClientId::hex`] wrote, if `raw` is one.
    pub fn from_hex(raw: &[u8]) -> Option<ClientId> {
        let text = std::str::from_utf8(raw).ok()?;
        u64::from_str_radix(text, 16).ok().map(ClientId)
    }
}

impl std::fmt::Display for ClientId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "client-{}", self.0)
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum WriteKind {
    Put,
    Delete,
    Rollback,
}

impl WriteKind {
    fn to_byte(self) -> u8 {
        match self {
            WriteKind::Put => 1,
            WriteKind::Delete => 2,
            WriteKind::Rollback => 3,
        }
    }
    fn from_byte(b: u8) -> Option<WriteKind> {
        match b {
            1 => Some(WriteKind::Put),
            2 => Some(WriteKind::Delete),
            3 => Some(WriteKind::Rollback),
            _ => None,
        }
    }
}

/// A cell's location: (row, user column).
pub type CellKey = (Bytes, Bytes);

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockRecord {
    /// `None`: this lock is the primary. Otherwise where the primary lock is.
    pub primary: Option<CellKey>,
    /// What the transaction writes to this cell (never `Rollback`).
    pub kind: WriteKind,
    pub owner: ClientId,
    /// The owner's wall time when it took the lock.
    pub wall_ms: u64,
    pub ttl_ms: u64,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct WriteRecord {
    pub kind: WriteKind,
    pub start_ts: Ts,
}

const LOCK_V1: u8 = 1;

impl LockRecord {
    pub fn encode(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(40);
        b.extend_from_slice(&[LOCK_V1, self.kind.to_byte()]);
        b.extend_from_slice(&self.owner.0.to_be_bytes());
        b.extend_from_slice(&self.wall_ms.to_be_bytes());
        b.extend_from_slice(&self.ttl_ms.to_be_bytes());
        if let Some((row, column)) = &self.primary {
            b.extend_from_slice(&(row.len() as u32).to_be_bytes());
            b.extend_from_slice(row);
            b.extend_from_slice(&(column.len() as u32).to_be_bytes());
            b.extend_from_slice(column);
        }
        b.freeze()
    }

    pub fn decode(raw: &Bytes) -> Result<LockRecord, TxnError> {
        let bad = || TxnError::Corrupt(format!("lock record of {} bytes", raw.len()));
        if raw.len() < 26 || raw[0] != LOCK_V1 {
            return Err(bad());
        }
        let kind = WriteKind::from_byte(raw[1]).ok_or_else(bad)?;
        let u64_at = |i: usize| u64::from_be_bytes(raw[i..i + 8].try_into().unwrap());
        let primary = if raw.len() == 26 {
            None
        } else {
            let mut at = 26;
            let take = |at: &mut usize| -> Option<Bytes> {
                let n = u32::from_be_bytes(raw.get(*at..*at + 4)?.try_into().ok()?) as usize;
                let b = raw.get(*at + 4..*at + 4 + n)?;
                let b = raw.slice_ref(b);
                *at += 4 + n;
                Some(b)
            };
            let row = take(&mut at).ok_or_else(bad)?;
            let column = take(&mut at).ok_or_else(bad)?;
            if at != raw.len() {
                return Err(bad());
            }
            Some((row, column))
        };
        Ok(LockRecord {
            primary,
            kind,
            owner: ClientId(u64_at(2)),
            wall_ms: u64_at(10),
            ttl_ms: u64_at(18),
        })
    }
}

impl WriteRecord {
    pub fn encode(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(9);
        b.extend_from_slice(&[self.kind.to_byte()]);
        b.extend_from_slice(&self.start_ts.0.to_be_bytes());
        b.freeze()
    }

    pub fn decode(raw: &[u8]) -> Result<WriteRecord, TxnError> {
        let bad = || TxnError::Corrupt(format!("write record of {} bytes", raw.len()));
        if raw.len() != 9 {
            return Err(bad());
        }
        Ok(WriteRecord {
            kind: WriteKind::from_byte(raw[0]).ok_or_else(bad)?,
            start_ts: Ts(u64::from_be_bytes(raw[1..9].try_into().unwrap())),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        for primary in [None, Some((Bytes::from_static(b"r\0w"), Bytes::from_static(b"c")))] {
            let l = LockRecord {
                primary,
                kind: WriteKind::Delete,
                owner: ClientId(9),
                wall_ms: 5,
                ttl_ms: 7,
            };
            assert_eq!(LockRecord::decode(&l.encode()).unwrap(), l);
        }
        let w = WriteRecord { kind: WriteKind::Rollback, start_ts: Ts(77) };
        assert_eq!(WriteRecord::decode(&w.encode()).unwrap(), w);
        assert!(WriteRecord::decode(b"\x09").is_err());
        assert!(LockRecord::decode(&Bytes::from_static(b"\x01\x01")).is_err());
    }
}
