from django.apps import AppConfig


class SuppliersConfig(AppConfig):
    name = "examples.suppliers"
    label = "suppliers"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from examples.suppliers.services import fail_for_terminated_run
        from workflows import hooks

        # Explicit, not a signal: run_terminate calls it inside its transaction (run row locked).
        hooks.on_run_terminated(fail_for_terminated_run)
