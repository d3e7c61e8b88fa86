"""Integrations with model libraries and engines; they import the core, never the reverse."""
