//! A commit flushes the store at its commit point, before anything that depends on it is
//! written. sled recovers writes it did not flush in no particular order (a later one may
//! survive an earlier one), so a commit whose secondaries, or whose run's notification clear,
//! reached the disk before its primary's commit record could be left half done by a kill.

mod common;

use std::sync::{Arc, Mutex};

use perc_store::{Call, Hook, Hooked, Mutation, Store};
use perc_txn::{Client, TxnConfig};

/// Records the store's calls, each as a short name: `cam <row>`, `put` (a batch of puts),
/// `delete` (a batch with a delete), `sync`.
#[derive(Default)]
struct Calls(Mutex<Vec<String>>);

#[async_trait::async_trait]
impl Hook for Calls {
    async fn before(&self, call: Call<'_>) {
        let name = match call {
            Call::CheckAndMutate(row) => format!("cam {}", String::from_utf8_lossy(row)),
            Call::MutateRows(batch) => {
                let deletes = batch
                    .iter()
                    .flat_map(|m| &m.mutations)
                    .any(|m| matches!(m, Mutation::Delete { .. }));
                if deletes { "delete" } else { "put" }.to_owned()
            }
            Call::Sync => "sync".to_owned(),
            _ => return,
        };
        self.0.lock().unwrap().push(name);
    }
}

impl Calls {
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

type Recorded = Arc<Hooked<Arc<dyn Store>, Calls>>;

/// Runs `body` with a client on an in-memory store whose calls are recorded.
fn recorded<F, Fut>(body: F)
where
    F: FnOnce(Recorded, Client) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let (store, oracle, clock) = common::mem_parts().await;
        let hooked = Arc::new(Hooked::new(store, Calls::default()));
        let as_store: Arc<dyn Store> = hooked.clone();
        let client = common::client(&as_store, &oracle, &clock, TxnConfig::default()).await;
        body(hooked, client).await;
    });
}

#[test]
fn a_commit_flushes_between_its_commit_point_and_its_secondaries() {
    recorded(|hooked, client| async move {
        // A notification set earlier, which this commit's replaces.
        let mut t = client.begin().await.unwrap();
        t.notify("n", "dirty");
        t.commit().await.unwrap();
        let mut t = client.begin().await.unwrap();
        for row in ["a", "b", "c"] {
            t.set(row, "x", "v");
        }
        t.notify("n", "dirty");
        hooked.hook().take();
        t.commit().await.unwrap().expect("a commit");
        let calls = hooked.hook().take();
        // The primary (row a) is prewritten, then committed: its second conditional mutation.
        let primary: Vec<usize> =
            calls.iter().enumerate().filter(|(_, c)| *c == "cam a").map(|(i, _)| i).collect();
        assert_eq!(primary.len(), 2, "a prewrite and a commit of the primary: {calls:?}");
        let after = &calls[primary[1] + 1..];
        assert_eq!(after.first().map(String::as_str), Some("sync"), "{calls:?}");
        // The notification's older cell goes only after the new one is durable.
        assert!(!calls[..primary[1]].iter().any(|c| c == "delete"), "{calls:?}");
        assert!(after.iter().any(|c| c == "delete"), "secondaries and older cells: {calls:?}");
    });
}

#[test]
fn notifications_of_a_transaction_that_writes_nothing_else_are_flushed() {
    recorded(|hooked, client| async move {
        let mut t = client.begin().await.unwrap();
        t.notify("a", "dirty");
        hooked.hook().take();
        assert_eq!(t.commit().await.unwrap(), None, "nothing written");
        let calls: Vec<String> =
            hooked.hook().take().into_iter().filter(|c| !c.starts_with("cam")).collect();
        // Set, flushed, and only then the older cell deleted: the run that asked for the
        // notification clears its own after this returns, and neither delete may survive a
        // kill that the new cell does not.
        assert_eq!(calls, ["put", "sync", "delete"]);
    });
}
