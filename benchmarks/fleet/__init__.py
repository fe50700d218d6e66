"""The fleet simulation (``benchmarks/fleet/scale-sim``): thousands of real Dask workers
on one machine behind HAProxy, a real job through the load balancer. docs/scale.md has
its figures; tests/test_scale.py runs it small."""
