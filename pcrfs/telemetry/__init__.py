"""Counters, Prometheus export and `pcrfs status`: what a mount tells about itself."""
