//! discover: link discovery into the frontier.
//!
//! - Trigger: `page:follow` of `p:<url>` (strong), written by parse.
//! - Reads: the followable links (nofollow already removed by parse) and the redirect target;
//!   the crawl's scope and limits (`m:config`); each target's `crawl:want`.
//! - Writes: `crawl:want` of each target that is in scope, within the depth limit (links: one
//!   hop deeper) or the redirect limit (a redirect: same depth, one more hop), and not yet in
//!   the frontier, or in it at a greater (depth, hops): the frontier converges on shortest
//!   paths whatever order pages are processed in.
//! - Notifies: fetch, through `crawl:want`.
//! - Twice is harmless: targets already in the frontier are left alone. Robots.txt is
//!   checked when the target is fetched (its verdict is recorded on the page).

use crate::IndexError;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use perc_crawl::Scope;
use perc_notify::{Observer, ObserverError};
use perc_txn::Transaction;

use crate::model::{self, col, CrawlScope, Follow, Want};

/// The stage, with the crawl's scope as its last run read it: the scope cell lists every
/// seed (tens of thousands for a big seed list), and reading it afresh in each run would
/// make each run cost as much as the seed list. A run reads the cell (its bytes, in its
/// snapshot) and parses it only when it differs from the last one parsed.
#[derive(Default)]
pub struct Discover {
    last: std::sync::Mutex<Option<(Bytes, Arc<Limits>)>>,
}

/// The crawl's scope and limits, parsed from `m:config`.
struct Limits {
    config: CrawlScope,
    scope: Scope,
}

impl Discover {
    fn limits(&self, raw: Bytes) -> Result<Arc<Limits>, IndexError> {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, limits)) = last.as_ref().filter(|(bytes, _)| *bytes == raw) {
            return Ok(limits.clone());
        }
        let corrupt = |e: String| IndexError::corrupt(String::from_utf8_lossy(col::SCOPE), e);
        let config: CrawlScope =
            serde_json::from_slice(&raw).map_err(|e| corrupt(e.to_string()))?;
        let seeds: Vec<url::Url> =
            config.seeds.iter().filter_map(|s| url::Url::parse(s).ok()).collect();
        let scope = Scope::new(&seeds, &config.prefixes).map_err(corrupt)?;
        let limits = Arc::new(Limits { config, scope });
        *last = Some((raw, limits.clone()));
        Ok(limits)
    }
}

#[async_trait]
impl Observer for Discover {
    async fn observe(
        &self,
        txn: &mut Transaction,
        row: &Bytes,
        _column: &Bytes,
    ) -> Result<(), ObserverError> {
        let Some(follow) = model::get_json::<Follow>(txn, row, col::FOLLOW).await? else {
            return Ok(());
        };
        let Some(raw) = txn.get(model::CONFIG_ROW, col::SCOPE).await? else {
            return Ok(()); // a replay: nothing is fetched
        };
        let limits = self.limits(raw)?;
        let (config, scope) = (&limits.config, &limits.scope);
        let mut targets: Vec<(String, Want)> = Vec::new();
        if follow.depth < config.max_depth {
            for l in &follow.links {
                targets.push((l.clone(), Want { depth: follow.depth + 1, gen: 0, hops: 0 }));
            }
        }
        if let Some(r) = &follow.redirect {
            if follow.hops < config.max_redirects {
                targets
                    .push((r.clone(), Want { depth: follow.depth, gen: 0, hops: follow.hops + 1 }));
            }
        }
        targets.retain(|(t, _)| url::Url::parse(t).is_ok_and(|u| scope.contains(&u)));
        if targets.is_empty() {
            return Ok(());
        }
        let keys: Vec<(Bytes, Bytes)> = targets
            .iter()
            .map(|(t, _)| (model::fetch_row(t), Bytes::from_static(col::WANT)))
            .collect();
        let known = txn.get_many(&keys).await?;
        let gen = txn.start_ts().0;
        for ((target, mut want), existing) in targets.into_iter().zip(known) {
            let existing: Option<Want> = existing.and_then(|e| serde_json::from_slice(&e).ok());
            match existing {
                None => want.gen = gen,
                // A shorter path: the page moves up, so what it links to may come in reach.
                Some(e) if (want.depth, want.hops) < (e.depth, e.hops) => want.gen = e.gen,
                Some(_) => continue,
            }
            txn.set(
                model::fetch_row(&target),
                Bytes::from_static(col::WANT),
                serde_json::to_vec(&want).expect("serializable"),
            );
        }
        Ok(())
    }
}
