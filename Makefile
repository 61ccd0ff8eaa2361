# make run: set up .venv and run the demo (the daemon refreshing a local demo web).
# make test: set up .venv and run the whole test suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint typecheck bench bench-vs-scrapy fuzz clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,analysis]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/refresher demo

test: $(STAMP)
	$(BIN)/python -m pytest -q -n auto --dist loadgroup

lint: $(STAMP)
	$(BIN)/ruff check refresher policies tests bench analysis
	$(BIN)/ruff format --check refresher policies tests bench analysis

typecheck: $(STAMP)
	$(BIN)/mypy refresher
	$(BIN)/mypy --strict analysis

bench: $(STAMP)
	$(BIN)/python bench/bench_daemon.py

# make bench-vs-scrapy: refresher and Scrapy side by side (bench/bench_vs_scrapy.py) from a clean
# clone: nginx and the Python docs from Debian (apt-get, as root), Scrapy in its own venv.
SCRAPY_VENV ?= /tmp/scrapy-venv
VS_SCRAPY_ARGS ?= --rounds 3
bench-vs-scrapy: $(STAMP)
	@command -v nginx >/dev/null && test -f /usr/share/doc/python3.11/html/index.html || \
		(apt-get update -q && apt-get install -y -q nginx python3.11-doc)
	@test -x $(SCRAPY_VENV)/bin/scrapy || \
		($(PYTHON) -m venv $(SCRAPY_VENV) && $(SCRAPY_VENV)/bin/pip install --quiet scrapy)
	nice -n 10 $(BIN)/python bench/bench_vs_scrapy.py --scrapy $(SCRAPY_VENV)/bin/python \
		$(VS_SCRAPY_ARGS)

# make fuzz: each parser's fuzz target in turn for FUZZ_SECONDS (atheris, niced); new inputs
# go to var/fuzz/TARGET, crashes to var/fuzz/crash-*; fuzz/corpus/TARGET is the seed corpus.
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?= robots html sitemap charset config http
fuzz: $(STAMP)
	$(BIN)/pip install --quiet -e '.[fuzz]'
	$(BIN)/python fuzz/seed.py
	@for t in $(FUZZ_TARGETS); do \
		mkdir -p var/fuzz/$$t; \
		echo "== $$t for $(FUZZ_SECONDS) s (log var/fuzz/$$t.log)"; \
		nice -n 19 $(BIN)/python fuzz/fuzz.py $$t -max_total_time=$(FUZZ_SECONDS) \
			-rss_limit_mb=2048 -artifact_prefix=var/fuzz/ -print_final_stats=1 \
			var/fuzz/$$t fuzz/corpus/$$t > var/fuzz/$$t.log 2>&1; status=$$?; \
		grep -E "^Done|number_of_executed_units|peak_rss" var/fuzz/$$t.log; \
		if [ $$status -ne 0 ]; then grep -A30 "Uncaught" var/fuzz/$$t.log; exit $$status; fi; \
	done

clean:
	rm -rf $(VENV) var build *.egg-info
