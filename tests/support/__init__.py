"""What the tests share: clusters and processes, servers (S3, proxies), jobs and
workloads, waits. Test files import them as ``support.NAME``."""
