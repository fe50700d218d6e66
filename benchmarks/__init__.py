"""Benchmarks and profiling: each module a command, run from the repository's root as
``python -m benchmarks.NAME`` (so that ``benchmarks``, ``harness`` and the checkout's
``pipeline`` import as packages, without any ``sys.path`` edit). docs/benchmarks.md
lists them with their figures."""
