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
use async_trait::async_trait;
use bytes::Bytes;
use perc_crawl::Scope;
use perc_notify::{Observer, ObserverError};
use perc_txn::Transaction;

use crate::model::{self, col, CrawlScope, Follow, Want};

pub struct Discover;

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
        let Some(config) =
            model::get_json::<CrawlScope>(txn, model::CONFIG_ROW, col::SCOPE).await?
        else {
            return Ok(()); // a replay: nothing is fetched
        };
        let seeds: Vec<url::Url> =
            config.seeds.iter().filter_map(|s| url::Url::parse(s).ok()).collect();
        let scope = Scope::new(&seeds, &config.prefixes)
            .map_err(|e| IndexError::corrupt(String::from_utf8_lossy(col::SCOPE), e))?;
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
