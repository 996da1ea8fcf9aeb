from django.apps import AppConfig


class ApprovalsConfig(AppConfig):
    name = "approvals"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from approvals.services import cancel_for_terminated_run
        from workflows import hooks

        # Explicit, not a signal: run_terminate calls it inside its transaction (run row locked).
        hooks.on_run_terminated(cancel_for_terminated_run)
        # A restarted run's earlier attempt no longer waits for its requests.
        hooks.on_run_restarted(cancel_for_terminated_run)
