# Developer shortcuts. Everything assumes the virtual environment from the README is active.
.PHONY: test lint bench

test:
	bash scripts/test.sh

lint:
	ruff format --check . && ruff check . && mypy && lint-imports

# Every benchmark, one after the other, printing its figures (about 20 minutes on 2 cores).
bench:
	python benchmarks/ingest.py --events 200000 --runs 3
	python benchmarks/evaluation.py
	python benchmarks/replay_speed.py --lengths 1000000 5000000 --runs 3
	python benchmarks/replay_speed.py --shape sparse --runs 3
	python benchmarks/shards.py --replicas 1 2 --json
	python benchmarks/latency.py --rates 1000 10000 50000 100000 --trials 20 --rounds 3
	python benchmarks/gc_pauses.py --events 300000 --runs 3
	python benchmarks/scale.py --seconds 90
	python benchmarks/scraping.py scrape --rounds 60
	python benchmarks/scraping.py otlp --messages 20000 --runs 3
	ebbtide simulate examples/scenario-small.yaml --policy policies/library/balanced.yaml \
		--duration 1h --burst 30m:15m:6 --seed 1 --out out/compare --compare
