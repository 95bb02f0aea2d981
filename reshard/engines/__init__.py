"""Engines: the work on catalogs and backups, below the runner (docs/architecture.md
"Reshard by role").

Each engine takes its connections, clients and hooks from its caller and knows nothing of
operation rows, fencing or kinds: ``copy`` (the catalog copy), ``backup`` (``pg_dump`` streamed
to S3) and ``uploads`` (open multipart uploads never outlive their operation), ``restore``
(a backup streamed into ``pg_restore``, the sandbox, and the printed restore command),
``verify`` (DuckLake-aware comparison), ``identity`` (target identity checks), ``clients``
(which ``pg_dump``/``pg_restore`` to run and how to connect it), ``testhooks`` (test-only
fault points) and ``demo_catalog`` (a DuckLake-shaped catalog for the demo, tests and benches).
"""
