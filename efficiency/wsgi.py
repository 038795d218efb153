"""WSGI entry point (gunicorn efficiency.wsgi)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "efficiency.settings")
application = get_wsgi_application()
