"""Liquid: the shared rules of the raw/mix views (rules), raw packs (materialize) and
`pcrfs tune` (tune)."""
