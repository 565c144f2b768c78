"""Provisioning PostgreSQL: finding the server binaries, running a cluster from them as an
unprivileged user, the embedded default database under ``./.dbos_agent/``, and the
throwaway servers of test sessions and benchmarks. ``_storage/`` only speaks SQL to
whatever server this (or the user) provides."""
