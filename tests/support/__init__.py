"""Scenarios and tools shared by tests and benchmarks: the chaos run, the failover
workload and its pg_auto_failover formation, hostile URL forms, web load clients."""
