//! Order-preserving, prefix-free encodings for composite sled keys.
//!
//! A key of a family in its own locality group is `enc(row) ++ enc(qualifier) ++ !ts`, so that
//! sled's byte order is (row, qualifier, ts descending): a row's cells, and a column's versions
//! newest first, are each one contiguous range. `enc` escapes `0x00` as `0x00 0xFF` and ends
//! with `0x00 0x01`, which keeps `a < a\0 < ab` and makes no encoding a prefix of another.

use crate::Ts;

/// Appends the escaped form of `bytes`.
pub fn encode_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    for &b in bytes {
        if b == 0 {
            out.extend_from_slice(&[0, 0xFF]);
        } else {
            out.push(b);
        }
    }
    out.extend_from_slice(&[0, 1]);
}

/// Decodes one escaped byte string from the front of `input`; returns it and the rest.
pub fn decode_bytes(input: &[u8]) -> Option<(Vec<u8>, &[u8])> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < input.len() {
        if input[i] == 0 {
            match input.get(i + 1)? {
                0xFF => out.push(0),
                1 => return Some((out, &input[i + 2..])),
                _ => return None,
            }
            i += 2;
        } else {
            out.push(input[i]);
            i += 1;
        }
    }
    None
}

/// A timestamp that sorts newest first.
pub fn encode_ts_desc(out: &mut Vec<u8>, ts: Ts) {
    out.extend_from_slice(&(!ts.0).to_be_bytes());
}

pub fn decode_ts_desc(input: &[u8]) -> Option<Ts> {
    let raw: [u8; 8] = input.try_into().ok()?;
    Some(Ts(!u64::from_be_bytes(raw)))
}

/// The key prefix of one column of one row.
pub fn column_prefix(row: &[u8], qualifier: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(row.len() + qualifier.len() + 12);
    encode_bytes(&mut k, row);
    encode_bytes(&mut k, qualifier);
    k
}

/// The full key of one cell.
pub fn cell_key(row: &[u8], qualifier: &[u8], ts: Ts) -> Vec<u8> {
    let mut k = column_prefix(row, qualifier);
    encode_ts_desc(&mut k, ts);
    k
}

/// Splits a cell key back into (row, qualifier, ts).
pub fn decode_cell_key(key: &[u8]) -> Option<(Vec<u8>, Vec<u8>, Ts)> {
    let (row, rest) = decode_bytes(key)?;
    let (qualifier, rest) = decode_bytes(rest)?;
    Some((row, qualifier, decode_ts_desc(rest)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_and_round_trip() {
        let rows: [&[u8]; 6] = [b"", b"\0", b"\0\0", b"a", b"a\0", b"ab"];
        let encoded: Vec<Vec<u8>> = rows
            .iter()
            .map(|r| {
                let mut v = Vec::new();
                encode_bytes(&mut v, r);
                v
            })
            .collect();
        for w in encoded.windows(2) {
            assert!(w[0] < w[1], "{:?} !< {:?}", w[0], w[1]);
        }
        for (r, e) in rows.iter().zip(&encoded) {
            assert_eq!(decode_bytes(e).unwrap(), (r.to_vec(), &[][..]));
        }
        let k = cell_key(b"r\0w", b"q", Ts(42));
        assert_eq!(decode_cell_key(&k).unwrap(), (b"r\0w".to_vec(), b"q".to_vec(), Ts(42)));
        assert!(cell_key(b"r", b"q", Ts(9)) < cell_key(b"r", b"q", Ts(8)));
    }
}
