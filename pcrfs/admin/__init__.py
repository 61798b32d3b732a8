"""Offline tools over a built dataset: verify, push, export, quality, the size table."""
