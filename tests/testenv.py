"""Loaded with ``-p tests.testenv`` before Django reads its settings: the environment the test
process and the worker and server processes it starts all share."""

import os
import secrets

os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/durable")
# Settings refuse the public development key with DEBUG off (as tests run): a key of the session's own.
os.environ.setdefault("SECRET_KEY", secrets.token_urlsafe(50))
# The suite tests the examples too (tests/test_without_examples.py starts a process without them).
os.environ["INSTALL_EXAMPLES"] = "1"
os.environ.setdefault("WORKFLOWS_MODULES", "tests.workflows_fixtures,approvals.tests.workflows")
os.environ.setdefault("AGENTS_MODULES", "tests.agents_fixtures")
# Each test process has its own queue and channel-layer prefix: its workers and servers must never
# take another's messages. Under pytest-xdist every worker is a test process with a database of its
# own (pytest-django adds the worker's id to the name), so its names are its own, not inherited.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["WORKFLOWS_QUEUE"] = f"test-{os.getpid()}"
    os.environ["CHANNELS_PREFIX"] = f"asgi-test-{os.getpid()}"
    os.environ["SIGNIN_KEY_PREFIX"] = f"signin-test-{os.getpid()}"
    os.environ["WEBHOOKS_REJECTIONS_KEY_PREFIX"] = f"webhooks-rejected-test-{os.getpid()}"
os.environ.setdefault("WORKFLOWS_QUEUE", f"test-{os.getpid()}")
os.environ.setdefault("WORKFLOWS_LEASE_SECONDS", "2")
os.environ.setdefault("WORKFLOWS_ENQUEUE_GRACE_SECONDS", "2")
os.environ.setdefault("WORKFLOWS_SWEEP_INTERVAL", "0.5")
os.environ.setdefault("CHANNELS_PREFIX", f"asgi-test-{os.getpid()}")
# Failed sign-ins are counted by address, and every test signs in from 127.0.0.1: the counts of
# other test processes must not hold this one's.
os.environ.setdefault("SIGNIN_KEY_PREFIX", f"signin-test-{os.getpid()}")
# The same for webhook deliveries' rejections, counted by source and address (webhooks.rejections).
os.environ.setdefault("WEBHOOKS_REJECTIONS_KEY_PREFIX", f"webhooks-rejected-test-{os.getpid()}")
