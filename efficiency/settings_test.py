"""Settings of the test suite: the deployed settings (`efficiency.settings`) with DEBUG on unless the
environment says otherwise. DEBUG defaults to false everywhere else (a process that forgets to set it runs
like a deployment); tests need the development key and plain-HTTP defaults. Set before the settings are read,
so plain `pytest` works and every process a test starts (manage.py check, gunicorn, a child poll cycle)
inherits it.
"""

import os

os.environ.setdefault("DEBUG", "true")

from efficiency.settings import *  # noqa: F403
