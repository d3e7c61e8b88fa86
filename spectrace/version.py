"""The package's version: a leaf, so the recorder (its trace header) and the command line
read it without importing the package root."""

__version__ = "0.1.0"
