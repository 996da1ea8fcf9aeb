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
        # The events that wake a run waiting for a request ("approval:<id>", keyed "approval:<id>:…")
        # are sent only by decide and supersede_pending: the run's owner may not post one.
        hooks.reserve_event_prefix("approval:", why="only the approvals app sends them; decide the request instead")
