"""Benchmarks: scripts that print figures, not tests. bench/engine.py and bench/approvals.py hold the
scenarios and their figures; bench/harness.py what they share (database, worker, clean-up, timing,
tables); bench/workflows.py the workflows they run."""
