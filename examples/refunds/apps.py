from django.apps import AppConfig


class RefundsConfig(AppConfig):
    name = "examples.refunds"
    label = "refunds"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Every process that performs or reconciles (web, workers, commands) needs the adapter.
        from django.conf import settings

        from examples.refunds.services import refund_run_ended_early, refund_settled
        from ledger import HttpAdapter, register_adapter
        from ledger.hooks import on_operation_settled
        from workflows import hooks

        register_adapter(
            "payments",
            HttpAdapter(
                base_url=settings.SANDBOX_PAYMENTS_URL,
                submit_path="/v1/{action}s",  # POST /v1/refunds with Idempotency-Key
                lookup_path="/v1/{action}s?key={key}",  # GET /v1/refunds?key=K: 200 found, 404 never seen
                batch_lookup_path="/v1/{action}s/lookup",  # POST {"keys": [...]}: reconcile asks 200 at a time
            ),
        )
        on_operation_settled(refund_settled)  # a refund reconciled as paid after its run ended
        hooks.on_run_failed(refund_run_ended_early)  # the chat hears of a run that could not report
        hooks.on_run_terminated(refund_run_ended_early)
