"""The settings mypy's Django plugin loads (pyproject.toml, [tool.django-stubs]): config.settings
with a placeholder SECRET_KEY, since type-checking imports the settings with DEBUG off and without
the environment a real process has. Nothing runs with these settings."""

import os

os.environ.setdefault("SECRET_KEY", "placeholder-for-type-checking-only")

from config.settings import *  # noqa: E402,F403
