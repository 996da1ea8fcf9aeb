"""``manage.py seed_demo``: demo logins and one onboarding run to look at. Safe to run again.

The passwords are for a local demo only; the command says so when it prints them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from workflows import services
from workflows.exceptions import WorkflowError

if TYPE_CHECKING:
    from django.contrib.auth.models import User  # AUTH_USER_MODEL, as the django-stubs plugin resolves it

ADMIN = ("admin", "admin")
CUSTOMER = ("alice", "alice")
RUN_KEY = "seed-demo-onboarding"
# Fixed, because the key is: the same key with another payload is an IdempotencyConflict.
RUN_PAYLOAD = {"customer": "alice", "plan": "team", "settle_seconds": 3, "approval_timeout_seconds": 3600}


class Command(BaseCommand):
    help = "Create the demo users (admin, alice) and one demo.onboarding run owned by alice; idempotent."

    def handle(self, *args: Any, **options: Any) -> None:
        with transaction.atomic():
            admin, admin_new = ensure_user(*ADMIN, superuser=True)
            alice, alice_new = ensure_user(*CUSTOMER, superuser=False)
        # Outside the users' transaction: run_start commits the run and its enqueue on its own.
        try:
            run, run_new = services.run_start(
                workflow="demo.onboarding", payload=RUN_PAYLOAD, idempotency_key=RUN_KEY, owner=alice
            )
        except WorkflowError as exc:  # e.g. a run seeded by an older version with another payload
            raise CommandError(f"could not start the demo run: {exc}") from None
        self.stdout.write("Demo logins (local demo only; change them anywhere else):")
        for (username, password), created in ((ADMIN, admin_new), (CUSTOMER, alice_new)):
            note = "" if created else "  (already existed; password left as it was)"
            self.stdout.write(f"  {username:<6} / {password}{note}")
        state = "started" if run_new else f"already exists, {run.status}"
        self.stdout.write(f"Demo run {run.id} (demo.onboarding, owner alice): {state}.")
        self.stdout.write(
            f"  Live page (log in as alice): /runs/{run.id}/\n"
            "  Admin: /admin/workflows/workflowrun/   Approve it with:\n"
            f"  manage.py workflows send-event {run.id} approve --payload '{{\"by\": \"admin\"}}'"
        )


def ensure_user(username: str, password: str, *, superuser: bool) -> tuple[User, bool]:
    """The user, created with ``password`` if missing. An existing user is not touched, so a
    password someone changed is never reset by seeding again."""
    user_model = get_user_model()
    user, created = user_model._default_manager.get_or_create(
        username=username,
        defaults={"email": f"{username}@example.com", "is_staff": superuser, "is_superuser": superuser},
    )
    if created:
        user.set_password(password)
        user.save(update_fields=["password"])
    return user, created
