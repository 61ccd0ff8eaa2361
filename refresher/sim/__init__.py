"""Simulated webs with ground truth, for the demo, the tests and the benchmarks."""
