"""Benchmarks: scripts that print figures, not tests. See bench/engine.py."""
