"""Start: how an operation comes to exist (docs/architecture.md "Reshard by role").

``operations`` (start and cancel, the API's and the admin's one entry), ``dryrun`` (the report
of every check), ``restores`` (a restore's start and dry run) and ``stash`` (the in-process
password stash the start fills and the runner pulls from). Above the kinds, whose objects
carry their own checks (``reshard.kinds.checks`` is the shared table).
"""
