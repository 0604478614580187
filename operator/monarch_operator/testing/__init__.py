"""Helpers for our tests and benchmarks (a loopback SSH cluster, port checks); not used by the
product: neither the operator nor the launcher imports this package."""
