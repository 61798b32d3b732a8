"""Turning an ImageFolder tree into a PCR dataset (`pcrfs build`)."""
