from django.apps import AppConfig


class SuppliersConfig(AppConfig):
    name = "examples.suppliers"
    label = "suppliers"
    default_auto_field = "django.db.models.BigAutoField"
