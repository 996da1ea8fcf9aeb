from django.apps import AppConfig


class SuppliersConfig(AppConfig):
    name = "examples.suppliers"
    label = "suppliers"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from examples.suppliers.services import fail_for_ended_run
        from workflows import hooks

        # Explicit, not a signal: each is called inside the transaction that ended the run (its row locked).
        hooks.on_run_terminated(fail_for_ended_run)
        hooks.on_run_failed(fail_for_ended_run)
