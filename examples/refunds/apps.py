from django.apps import AppConfig


class RefundsConfig(AppConfig):
    name = "examples.refunds"
    label = "refunds"
    default_auto_field = "django.db.models.BigAutoField"
