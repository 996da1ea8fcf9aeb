"""Settings refuse the public development SECRET_KEY outside DEBUG, and the run command brings
its own key; the examples are installed only when asked, as the run and test commands do. Each
case imports the settings in a fresh interpreter, as a process starting would."""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def fresh_python(
    code: str, env: dict[str, str], *, unset: tuple[str, ...] = ("SECRET_KEY", "DEBUG")
) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter at the project's root: this process's environment without
    ``unset`` (what the test process itself sets), with ``env`` on top."""
    base = {key: value for key, value in os.environ.items() if key not in unset}
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**base, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def import_settings(**env: str) -> subprocess.CompletedProcess[str]:
    """``import config.settings`` with only ``env`` on top of a bare environment."""
    return fresh_python("import config.settings as s; print(s.SECRET_KEY)", env)


@pytest.mark.parametrize(
    "env",
    [
        pytest.param({}, id="no DEBUG, no key"),
        pytest.param({"DEBUG": "0"}, id="DEBUG=0, no key"),
        pytest.param({"DEBUG": "0", "SECRET_KEY": ""}, id="empty key"),
        pytest.param({"DEBUG": "0", "SECRET_KEY": "insecure-development-key-change-me"}, id="the public default"),
        pytest.param({"DEBUG": "0", "SECRET_KEY": "django-insecure-abc123"}, id="startproject's insecure key"),
    ],
)
def test_without_debug_an_unset_or_public_key_refuses_to_start(env: dict[str, str]) -> None:
    result = import_settings(**env)

    assert result.returncode != 0
    assert "django.core.exceptions.ImproperlyConfigured: SECRET_KEY is unset" in result.stderr
    assert "Set SECRET_KEY in the environment" in result.stderr  # and says how


def test_with_debug_the_development_key_is_used() -> None:
    result = import_settings(DEBUG="1")

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "insecure-development-key-change-me"


def test_without_debug_a_short_key_refuses_to_start() -> None:
    result = import_settings(DEBUG="0", SECRET_KEY="x")

    assert result.returncode != 0
    assert "SECRET_KEY is too short (1 characters; at least 32)" in result.stderr


def test_https_turns_on_secure_cookies_the_redirect_and_hsts() -> None:
    code = (
        "import config.settings as s; print(s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, "
        "s.SECURE_SSL_REDIRECT, s.SECURE_HSTS_SECONDS, s.SECURE_PROXY_SSL_HEADER)"
    )
    result = fresh_python(code, {"SECRET_KEY": "k" * 50, "HTTPS": "1"})

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True True True 3600 ('HTTP_X_FORWARDED_PROTO', 'https')"


@pytest.mark.parametrize("debug", ["0", "1"])
def test_a_key_of_its_own_is_used_with_or_without_debug(debug: str) -> None:
    result = import_settings(DEBUG=debug, SECRET_KEY="k" * 50)

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "k" * 50


def ensure_secret_key(cwd: Path, **env: str) -> str:
    """scripts/common.sh's ensure_secret_key, as scripts/run.sh calls it, in ``cwd``."""
    return ensured("ensure_secret_key", "SECRET_KEY", cwd, **env)


def ensured(function: str, variable: str, cwd: Path, **env: str) -> str:
    """What scripts/common.sh's ``function`` exports as ``variable``, called in ``cwd``."""
    base = {key: value for key, value in os.environ.items() if key != variable}
    script = f'source "{ROOT}/scripts/common.sh" && {function} && printf %s "${variable}"'
    result = subprocess.run(
        ["bash", "-c", script], cwd=cwd, env={**base, **env}, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_run_command_generates_a_key_once_keeps_it_private_and_reuses_it(tmp_path: Path) -> None:
    # when the run command starts twice in a fresh checkout
    first = ensure_secret_key(tmp_path)
    second = ensure_secret_key(tmp_path)

    # then it made one random key, in var/ (gitignored), readable by its owner only, and kept it
    key_file = tmp_path / "var" / "secret_key"
    assert len(first) >= 50 and first == second == key_file.read_text().strip()
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert "/var/" in (ROOT / ".gitignore").read_text().split()
    # and the settings accept it with DEBUG off
    assert import_settings(DEBUG="0", SECRET_KEY=first).returncode == 0
    # and another directory gets another key
    assert ensure_secret_key(tmp_path / "var") != first


def test_a_key_in_the_environment_wins_over_the_generated_one(tmp_path: Path) -> None:
    assert ensure_secret_key(tmp_path, SECRET_KEY="from-the-environment") == "from-the-environment"
    assert not (tmp_path / "var" / "secret_key").exists()


def test_the_run_command_gives_the_sandbox_and_the_settings_a_webhook_secret_of_the_machines_own(
    tmp_path: Path,
) -> None:
    # when the run command starts twice in a fresh checkout, with DEBUG on as it runs
    first = ensured("ensure_sandbox_webhook_secret", "SANDBOX_WEBHOOK_SECRET", tmp_path)
    second = ensured("ensure_sandbox_webhook_secret", "SANDBOX_WEBHOOK_SECRET", tmp_path)

    # then it made one random Standard Webhooks secret, private to the machine, and kept it
    secret_file = tmp_path / "var" / "sandbox_webhook_secret"
    assert first == second == secret_file.read_text().strip()
    assert first.startswith("whsec_") and len(base64.b64decode(first.removeprefix("whsec_"))) == 32
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    # and the settings verify the sandbox's webhooks with it, and with nothing else, DEBUG or not
    code = "import json, config.settings as s; print(json.dumps(s.WEBHOOK_SOURCES['sandbox-payments']['secrets']))"
    env = {"SECRET_KEY": "k" * 50, "INSTALL_EXAMPLES": "1", "DEBUG": "1", "SANDBOX_WEBHOOK_SECRET": first}
    result = fresh_python(code, env, unset=("WEBHOOK_SOURCES_JSON",))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [first]
    # and one in the environment wins
    (tmp_path / "x").mkdir()
    given = ensured(
        "ensure_sandbox_webhook_secret", "SANDBOX_WEBHOOK_SECRET", tmp_path / "x", SANDBOX_WEBHOOK_SECRET="s" * 20
    )
    assert given == "s" * 20 and not (tmp_path / "x" / "var").exists()


EXAMPLE_APPS = ["examples.demo", "examples.refunds", "examples.suppliers"]


@pytest.mark.parametrize(
    ("env", "installed"),
    [
        pytest.param({}, [], id="off by default"),
        pytest.param({"INSTALL_EXAMPLES": "0"}, [], id="off"),
        pytest.param({"INSTALL_EXAMPLES": "1"}, EXAMPLE_APPS, id="on"),
    ],
)
def test_the_examples_are_installed_only_when_asked(env: dict[str, str], installed: list[str]) -> None:
    code = "import json, config.settings as s; print(json.dumps([s.INSTALL_EXAMPLES, s.INSTALLED_APPS]))"
    result = fresh_python(code, {"SECRET_KEY": "k" * 50, **env}, unset=("INSTALL_EXAMPLES", "DEBUG"))

    assert result.returncode == 0, result.stderr
    on, apps = json.loads(result.stdout)
    assert on is bool(installed)
    assert [app for app in apps if app.startswith("examples.")] == installed
    assert apps[-1] == "portal"  # the top layer stays last, after the examples it reads


@pytest.mark.parametrize(
    ("argv", "loaded"),
    [
        (["celery", "-A", "config", "worker"], False),
        (["manage.py", "migrate"], False),
        (["manage.py", "runserver"], True),
    ],
    ids=["a worker", "a command", "runserver"],
)
def test_only_runserver_loads_daphnes_app_and_twisted(argv: list[str], loaded: bool) -> None:
    """A worker, beat or command has no use for Twisted, which daphne's app imports (and whose
    reactor it installs) at every start; ``manage.py runserver`` needs the app to serve ASGI."""
    code = (
        f"import sys; sys.argv = {argv!r}\n"
        "import django; django.setup()\n"
        "from config.celery import app; app.loader.import_default_modules()\n"
        "from django.conf import settings\n"
        "print('daphne' in settings.INSTALLED_APPS, any(m.startswith('twisted') for m in sys.modules))"
    )
    result = fresh_python(code, {"SECRET_KEY": "k" * 50, "DJANGO_SETTINGS_MODULE": "config.settings"})

    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(loaded), str(loaded)]


def test_the_run_test_and_type_check_commands_install_the_examples() -> None:
    # the run command exports it to every process it starts, unless told otherwise
    run_sh = (ROOT / "scripts" / "run.sh").read_text()
    assert 'export INSTALL_EXAMPLES="${INSTALL_EXAMPLES:-1}"' in run_sh
    # (and the customers' runs and the chat turns go to queues of their own, each with a worker)
    assert 'export WORKFLOWS_PUBLIC_QUEUE="${WORKFLOWS_PUBLIC_QUEUE-public}"' in run_sh
    assert 'celery -A config worker -Q "$WORKFLOWS_PUBLIC_QUEUE"' in run_sh
    assert 'export AGENTS_TURN_QUEUE="${AGENTS_TURN_QUEUE-agents}"' in run_sh
    assert 'celery -A config worker -Q "$AGENTS_TURN_QUEUE"' in run_sh
    # the test process (and the workers and servers it starts, which inherit its environment)
    assert os.environ["INSTALL_EXAMPLES"] == "1"
    from django.conf import settings

    assert settings.INSTALL_EXAMPLES is True
    assert all(app in settings.INSTALLED_APPS for app in EXAMPLE_APPS)
    # and mypy's settings, since it checks the examples' code against their models
    code = "import config.typecheck_settings as s; print(s.INSTALL_EXAMPLES)"
    base = {key: value for key, value in os.environ.items() if key not in ("INSTALL_EXAMPLES", "SECRET_KEY")}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, timeout=60, capture_output=True, text=True, env=base
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True"
