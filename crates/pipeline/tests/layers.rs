//! The layering of docs/architecture.md as a test: each crate of the workspace may depend
//! only on the crates below it in the picture. A crate that gains a dependency the picture
//! forbids fails here, named, with the rule it breaks. Read from `cargo metadata`, so it is
//! the manifests that are checked, not what the code happens to import.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

/// What each crate may depend on (normal dependencies, workspace crates only).
const ALLOWED: &[(&str, &[&str])] = &[
    ("perc-store", &[]),
    ("perc-oracle", &["perc-store"]),
    ("perc-txn", &["perc-oracle", "perc-store"]),
    ("perc-notify", &["perc-txn", "perc-oracle", "perc-store"]),
    ("perc-bigtable", &["perc-store"]),
    ("perc-crawl", &[]),
    // The synthetic web and the static server of a site directory: a tool beside the layers.
    ("perc-synth", &["perc-crawl"]),
    // The from-scratch index the tests and the million-page check hold the pipeline to: it
    // reads what a page says (crawl) and writes the export's record type, nothing else of the
    // observers; no transaction, no store.
    ("perc-reference", &["perc-crawl", "perc-observers"]),
    // Observers see a transaction, never a store: no perc-store, no backend.
    ("perc-observers", &["perc-notify", "perc-txn", "perc-crawl"]),
    (
        "perc-pipeline",
        &[
            "perc-observers",
            "perc-notify",
            "perc-txn",
            "perc-oracle",
            "perc-store",
            "perc-bigtable",
            "perc-crawl",
        ],
    ),
    ("perc-search", &["perc-pipeline"]),
    ("perc-serve", &["perc-pipeline", "perc-search"]),
    // The binary: the front door, the server, the search index, the synthetic web.
    ("perc-cli", &["perc-pipeline", "perc-serve", "perc-search", "perc-synth"]),
];

/// A measuring tool may reach any layer it measures.
const ANY: &[&str] = &["perc-bench"];

#[test]
fn every_crate_depends_only_on_the_layers_below_it() {
    let out = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(out.status.success(), "cargo metadata: {}", String::from_utf8_lossy(&out.stderr));
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let packages = meta["packages"].as_array().unwrap();
    let ours: BTreeSet<&str> = packages.iter().filter_map(|p| p["name"].as_str()).collect();
    let allowed: BTreeMap<&str, &[&str]> = ALLOWED.iter().copied().collect();
    let mut broken = Vec::new();
    for p in packages {
        let name = p["name"].as_str().unwrap();
        if !name.starts_with("perc-") || ANY.contains(&name) {
            continue;
        }
        let Some(may) = allowed.get(name) else {
            broken.push(format!("{name} is not in the layering: give it a place in ALLOWED"));
            continue;
        };
        for d in p["dependencies"].as_array().unwrap() {
            let dep = d["name"].as_str().unwrap();
            let normal = d["kind"].is_null();
            if normal && ours.contains(dep) && dep.starts_with("perc-") && !may.contains(&dep) {
                broken.push(format!("{name} depends on {dep}, which the layering forbids"));
            }
        }
    }
    assert!(broken.is_empty(), "docs/architecture.md's layering is broken:\n{}", broken.join("\n"));
}
