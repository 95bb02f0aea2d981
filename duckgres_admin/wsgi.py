"""WSGI entry point (one process per replica, threads: the password stash is in-process)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "duckgres_admin.settings")
application = get_wsgi_application()
