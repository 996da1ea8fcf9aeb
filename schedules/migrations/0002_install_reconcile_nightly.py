"""Ships the nightly reconcile: ``ledger.reconcile`` every night at 02:30 UTC, enabled.

Its next due time is left NULL: the first tick works it out (a migration cannot run the app's
code). Removing the migration removes the schedule (and its firings); an operator may disable or
change it like any other.
"""

from typing import Any

from django.db import migrations

NAME = "reconcile-nightly"


def install(apps: Any, schema_editor: Any) -> None:
    Schedule = apps.get_model("schedules", "Schedule")
    Schedule.objects.get_or_create(
        name=NAME,
        defaults={
            "description": "Looks up unknown and stale ledger operations at their providers, as manage.py "
            "reconcile does; the run's result counts them and names those that need a person.",
            "enabled": True,
            "cron": "30 2 * * *",
            "timezone": "UTC",
            "action": "workflow",
            "workflow": "ledger.reconcile",
            "payload": {},
        },
    )


def uninstall(apps: Any, schema_editor: Any) -> None:
    apps.get_model("schedules", "Schedule").objects.filter(name=NAME).delete()


class Migration(migrations.Migration):
    dependencies = [("schedules", "0001_initial")]

    operations = [migrations.RunPython(install, uninstall)]
