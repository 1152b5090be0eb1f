"""Benchmarks: dataset runners, metrics and reports. Nothing in the library imports this."""
