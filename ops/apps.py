from django.apps import AppConfig


class OpsConfig(AppConfig):
    name = "ops"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from ops import checks  # noqa: F401  registers the deploy check of METRICS_TOKEN
