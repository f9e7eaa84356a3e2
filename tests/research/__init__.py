"""Research beside the bench, not in the package: the reference sessions (`cache_sessions`), what each pruning policy
costs on them against the prompt cache model (`policy_runner`, `scripts/replay --policies`) and the cheapest cut
schedule each policy is measured against (`optimum`). tests/bench.py and the tests here import them."""
