//! Files a command writes: whole or not at all (a temporary file renamed over the target),
//! and the export, streamed as it is read.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context, Result};
use perc_pipeline::{Pipeline, PipelineError};

/// Writes a file through a temporary one renamed at the end, so that a reader never sees
/// half of it.
pub(crate) fn write_atomically(
    path: &Path,
    write: impl FnOnce(&mut dyn Write) -> Result<()>,
) -> Result<()> {
    let mut tmp = Replacement::create(path)?;
    write(&mut tmp.file).with_context(|| format!("cannot write {}", tmp.path.display()))?;
    tmp.finish()
}

/// A file written beside the one it replaces, renamed over it once complete and synced. A
/// target that exists and is not a regular file (`/dev/null`, a FIFO, a terminal) is written
/// in place: renaming over it would replace the device or pipe with a file.
pub(crate) struct Replacement<'a> {
    target: &'a Path,
    path: PathBuf,
    pub(crate) file: std::io::BufWriter<std::fs::File>,
}

impl Replacement<'_> {
    pub(crate) fn create(target: &Path) -> Result<Replacement<'_>> {
        let special = std::fs::metadata(target).is_ok_and(|m| !m.is_file() && !m.is_dir());
        let path = if special {
            target.to_path_buf()
        } else {
            let mut name = target.as_os_str().to_owned();
            name.push(".tmp");
            PathBuf::from(name)
        };
        let file = std::fs::File::create(&path)
            .with_context(|| format!("cannot write {}", path.display()))?;
        Ok(Replacement { target, path, file: std::io::BufWriter::new(file) })
    }

    pub(crate) fn finish(self) -> Result<()> {
        let what = || format!("cannot write {}", self.path.display());
        let file = self.file.into_inner().map_err(|e| anyhow!("{}: {e}", what()))?;
        if self.path == self.target {
            return Ok(()); // written in place: nothing to sync or rename
        }
        file.sync_all()?;
        std::fs::rename(&self.path, self.target)
            .with_context(|| format!("cannot write {}", self.target.display()))
    }
}

/// What `perc export` writes: the pages' lines, or the link graph's.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exported {
    Pages,
    Links,
}

impl Exported {
    /// What `--links` asks for.
    pub(crate) fn of(links: bool) -> Exported {
        if links {
            Exported::Links
        } else {
            Exported::Pages
        }
    }

    /// What a line is, for the command's report.
    pub(crate) fn unit(self) -> &'static str {
        match self {
            Exported::Pages => "pages",
            Exported::Links => "links",
        }
    }
}

/// Writes the export as it is read, to stdout for `-`, else through a temporary file (see
/// [`write_atomically`]); returns the number of lines.
pub(crate) async fn write_export(app: &Pipeline, out: &Path, what: Exported) -> Result<usize> {
    if out.as_os_str() == "-" {
        let mut f = std::io::BufWriter::new(std::io::stdout().lock());
        let n = export_lines(app, &mut f, what).await?;
        f.flush()?;
        return Ok(n);
    }
    let mut tmp = Replacement::create(out)?;
    let n = export_lines(app, &mut tmp.file, what).await?;
    tmp.finish()?;
    Ok(n)
}

/// The export (or the link graph) as JSON Lines into `w`; returns the number of lines.
pub(crate) async fn export_lines(
    app: &Pipeline,
    w: &mut impl Write,
    what: Exported,
) -> Result<usize> {
    fn line(w: &mut impl Write, l: &impl serde::Serialize) -> perc_pipeline::Result<()> {
        serde_json::to_writer(&mut *w, l)
            .map_err(std::io::Error::from)
            .and_then(|()| w.write_all(b"\n"))
            .map_err(|cause| PipelineError::Io { what: "cannot write the export".into(), cause })
    }
    let n = match what {
        Exported::Pages => app.export(|l| line(w, &l)).await?,
        Exported::Links => app.export_links(|l| line(w, &l)).await?,
    };
    Ok(n)
}
