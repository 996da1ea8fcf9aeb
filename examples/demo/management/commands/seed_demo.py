"""``manage.py seed_demo``: demo logins, one onboarding run and alice's support chat to look at. Safe to run again.

The passwords are for a local demo only; the command says so when it prints them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.management.base import CommandError
from django.db import transaction

from workflows import services
from workflows.exceptions import WorkflowError
from workflows.management.base import ProjectCommand

if TYPE_CHECKING:
    from django.contrib.auth.models import User  # AUTH_USER_MODEL, as the django-stubs plugin resolves it

ADMIN = ("admin", "admin")
CUSTOMER = ("alice", "alice")
RUN_KEY = "seed-demo-onboarding"
REFUND_APPROVERS = "refund-approvers"
ONBOARDING_APPROVERS = "onboarding-approvers"  # examples.demo.workflows.APPROVERS
VIEW_ORDERS = ["refunds.view_order", "refunds.view_refundrequest"]
VIEW_OPERATIONS = ["ledger.view_externaloperation", "ledger.view_operationalrecord"]
# (username, password, staff, permissions): the refund example's cast.
REFUND_CAST: list[tuple[str, str, bool, list[str]]] = [
    ("bob", "bob", True, VIEW_ORDERS),
    (
        "carol",
        "carol",
        True,
        ["approvals.view_approvalrequest", *VIEW_OPERATIONS, *VIEW_ORDERS, "workflows.view_workflowrun"],
    ),
    (
        "dave",
        "dave",
        True,
        ["workflows.view_workflowrun", "approvals.view_approvalrequest", *VIEW_OPERATIONS, *VIEW_ORDERS],
    ),
    ("mallory", "mallory", False, []),
]
ROLES = {
    "bob": "colleague: sees orders and refund requests in the admin",
    "carol": "approver: decides refund and onboarding approvals in the admin (refund-, onboarding-approvers)",
    "dave": "auditor: sees runs, operations, records and approvals, changes nothing",
    "mallory": "another customer: sees none of alice's refunds",
}
ACCOUNTS = [("acme", "Acme Household", ["alice", "bob"]), ("globex", "Globex", ["mallory"])]
# alice's support agent in acme (examples/demo/agents.py): (kind, name), its page /chat/<kind>/<name>/.
SUPPORT_AGENT = ("support", "help")
CHAT_ASK = "I'd like a refund for order 1042 because it arrived damaged"
DEMO_ORDERS = [("1041", "25.00", [{"sku": "MUG", "qty": 1}]), ("1042", "150.00", [{"sku": "KETTLE", "qty": 1}])]
# The weekly reminder to re-assess suppliers (schedules app): Mondays at 09:00, to acme's support agent.
SUPPLIER_REMINDER: tuple[str, dict[str, object]] = (
    "supplier-reassessment-weekly",
    {
        "description": "Reminds acme's team each week to re-assess their suppliers.",
        "cron": "0 9 * * mon",
        "timezone": "UTC",
        "action": "submission",
        "account": "acme",
        "agent_kind": "support",
        "agent_name": "supplier-reviews",
        "message": "Weekly reminder: time to re-assess our suppliers. How is the assessment of Acme Metals going?",
    },
)
# Fixed, because the key is: the same key with another payload is an IdempotencyConflict.
RUN_PAYLOAD = {"customer": "alice", "plan": "team", "settle_seconds": 3, "approval_timeout_seconds": 3600}


class Command(ProjectCommand):
    help = "Create the demo users (admin, alice), an onboarding run owned by alice and her support agent; idempotent."

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
            "  Sign in as alice at /accounts/login/: her home page / lists her refunds, assessments and runs.\n"
            f"  Live page (signed in as alice): /runs/{run.id}/\n"
            "  Admin: /admin/workflows/workflowrun/. It asks the onboarding-approvers group (carol) for an\n"
            "  approval once provisioned: decide it as carol or admin in Admin -> Approval requests, or with\n"
            '  POST /api/approvals/<id>/decision {"approve": true, "version": "1"} (alice may not: four eyes).'
        )
        self.seed_refunds(alice)
        from examples.suppliers.demo import seed as seed_suppliers

        seed_suppliers(self.stdout)
        self.seed_accounts()
        self.seed_agent(alice)
        self.seed_schedule()

    def seed_accounts(self) -> None:
        """The tenants: alice and bob share the account acme, mallory has globex of her own."""
        from django.contrib.auth.models import User

        from accounts.services import account_ensure

        users = {u.username: u for u in User.objects.filter(username__in=["alice", "bob", "mallory"])}
        for slug, name, members in ACCOUNTS:
            account_ensure(slug=slug, name=name, members=[users[m] for m in members])
        self.stdout.write(
            "Accounts: " + "; ".join(f"{slug} ({', '.join(members)})" for slug, _name, members in ACCOUNTS) + "."
        )

    def seed_agent(self, alice: User) -> None:
        """alice's support agent in acme (bob, in the same account, chats with the same agent)."""
        from agents.selectors import TooManyAgents, agent_get

        kind, name = SUPPORT_AGENT
        try:
            agent = agent_get(user=alice, kind=kind, name=name, account="acme")  # created on first use
        except TooManyAgents as exc:
            raise CommandError(f"could not create alice's {kind} agent: {exc}") from None
        if agent is None:
            raise CommandError(
                f"could not create alice's {kind} agent: is its kind registered (manage.py agents list)?"
            )
        self.stdout.write(
            f"Support chat of {agent.account.slug} (signed in as alice, or bob): /chat/{kind}/{name}/\n"
            f'  Type: "{CHAT_ASK}" -- order 1042 is above the approval limit, so carol approves it in\n'
            "  Admin -> Approval requests, and the chat says when the refund is confirmed."
        )

    def seed_schedule(self) -> None:
        """The weekly supplier re-assessment reminder: a submission to acme's support agent (the
        agent that speaks about supplier assessments) in a conversation of its own. It needs the
        demo's account and agent kind, so the demo creates it; a reseed leaves it as an operator
        left it (disabled, say)."""
        from schedules.services import schedule_ensure

        name, defaults = SUPPLIER_REMINDER
        schedule, created = schedule_ensure(name=name, defaults=defaults)
        state = "created" if created else "already exists"
        where = f"/chat/{defaults['agent_kind']}/{defaults['agent_name']}/"
        self.stdout.write(
            f"Schedule {schedule.name} ({schedule.describe_spec()}, {schedule.describe_action()}): {state}, "
            f"{'enabled' if schedule.enabled else 'disabled'}.\n"
            f"  Its messages arrive in acme's chat {where}; `manage.py schedules fire {name}` sends one now."
        )

    def seed_refunds(self, alice: User) -> None:
        """The refund example's cast and alice's orders (examples/refunds). Refunds themselves are
        asked for by alice (POST /api/orders/<number>/refunds), so a reseed starts none."""
        from django.contrib.auth.models import Group

        from examples.refunds.models import Order
        from examples.refunds.services import order_create

        with transaction.atomic():
            approvers, _ = Group.objects.get_or_create(name=REFUND_APPROVERS)
            onboarding, _ = Group.objects.get_or_create(name=ONBOARDING_APPROVERS)
            created = {}
            for username, password, staff, perms in REFUND_CAST:
                user, created[username] = ensure_user(username, password, superuser=False)
                if staff and not user.is_staff:
                    user.is_staff = True
                    user.save(update_fields=["is_staff"])
                user.user_permissions.add(*permissions(perms))
                if username == "carol":
                    user.groups.add(approvers, onboarding)
            for number, amount, items in DEMO_ORDERS:
                if not Order.objects.filter(number=number).exists():
                    order_create(
                        number=number,
                        customer=alice,
                        amount=amount,
                        items=items,
                        shipping_address={"street": "1 Demo Lane", "postcode": "AB1 2CD"},
                    )
        self.stdout.write("Refund example logins (local demo only):")
        for username, password, _staff, _perms in REFUND_CAST:
            note = "" if created[username] else "  (already existed; password left as it was)"
            self.stdout.write(f"  {username:<7} / {password:<7} {ROLES[username]}{note}")
        self.stdout.write(
            "  alice's orders: "
            + ", ".join(f"{n} (£{a})" for n, a, _ in DEMO_ORDERS)
            + f"; refunds above £{settings.REFUND_APPROVAL_LIMIT} wait for {REFUND_APPROVERS}.\n"
            '  Ask for one as alice: POST /api/orders/<number>/refunds {"amount": "120.00"};\n'
            "  she reads it in words on her home page / and follows its run live from there."
        )


def permissions(names: list[str]) -> list[Permission]:
    """Permissions by "app_label.codename"; a name that does not exist is an error, not a silent gap."""
    found = []
    for name in names:
        app_label, codename = name.split(".")
        try:
            found.append(Permission.objects.get(content_type__app_label=app_label, codename=codename))
        except Permission.DoesNotExist:
            raise CommandError(f"no permission {name}: run migrate first") from None
    return found


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
