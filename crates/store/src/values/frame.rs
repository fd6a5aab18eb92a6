//! One value as the value log writes it: a frame, self-describing and position-independent,
//! so that the cleaner can copy it to another segment byte for byte.
//!
//! ```text
//!   crc32 (u32 LE, of every byte after it)
//!   hash  (32 bytes: blake3 of the value, its name)
//!   raw   (u32 LE: the value's length)
//!   len   (u32 LE: the payload's length)
//!   codec (u8: 0 the value as is, 1 zstd)
//!   payload
//! ```
//!
//! A frame whose checksum fails, or that runs past the end of its file, is where a crash cut
//! a segment's last write short: recovery keeps the segment up to the frame before it.

use super::Hash;

/// Bytes before a frame's payload.
pub(crate) const HEADER: usize = 4 + 32 + 4 + 4 + 1;

const RAW: u8 = 0;
const ZSTD: u8 = 1;

/// The frame of `value`, named `hash`, compressed at zstd `level` when that makes it smaller.
pub(crate) fn encode(hash: &Hash, value: &[u8], level: i32) -> std::io::Result<Vec<u8>> {
    // The thread's zstd context, shared with sled's log (crates/sled-zstd); a page body is
    // large enough to repay coding its literals.
    let compressed = zstd::compress(value, level, zstd::Literals::Coded)?;
    let (codec, payload) =
        if compressed.len() < value.len() { (ZSTD, &compressed[..]) } else { (RAW, value) };
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(hash);
    out.extend_from_slice(&(value.len() as u32).to_le_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.push(codec);
    out.extend_from_slice(payload);
    let crc = crc32fast::hash(&out[4..]);
    out[..4].copy_from_slice(&crc.to_le_bytes());
    Ok(out)
}

/// What a frame's header says.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Header {
    pub crc: u32,
    pub hash: Hash,
    pub raw: u32,
    pub len: u32,
    pub codec: u8,
}

impl Header {
    pub fn parse(b: &[u8; HEADER]) -> Header {
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        Header {
            crc: u32_at(0),
            hash: b[4..36].try_into().expect("32 bytes"),
            raw: u32_at(36),
            len: u32_at(40),
            codec: b[44],
        }
    }

    /// The whole frame's length.
    pub fn frame_len(&self) -> u64 {
        HEADER as u64 + u64::from(self.len)
    }
}

/// Whether `frame` (header and payload) is whole: its checksum holds and its codec is known.
pub(crate) fn whole(frame: &[u8]) -> bool {
    if frame.len() < HEADER {
        return false;
    }
    let header = Header::parse(frame[..HEADER].try_into().expect("a header"));
    frame.len() as u64 == header.frame_len()
        && matches!(header.codec, RAW | ZSTD)
        && crc32fast::hash(&frame[4..]) == header.crc
}

/// The value a whole frame holds.
pub(crate) fn decode(frame: &[u8]) -> std::io::Result<Vec<u8>> {
    let header = Header::parse(frame[..HEADER].try_into().expect("a header"));
    let payload = &frame[HEADER..];
    match header.codec {
        RAW => Ok(payload.to_vec()),
        _ => {
            let value = zstd::block::decompress(payload, header.raw as usize)?;
            if value.len() != header.raw as usize {
                return Err(std::io::Error::other("a frame's value is not its stated length"));
            }
            Ok(value)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_read_back_and_a_damaged_one_is_not_whole() {
        let hash = *blake3::hash(b"x").as_bytes();
        let text = b"<html>perc keeps page bodies out of sled's log</html>".repeat(50);
        for (value, level) in [(&text[..], 3), (&text[..], 1), (&b"\x01\x02\x03"[..], 3)] {
            let f = encode(&hash, value, level).unwrap();
            assert!(whole(&f));
            assert_eq!(decode(&f).unwrap(), value);
            let h = Header::parse(f[..HEADER].try_into().unwrap());
            assert_eq!(
                (h.hash, h.raw as usize, h.frame_len()),
                (hash, value.len(), f.len() as u64)
            );
            for cut in [1, f.len() / 2, f.len() - 1] {
                assert!(!whole(&f[..cut]), "cut at {cut}");
            }
            let mut bad = f.clone();
            *bad.last_mut().unwrap() ^= 1;
            assert!(!whole(&bad));
        }
        // Text compresses; three bytes do not, and are kept as they are.
        assert!(encode(&hash, &text, 3).unwrap().len() < text.len() / 4);
        assert_eq!(encode(&hash, b"\x01\x02\x03", 3).unwrap()[HEADER - 1], RAW);
    }
}
