"""Built-in workloads, each a plug-in that uses only the workload contract."""
