"""The settings mypy's Django plugin loads (pyproject.toml, [tool.django-stubs]): config.settings
with a placeholder SECRET_KEY, since type-checking imports the settings with DEBUG off and without
the environment a real process has, and with the examples installed, since mypy checks their code
too (the plugin knows only the models of installed apps). Nothing runs with these settings."""

import os

os.environ.setdefault("SECRET_KEY", "placeholder-for-type-checking-only")
os.environ["INSTALL_EXAMPLES"] = "1"

from config.settings import *  # noqa: E402,F403
