"""The catalog copy (spec reshard §4.9), one engine in parts, each importing only those below it:

- ``catalog``: the entry points, ``copy_catalog`` (the write fence, the sequential copy, the
  release handle the runner keeps) and ``drop_ducklake_tables`` (the rollback's drop);
- ``parallel``: N helper pairs on the primary's exported snapshot, page-range chunks;
- ``replay``: tables (re)created behind the heartbeat, constraints and indexes, the durable
  commit;
- ``pump``: one table's rows, binary ``COPY`` to binary ``COPY``, never parsed;
- ``shape``: what a DuckLake catalog may contain, checked, and the DDL composed from it;
- ``introspection``: the source's catalog rows, read from structured columns (the seam);
- ``base``: the connection type, ``CopyError``, the hooks protocol, progress and statement
  helpers.
"""
