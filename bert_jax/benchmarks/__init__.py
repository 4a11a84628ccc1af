"""Benchmarks: commands that measure, run by hand (`python -m bert_jax.benchmarks.<name>`), never by tests."""
