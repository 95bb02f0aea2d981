"""The per-operation reshard runner (``python manage.py reshard_runner``; spec reshard §4.1-§4.3).

Modules: ``context`` (the run context: stop/fenced flags, interruptible resources, password
slots), ``fencing`` (claim and every fenced write), ``heartbeat`` (the ownership thread),
``oplog`` (the buffered op-log writer), ``execute`` (process top level, execute and run),
``steps`` (one function per stamped step), ``rollback``, ``report`` and ``password`` (the pull).
"""
