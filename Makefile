# Thin aliases; logic that outgrows a line belongs in Rust.
CARGO ?= cargo

.PHONY: run deps test lint bench golden

# Serve the bundled demo site on 127.0.0.1, crawl and index it into ./data, print answers.
run:
	$(CARGO) run --release -p perc-cli -- --data ./data demo

# What the tests need beyond cargo: nextest runs them (checked first, before minutes of
# building); the WARC tests check perc's WARCs with warcio, an independent validator from
# Python's index; the status page's test drives Debian's chromium through chromedriver; the
# README's examples, run as written, use curl.
# Fails, naming what is missing, if any cannot be had.
deps:
	@$(CARGO) nextest --version >/dev/null 2>&1 \
	  || { echo "make deps: cargo-nextest is missing (cargo install cargo-nextest --locked)" >&2; exit 1; }
	python3 -c 'import warcio' 2>/dev/null || python3 -m pip install --quiet warcio \
	  || python3 -m pip install --quiet --break-system-packages warcio
	command -v chromedriver >/dev/null 2>&1 && command -v curl >/dev/null 2>&1 \
	  || { export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -q chromium chromium-driver curl >/dev/null 2>&1 \
	  || { apt-get update -q && apt-get install -y -q chromium chromium-driver curl; }; }
	@for t in chromium chromedriver curl; do command -v $$t >/dev/null \
	  || { echo "make deps: $$t is missing (Debian's chromium, chromium-driver, curl)" >&2; exit 1; }; done

# Every test, every backend, every feature.
# (Doc tests first, so that the run closes with nextest's summary of every test.)
test: deps
	$(CARGO) test --workspace --all-features --doc --quiet
	$(CARGO) nextest run --workspace --all-features --no-fail-fast

lint:
	$(CARGO) clippy --workspace --all-targets --all-features -- -D warnings
	$(CARGO) fmt --all --check

# (perc-bench's serve suite runs the perc binary beside it.)
bench:
	$(CARGO) build --release -p perc-cli
	$(CARGO) run --release -p perc-bench -- all

# Rewrite the recorded output of the golden scripts; review the diff before committing.
golden:
	UPDATE_GOLDENFILES=1 $(CARGO) test -p perc-txn --test golden
	UPDATE_GOLDENFILES=1 $(CARGO) test -p perc-cli --test e2e
