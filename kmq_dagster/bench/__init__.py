"""Benchmarks behind ``kmq bench``: each prints progress, then one JSON line of figures."""
