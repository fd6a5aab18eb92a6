//! zstd with one compression and one decompression context per thread, for the sled
//! backend's row records and value log frames: making a context is an allocation and a
//! `cpuid` (see crates/sled-zstd), too much to pay once per value.

use std::cell::RefCell;

use zstd::bulk::{Compressor, Decompressor};

thread_local! {
    static COMPRESSOR: RefCell<Option<(i32, Compressor<'static>)>> = const { RefCell::new(None) };
    static DECOMPRESSOR: RefCell<Option<Decompressor<'static>>> = const { RefCell::new(None) };
}

/// `data` as one zstd frame, at `level`.
pub(crate) fn compress(data: &[u8], level: i32) -> std::io::Result<Vec<u8>> {
    COMPRESSOR.with(|slot| {
        let mut slot = slot.borrow_mut();
        let c = match slot.as_mut() {
            Some((l, c)) if *l == level => c,
            _ => &mut slot.insert((level, Compressor::new(level)?)).1,
        };
        c.compress(data)
    })
}

/// The `len` bytes one zstd frame holds; an error if it holds another length.
pub(crate) fn decompress(frame: &[u8], len: usize) -> std::io::Result<Vec<u8>> {
    DECOMPRESSOR.with(|slot| {
        let mut slot = slot.borrow_mut();
        let d = match slot.as_mut() {
            Some(d) => d,
            None => slot.insert(Decompressor::new()?),
        };
        let out = d.decompress(frame, len)?;
        if out.len() != len {
            return Err(std::io::Error::other("a zstd frame is not of its stated length"));
        }
        Ok(out)
    })
}
