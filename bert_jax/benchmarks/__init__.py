"""Benchmarks: commands that measure, run by hand (`python -m bert_jax.benchmarks.<name>`), each with its command,
machine, date and figures in docs/benchmarks.md. Tests never run a measurement; they check what one builds on (its
contestants' configs, its writers, the reference loops it compares with)."""
