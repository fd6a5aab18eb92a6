//! Compaction of the sled store: its live data copied into a new sled database, which then
//! takes the old one's place in the store's directory.
//!
//! sled 0.34 gives back log space only through its segment cleaner, which leaves two to six
//! times the live bytes on disk after a replay and a collection (docs/benchmarks.md); its
//! cleaner's threshold is a constant. A copy holds only what is live, though sled writes a
//! node several times while it loads it: a compacted store is still 2-3.4 times its live
//! bytes, and 1.1-3.2 times smaller than before (docs/benchmarks.md, "datapath"). The
//! copy is of sled's trees, key by key, so it keeps every cell, version and notification as
//! they are. The blobs are copied last, and only those some row record refers to: a blob no
//! row refers to was left by a crash between its write and its row's, or between a row's
//! rewrite and the removal of the blobs it replaced, and nothing can read it. It is done
//! offline: the store must not be open (sled's lock file says whether it is), so no writer
//! has a blob written and its row still to come.
//!
//! The steps, each one safe to be cut short by a crash:
//!
//! 1. Copy every tree into `DIR/compact.new`, flush it, and write `compact.new/COPIED`.
//!    Cut short: `compact.new` without `COPIED` is dropped; the store is as it was.
//! 2. Move the old database's files (`conf`, `db`, `snap.*`, `blobs`) into `DIR/compact.old`
//!    and write `compact.new/OLD_OUT`. Cut short: the files left in `DIR` are all old ones,
//!    so the step is done again.
//! 3. Move the new database's files from `compact.new` into `DIR`, then remove both
//!    directories. Cut short: the files left in `compact.new` are moved.
//!
//! Opening a store ([`recover`], called by `SledStore::open`) finishes a compaction that
//! reached `COPIED`, and drops one that did not. A compaction holds a lock on
//! `DIR/compact.lock` from before its first step to after its last, and an opening takes it
//! while it looks: an opening never meets a compaction half done by a live process, and
//! two compactions never run at once. Files of the directory that are not sled's
//! (perc's search index) stay where they are.
//!
use std::fs;
use std::path::{Path, PathBuf};

use crate::sled_backend::{BLOBS, ROWS};
use crate::sled_open::{io, open_db, sled_config, stored_conf};
use crate::{Result, SledOptions, StoreError};

/// The directory the copy is made in, inside the store's directory.
const NEW: &str = "compact.new";
/// Where the old database's files go while the copy takes their place.
const OLD: &str = "compact.old";
/// In [`NEW`]: the copy is whole and flushed.
const COPIED: &str = "COPIED";
/// In [`NEW`]: every file of the old database is in [`OLD`].
const OLD_OUT: &str = "OLD_OUT";
/// The file a compaction, and a store's opening while it looks for one cut short, hold an
/// exclusive lock on: one at a time, and never an opening in the middle of a compaction.
const LOCK: &str = "compact.lock";
/// Entries a batch of the copy writes.
const BATCH: usize = 4096;

/// What a compaction did.
#[derive(Clone, Debug)]
pub struct Compacted {
    /// Bytes of the database's files before and after.
    pub bytes_before: u64,
    pub bytes_after: u64,
    /// Keys copied, in every tree.
    pub keys: u64,
    /// Blobs left behind: no row record referred to them.
    pub blobs_dropped: u64,
}

/// Whether `name`, an entry of a store's directory, is a file of sled's database.
fn is_sled_file(name: &str) -> bool {
    matches!(name, "conf" | "db" | "blobs") || name.starts_with("snap.")
}

fn fs_error(what: String) -> impl FnOnce(std::io::Error) -> StoreError {
    move |e| StoreError::Io { backend: "sled", detail: format!("{what}: {e}") }
}

/// The sled files in `dir`, by name.
fn sled_files(dir: &Path) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).map_err(fs_error(format!("cannot list {}", dir.display())))? {
        let entry = entry.map_err(fs_error(format!("cannot list {}", dir.display())))?;
        if let Some(name) = entry.file_name().to_str().filter(|n| is_sled_file(n)) {
            out.push(name.to_string());
        }
    }
    out.sort();
    Ok(out)
}

/// The bytes of the sled files in `dir`.
fn sled_bytes(dir: &Path) -> Result<u64> {
    fn size(path: &Path) -> std::io::Result<u64> {
        let meta = fs::metadata(path)?;
        if !meta.is_dir() {
            return Ok(meta.len());
        }
        let mut total = 0;
        for entry in fs::read_dir(path)? {
            total += size(&entry?.path())?;
        }
        Ok(total)
    }
    let mut total = 0;
    for name in sled_files(dir)? {
        let path = dir.join(&name);
        total += size(&path).map_err(fs_error(format!("cannot measure {}", path.display())))?;
    }
    Ok(total)
}

/// Makes `path`'s creation, removal or renaming durable: fsyncs its directory.
fn sync_dir(dir: &Path) -> Result<()> {
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(fs_error(format!("cannot sync {}", dir.display())))
}

/// Writes the empty marker file `path`, durably.
fn mark(path: &Path) -> Result<()> {
    fs::File::create(path)
        .and_then(|f| f.sync_all())
        .map_err(fs_error(format!("cannot write {}", path.display())))?;
    sync_dir(path.parent().unwrap_or(Path::new(".")))
}

fn rename(from: &Path, to: &Path) -> Result<()> {
    fs::rename(from, to).map_err(fs_error(format!(
        "cannot move {} to {}",
        from.display(),
        to.display()
    )))
}

fn remove_dir(dir: &Path) -> Result<()> {
    match fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(fs_error(format!("cannot remove {}", dir.display()))(e)),
    }
}

/// Whether the store in `dir` is in the middle of a compaction that [`recover`] will finish
/// (its files may be out of `dir` for the moment).
pub(crate) fn finishing(dir: &Path) -> bool {
    dir.join(NEW).join(COPIED).exists()
}

/// Takes the compaction lock of the store in `dir` ([`LOCK`]), making its file if need be;
/// it is let go when the file is closed, by the process's end included.
fn lock(dir: &Path) -> Result<fs::File> {
    let path = dir.join(LOCK);
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(fs_error(format!("cannot open {}", path.display())))?;
    if !try_lock(&file, &path)? {
        return Err(StoreError::Io {
            backend: "sled",
            detail: format!("the store at {} is being compacted by another process", dir.display()),
        });
    }
    Ok(file)
}

/// Takes an exclusive lock on `file` (at `path`) if no one holds one: whether it did.
fn try_lock(file: &fs::File, path: &Path) -> Result<bool> {
    match fs2::FileExt::try_lock_exclusive(file) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == fs2::lock_contended_error().kind() => Ok(false),
        Err(e) => Err(fs_error(format!("cannot lock {}", path.display()))(e)),
    }
}

/// Finishes a compaction of the store in `dir` that reached step 1's end, drops one that did
/// not, and removes what a finished one left. A compaction makes its lock file first: a
/// store without one was never compacted, and there is nothing to look at.
pub(crate) fn recover(dir: &Path) -> Result<()> {
    if !dir.join(LOCK).exists() {
        return Ok(());
    }
    let _locked = lock(dir)?;
    recover_locked(dir)
}

fn recover_locked(dir: &Path) -> Result<()> {
    let new = dir.join(NEW);
    if finishing(dir) {
        swap(dir)?;
    } else if new.exists() {
        remove_dir(&new)?;
    }
    remove_dir(&dir.join(OLD))
}

/// Steps 2 and 3: the copy in `NEW` takes the old database's place.
fn swap(dir: &Path) -> Result<()> {
    let (new, old) = (dir.join(NEW), dir.join(OLD));
    if !new.join(OLD_OUT).exists() {
        fs::create_dir_all(&old).map_err(fs_error(format!("cannot create {}", old.display())))?;
        for name in sled_files(dir)? {
            rename(&dir.join(&name), &old.join(&name))?;
        }
        sync_dir(&old)?;
        sync_dir(dir)?;
        mark(&new.join(OLD_OUT))?;
    }
    for name in sled_files(&new)? {
        rename(&new.join(&name), &dir.join(&name))?;
    }
    sync_dir(dir)?;
    remove_dir(&new)?;
    remove_dir(&old)?;
    sync_dir(dir)
}

/// Compacts the sled store in directory `dir` (see the module's doc). The store must not be
/// open, in this process or another. `stop` true during the copy drops the copy and returns
/// `None`, the store as it was; once the copy is whole, the compaction finishes.
pub fn compact(
    dir: &Path,
    options: &SledOptions,
    stop: &dyn Fn() -> bool,
) -> Result<Option<Compacted>> {
    if !dir.join("conf").exists() && !finishing(dir) {
        return Err(StoreError::Io {
            backend: "sled",
            detail: format!("no store at {} to compact", dir.display()),
        });
    }
    let _locked = lock(dir)?;
    recover_locked(dir)?;
    let bytes_before = sled_bytes(dir)?;
    let copied = copy(dir, options, stop);
    let Ok(Some(done)) = copied else {
        // Stopped, or an error: the copy is dropped, and the store is as it was (the copy's
        // error, if any, is the one to report).
        let dropped = remove_dir(&dir.join(NEW));
        return copied.and_then(|_| dropped.map(|()| None));
    };
    swap(dir)?;
    Ok(Some(Compacted {
        bytes_before,
        bytes_after: sled_bytes(dir)?,
        keys: done.keys,
        blobs_dropped: done.blobs_dropped,
    }))
}

/// How long a dropped database may take to close its files.
const CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Waits until the sled database in `dir`, dropped in this process, has closed its files: a
/// dropped `sled::Db` lets its flusher thread finish, and write, before it lets go of the
/// lock on its `db` file. No file may change places before that.
fn closed(dir: &Path) -> Result<()> {
    let path = dir.join("db");
    let file =
        fs::File::open(&path).map_err(fs_error(format!("cannot open {}", path.display())))?;
    let waited = std::time::Instant::now();
    while !try_lock(&file, &path)? {
        if waited.elapsed() >= CLOSE_WAIT {
            return Err(StoreError::Io {
                backend: "sled",
                detail: format!("sled did not close {} in {CLOSE_WAIT:?}", path.display()),
            });
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    fs2::FileExt::unlock(&file).map_err(fs_error(format!("cannot unlock {}", path.display())))
}

/// What step 1 copied: keys, in every tree, and the blobs it left behind.
struct Copied {
    keys: u64,
    blobs_dropped: u64,
}

/// Step 1: every tree of the store in `dir` copied into `dir/NEW`, which is flushed and marked
/// `COPIED`; of the blobs, those some row record refers to. `None` if `stop` said so before
/// the copy was whole. Either way, and on an error, the databases are closed when it returns;
/// `NEW`, if not whole, is left to the caller to remove.
fn copy(dir: &Path, options: &SledOptions, stop: &dyn Fn() -> bool) -> Result<Option<Copied>> {
    let made = stored_conf(dir);
    let new_dir: PathBuf = dir.join(NEW);
    // Two databases open at once share the cache the store is given.
    let options = SledOptions { cache_bytes: options.cache_bytes / 2, ..options.clone() };
    let old = open_db(dir, &sled_config(dir, &made, &options))?;
    // The copy is made with the settings the store was made with (segment size,
    // compression), which sled then keeps in the copy's own `conf`.
    let new = open_db(&new_dir, &sled_config(&new_dir, &made, &options))?;
    let copied = copy_trees(&old, &new, stop);
    drop((new, old));
    closed(&new_dir)?;
    closed(dir)?;
    let Some(copied) = copied? else { return Ok(None) };
    mark(&new_dir.join(COPIED))?;
    Ok(Some(copied))
}

/// [`copy`]'s work between the opening and the closing of the two databases.
fn copy_trees(old: &sled::Db, new: &sled::Db, stop: &dyn Fn() -> bool) -> Result<Option<Copied>> {
    let mut copied = Copied { keys: 0, blobs_dropped: 0 };
    // The blobs last: by then the row records have said which blobs they refer to.
    let mut names = old.tree_names();
    names.sort_by_key(|name| name.as_ref() == BLOBS.as_bytes());
    let mut referenced: Vec<u64> = Vec::new();
    for name in names {
        let (from, to) = (old.open_tree(&name).map_err(io)?, new.open_tree(&name).map_err(io)?);
        let (rows, blobs) = (name.as_ref() == ROWS.as_bytes(), name.as_ref() == BLOBS.as_bytes());
        if blobs {
            referenced.sort_unstable();
            referenced.dedup();
        }
        let mut batch = sled::Batch::default();
        let mut batched = 0;
        for kv in from.iter() {
            let (k, v) = kv.map_err(io)?;
            if rows {
                crate::row::blob_ids(&v, &mut referenced).map_err(|e| StoreError::Corrupt {
                    backend: "sled",
                    detail: format!("{e}, in the row {}; nothing was compacted", k.escape_ascii()),
                })?;
            }
            if blobs && !refers_to(&referenced, &k) {
                copied.blobs_dropped += 1;
                continue;
            }
            batch.insert(k, v);
            copied.keys += 1;
            batched += 1;
            if batched % BATCH == 0 {
                if stop() {
                    return Ok(None);
                }
                to.apply_batch(std::mem::take(&mut batch)).map_err(io)?;
            }
        }
        to.apply_batch(batch).map_err(io)?;
    }
    if stop() {
        return Ok(None);
    }
    new.flush().map_err(io)?;
    Ok(Some(copied))
}

/// Whether `key`, a key of the blobs tree, is among the `referenced` ids (sorted). A key that
/// is not an id is kept: the copy drops only what it knows no one reads.
fn refers_to(referenced: &[u64], key: &[u8]) -> bool {
    match <[u8; 8]>::try_from(key) {
        Ok(id) => referenced.binary_search(&u64::from_be_bytes(id)).is_ok(),
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tree's name and its keys and values.
    type Tree = (Vec<u8>, Vec<(Vec<u8>, Vec<u8>)>);

    /// Every key and value of every tree of the store in `dir`.
    fn dump(dir: &Path) -> Vec<Tree> {
        let config = sled_config(dir, &stored_conf(dir), &SledOptions::default());
        let db = open_db(dir, &config).unwrap();
        let mut out = Vec::new();
        for name in db.tree_names() {
            let tree = db.open_tree(&name).unwrap();
            let entries =
                tree.iter().map(|kv| kv.unwrap()).map(|(k, v)| (k.to_vec(), v.to_vec())).collect();
            out.push((name.to_vec(), entries));
        }
        out
    }

    /// A store whose log holds garbage: keys written, rewritten and removed (in a tree of
    /// an own family: the copy reads the row records). Its segments are 1 MiB (sled's log
    /// grows a segment at a time; perc's are 8 MiB).
    fn store_with_garbage(dir: &Path) {
        let made = "segment_size: 1048576\n";
        let db = sled_config(dir, made, &SledOptions::default()).open().unwrap();
        let tree = db.open_tree("own/f").unwrap();
        for round in 0..4u32 {
            for k in 0..2_000u32 {
                tree.insert(k.to_be_bytes(), vec![round as u8; 600]).unwrap();
            }
        }
        for k in (0..2_000u32).step_by(2) {
            tree.remove(k.to_be_bytes()).unwrap();
        }
        db.insert(b"plain", b"default tree").unwrap();
        db.flush().unwrap();
    }

    #[test]
    fn a_compaction_keeps_every_key_and_shrinks_the_files() {
        let dir = tempfile::tempdir().unwrap();
        store_with_garbage(dir.path());
        fs::create_dir(dir.path().join("search")).unwrap();
        let before = dump(dir.path());
        let done =
            compact(dir.path(), &SledOptions::default(), &|| false).unwrap().expect("not stopped");
        assert!(done.bytes_after * 2 < done.bytes_before, "{done:?}");
        assert_eq!(before, dump(dir.path()));
        assert!(dir.path().join("search").is_dir(), "perc's own files stay");
        assert!(!dir.path().join(NEW).exists() && !dir.path().join(OLD).exists());
    }

    #[test]
    fn a_compaction_in_progress_is_not_touched() {
        let dir = tempfile::tempdir().unwrap();
        store_with_garbage(dir.path());
        let held = lock(dir.path()).unwrap();
        copied(dir.path());
        for refused in
            [recover(dir.path()), compact(dir.path(), &SledOptions::default(), &|| false).map(drop)]
        {
            let e = refused.unwrap_err().to_string();
            assert!(e.contains("being compacted by another process"), "{e}");
        }
        assert!(finishing(dir.path()), "the copy is left to its owner");
        drop(held);
        recover(dir.path()).unwrap();
        assert!(!dir.path().join(NEW).exists());
    }

    #[test]
    fn a_stopped_compaction_leaves_the_store_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        store_with_garbage(dir.path());
        let before = (dump(dir.path()), sled_bytes(dir.path()).unwrap());
        let stopped = compact(dir.path(), &SledOptions::default(), &|| true);
        assert!(stopped.unwrap().is_none());
        assert!(!dir.path().join(NEW).exists() && !dir.path().join(OLD).exists());
        assert_eq!((dump(dir.path()), sled_bytes(dir.path()).unwrap()), before);
    }

    /// The keys of the tree `name` in a [`dump`].
    fn keys_of(dump: &[Tree], name: &str) -> Vec<Vec<u8>> {
        let tree = dump.iter().find(|(n, _)| n == name.as_bytes());
        tree.map(|(_, entries)| entries.iter().map(|(k, _)| k.clone()).collect())
            .unwrap_or_default()
    }

    /// A store of two row records referring to blobs 1, 3 and 7 (1 and 3 two versions of one
    /// cell), beside blobs 0-9: what crashes between a blob's write and its row's leave.
    fn store_with_unreferenced_blobs(dir: &Path) {
        use crate::row::{encode, RowCells, Stored};
        use crate::{Column, Ts};
        let db = sled_config(dir, "", &SledOptions::default()).open().unwrap();
        let (rows, blobs) = (db.open_tree(ROWS).unwrap(), db.open_tree(BLOBS).unwrap());
        for id in 0..10u64 {
            blobs.insert(id.to_be_bytes(), vec![id as u8; 1000]).unwrap();
        }
        let blob = |id| Stored::Blob { id, len: 1000 };
        let mut a = RowCells::default();
        a.put(&Column::new("f", "q"), Ts(5), blob(1));
        a.put(&Column::new("f", "q"), Ts(9), blob(3));
        a.put(&Column::new("f", "s"), Ts(9), Stored::Inline(bytes::Bytes::from_static(b"x")));
        rows.insert(b"a", encode(&a)).unwrap();
        let mut b = RowCells::default();
        b.put(&Column::new("g", ""), Ts(2), blob(7));
        rows.insert(b"b", encode(&b)).unwrap();
        db.flush().unwrap();
    }

    #[test]
    fn a_compaction_leaves_behind_the_blobs_no_row_refers_to() {
        let dir = tempfile::tempdir().unwrap();
        store_with_unreferenced_blobs(dir.path());
        let before = dump(dir.path());
        let done =
            compact(dir.path(), &SledOptions::default(), &|| false).unwrap().expect("not stopped");
        assert_eq!(done.blobs_dropped, 7, "{done:?}");
        let after = dump(dir.path());
        let ids = |ids: &[u64]| ids.iter().map(|id| id.to_be_bytes().to_vec()).collect::<Vec<_>>();
        assert_eq!(keys_of(&before, BLOBS), ids(&[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]));
        assert_eq!(keys_of(&after, BLOBS), ids(&[1, 3, 7]));
        // What is kept is kept whole: the rows, and the values of the blobs they refer to.
        let kept = |d: &[Tree]| -> Vec<(Vec<u8>, Vec<u8>)> {
            let blobs = d.iter().find(|(n, _)| n == BLOBS.as_bytes()).unwrap();
            blobs.1.iter().filter(|(k, _)| ids(&[1, 3, 7]).contains(k)).cloned().collect()
        };
        assert_eq!(kept(&before), kept(&after));
        let rows = |d: &[Tree]| d.iter().find(|(n, _)| n == ROWS.as_bytes()).cloned();
        assert_eq!(rows(&before), rows(&after));
    }

    #[test]
    fn a_row_record_that_does_not_read_stops_the_compaction_before_any_change() {
        let dir = tempfile::tempdir().unwrap();
        store_with_unreferenced_blobs(dir.path());
        {
            // A store just dropped may hold its lock a moment longer: `open_db` waits it out.
            let config = sled_config(dir.path(), "", &SledOptions::default());
            let db = crate::sled_open::open_db(dir.path(), &config).unwrap();
            db.open_tree(ROWS).unwrap().insert(b"bad", b"not a row record".to_vec()).unwrap();
            db.flush().unwrap();
        }
        let before = dump(dir.path());
        let e = compact(dir.path(), &SledOptions::default(), &|| false).unwrap_err().to_string();
        assert!(e.contains("in the row bad") && e.contains("nothing was compacted"), "{e}");
        assert!(!dir.path().join(NEW).exists(), "the copy is dropped");
        assert_eq!(dump(dir.path()), before, "every blob is still there");
    }

    /// Step 1 done.
    fn copied(dir: &Path) {
        copy(dir, &SledOptions::default(), &|| false).unwrap();
    }

    /// Step 2 done, without step 3's moves.
    fn old_out(dir: &Path) {
        copied(dir);
        fs::create_dir(dir.join(OLD)).unwrap();
        for name in sled_files(dir).unwrap() {
            rename(&dir.join(&name), &dir.join(OLD).join(&name)).unwrap();
        }
        mark(&dir.join(NEW).join(OLD_OUT)).unwrap();
    }

    #[test]
    fn each_cut_short_step_recovers_to_one_whole_store() {
        // (what was done before the crash, whether the store is then the copy)
        type Cut = fn(&Path);
        let cuts: [(&str, Cut, bool); 5] = [
            (
                "a copy half made",
                |d| {
                    let n = d.join(NEW);
                    let db = sled::Config::new().path(&n).open().unwrap();
                    db.insert(b"half", b"made").unwrap();
                    db.flush().unwrap();
                },
                false,
            ),
            ("the copy made", copied, true),
            (
                "some old files moved out",
                |d| {
                    copied(d);
                    fs::create_dir(d.join(OLD)).unwrap();
                    rename(&d.join("conf"), &d.join(OLD).join("conf")).unwrap();
                },
                true,
            ),
            ("every old file out", old_out, true),
            (
                "some new files in",
                |d| {
                    old_out(d);
                    rename(&d.join(NEW).join("db"), &d.join("db")).unwrap();
                },
                true,
            ),
        ];
        for (what, cut, compacted) in cuts {
            let dir = tempfile::tempdir().unwrap();
            store_with_garbage(dir.path());
            let before = dump(dir.path());
            let bytes = sled_bytes(dir.path()).unwrap();
            // As `compact` does, before it makes anything else.
            fs::File::create(dir.path().join(LOCK)).unwrap();
            cut(dir.path());
            assert_eq!(finishing(dir.path()), compacted, "{what}");
            recover(dir.path()).unwrap();
            assert_eq!(before, dump(dir.path()), "{what}");
            assert_eq!(sled_bytes(dir.path()).unwrap() < bytes, compacted, "{what}");
            assert!(!dir.path().join(NEW).exists() && !dir.path().join(OLD).exists(), "{what}");
        }
    }
}
