"""What several test folders share: tiny models, paths, trace builders, the engine harnesses, an OTLP receiver.

Plain modules, no fixtures (those live in tests/conftest.py). Scripts a test starts in a child
process import them too, with the repository root on ``sys.path``.
"""
