"""The API's gunicorn settings as shipped (``gunicorn -c python:duckgres_admin.gunicorn_conf``).

ONE worker process per replica, threads for concurrency: the reshard password stash lives in
that process's memory (spec reshard §4.17), so a second worker process would answer a runner's
pull with 404 half of the time. The container image and ``k8s/api.yaml`` both start gunicorn
with this module; change a value here, not on a command line.

Logging (docs/logging.md): ``logconfig_dict`` sends gunicorn's error and access logs through
the project's JSON formatter, like every other record of the process: one scrubbed JSON line
each, on stderr (``accesslog``/``errorlog`` keep ``-``, but the handlers are those of
``logconfig_dict``). Building it loads the Django settings in the master, so a bad environment
stops gunicorn before it binds.
"""

from __future__ import annotations

import os

from duckgres_admin.logs import gunicorn_logconfig_dict

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "duckgres_admin.settings")

bind = os.environ.get("DUCKGRES_HTTP_BIND", "0.0.0.0:8080")
workers = 1
threads = 16
# A request is killed after this long (a lease grant or a password pull takes milliseconds; the
# longest legitimate request is an admin page over many operations).
timeout = 120
# On SIGTERM, in-flight requests get this long before the process exits.
graceful_timeout = 30
keepalive = 5
accesslog = "-"
errorlog = "-"
logconfig_dict = gunicorn_logconfig_dict()

# No runtime control socket: nothing may change the worker count of a running API (the password
# stash needs exactly one worker), and the root filesystem may be read-only.
control_socket_disable = True
