from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "accounts"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from accounts import checks  # noqa: F401  registers the deploy check of CLIENT_ADDRESS_HEADER
