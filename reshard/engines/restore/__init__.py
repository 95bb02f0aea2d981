"""The restore engine: ``stream`` (a backup object streamed from S3 into stock ``pg_restore``),
``sandbox`` (the restore test's child process) and ``command`` (the restore command printed in
the op log, safe to paste).
"""
