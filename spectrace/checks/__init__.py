"""Detectors: records in, findings out. Pure functions; no torch, no I/O."""
