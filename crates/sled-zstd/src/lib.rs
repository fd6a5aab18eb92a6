//! sled's compression, without a new zstd context per call, and without coding literals.
//!
//! sled 0.34 compresses every message it writes to its log (with `use_compression`) by
//! calling zstd 0.9's one-shot `block::compress`, and decompresses with `block::decompress`
//! and `stream::decode_all`. Each of those creates a zstd context and drops it again: a
//! zeroed allocation and a `cpuid` instruction per message, which on a virtual machine traps
//! to the hypervisor. Measured on the std docs replay, context creation alone was a fifth of
//! the process's CPU (a `perf` profile), more than the compression.
//!
//! This crate is patched in for zstd 0.9 (`[patch.crates-io]` in the workspace manifest) and
//! gives sled the same three functions over zstd 0.13, with one compression and one
//! decompression context kept per thread. The frames are standard zstd frames, which any zstd
//! reads, so a store written by zstd 0.9 reads with this crate and the other way round.
//!
//! sled's messages are small (a node's fragment, a few hundred bytes to a few KiB), and for
//! them the Huffman table of the literals (the bytes no earlier match covers) costs more than
//! it saves: with it, building the tables was a sixth of the std docs replay's CPU, and the
//! replay ran at 0.76 of its uncompressed speed; with the literals stored raw, at 0.90, for
//! sled's log the same size within its run-to-run spread (a `perf` profile and
//! `perc replay`, alternating runs in one sitting). So sled's entry point stores literals raw;
//! perc's value log, whose frames are whole page bodies, codes them ([`compress`] with
//! [`Literals::Coded`]).

use std::cell::RefCell;
use std::io::{self, Read};

use zstd_real::bulk::{Compressor, Decompressor};
use zstd_real::zstd_safe::{CParameter, ParamSwitch};

thread_local! {
    static COMPRESSOR: RefCell<Option<Compressor<'static>>> = const { RefCell::new(None) };
    static DECOMPRESSOR: RefCell<Option<Decompressor<'static>>> = const { RefCell::new(None) };
}

/// How a frame's literals, the bytes no earlier match covers, are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Literals {
    /// As they are: no table to build, for messages too small to repay one.
    Raw,
    /// Huffman-coded when zstd judges it pays (its default).
    Coded,
}

/// Compresses `data` at `level` into one frame (which records the content size), with the
/// thread's context.
pub fn compress(data: &[u8], level: i32, literals: Literals) -> io::Result<Vec<u8>> {
    COMPRESSOR.with(|slot| {
        let mut slot = slot.borrow_mut();
        let compressor = match slot.as_mut() {
            Some(c) => {
                c.set_compression_level(level)?;
                c
            }
            None => slot.insert(Compressor::new(level)?),
        };
        let mode = match literals {
            Literals::Raw => ParamSwitch::Disable,
            Literals::Coded => ParamSwitch::Auto,
        };
        compressor.set_parameter(CParameter::LiteralCompressionMode(mode))?;
        compressor.compress(data)
    })
}

/// zstd 0.9's `block` module: one-shot compression of a buffer into one frame.
pub mod block {
    use super::*;

    /// Compresses `data` at `level` into one frame, its literals raw: sled's messages.
    pub fn compress(data: &[u8], level: i32) -> io::Result<Vec<u8>> {
        super::compress(data, level, Literals::Raw)
    }

    /// Decompresses one frame of at most `capacity` bytes.
    pub fn decompress(data: &[u8], capacity: usize) -> io::Result<Vec<u8>> {
        super::with_decompressor(|d| d.decompress(data, capacity))
    }
}

/// zstd 0.9's `stream` module, as far as sled uses it.
pub mod stream {
    use super::*;

    /// Decompresses everything `source` holds. A frame that records its content size (every
    /// frame `block::compress` writes) is decompressed in one call with the thread's context;
    /// anything else is streamed.
    pub fn decode_all<R: Read>(mut source: R) -> io::Result<Vec<u8>> {
        let mut data = Vec::new();
        source.read_to_end(&mut data)?;
        match zstd_real::zstd_safe::get_frame_content_size(&data) {
            Ok(Some(size)) if frame_is_whole(&data) => {
                let size = usize::try_from(size)
                    .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "frame too large"))?;
                super::with_decompressor(|d| d.decompress(&data, size))
            }
            _ => zstd_real::stream::decode_all(&data[..]),
        }
    }

    /// Whether `data` is exactly one frame (several concatenated frames are streamed).
    fn frame_is_whole(data: &[u8]) -> bool {
        zstd_real::zstd_safe::find_frame_compressed_size(data).is_ok_and(|n| n == data.len())
    }
}

fn with_decompressor<T>(
    f: impl FnOnce(&mut Decompressor<'static>) -> io::Result<T>,
) -> io::Result<T> {
    DECOMPRESSOR.with(|slot| {
        let mut slot = slot.borrow_mut();
        let decompressor = match slot.as_mut() {
            Some(d) => d,
            None => slot.insert(Decompressor::new()?),
        };
        f(decompressor)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_through_every_entry_point() {
        let text = b"the quick brown fox jumps over the lazy dog ".repeat(100);
        for level in [1, 3, 5] {
            let frame = block::compress(&text, level).unwrap();
            assert!(frame.len() < text.len() / 4, "level {level}: {} bytes", frame.len());
            assert_eq!(block::decompress(&frame, text.len()).unwrap(), text);
            assert_eq!(stream::decode_all(&frame[..]).unwrap(), text);
            // The frames are zstd's own: the real crate reads them, and they read its.
            assert_eq!(zstd_real::decode_all(&frame[..]).unwrap(), text);
            let theirs = zstd_real::encode_all(&text[..], level).unwrap();
            assert_eq!(stream::decode_all(&theirs[..]).unwrap(), text);
        }
        assert_eq!(stream::decode_all(&block::compress(b"", 1).unwrap()[..]).unwrap(), b"");
    }

    #[test]
    fn literals_raw_for_sled_coded_when_asked() {
        // Text with no repeats is all literals: coded, each letter takes ~5 bits of 8.
        let mut x: u32 = 7;
        let text: Vec<u8> = (0..20_000)
            .map(|_| {
                x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                b'a' + ((x >> 16) % 26) as u8
            })
            .collect();
        let raw = block::compress(&text, 1).unwrap();
        let coded = compress(&text, 1, Literals::Coded).unwrap();
        assert!(raw.len() >= text.len(), "raw literals: {} bytes", raw.len());
        assert!(coded.len() < text.len() * 3 / 4, "coded literals: {} bytes", coded.len());
        for frame in [&raw, &coded] {
            assert_eq!(block::decompress(frame, text.len()).unwrap(), text);
            assert_eq!(zstd_real::decode_all(&frame[..]).unwrap(), text);
        }
        // The context is set per call: a coded frame after a raw one is coded, and back.
        assert_eq!(block::compress(&text, 1).unwrap().len(), raw.len());
    }

    #[test]
    fn concatenated_frames_and_garbage() {
        let mut two = block::compress(b"one ", 1).unwrap();
        two.extend(block::compress(b"two", 1).unwrap());
        assert_eq!(stream::decode_all(&two[..]).unwrap(), b"one two");
        assert!(stream::decode_all(&b"not a frame"[..]).is_err());
        assert!(block::decompress(b"not a frame", 100).is_err());
    }
}
