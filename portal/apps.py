from django.apps import AppConfig


class PortalConfig(AppConfig):
    """The signed-in person's pages (sign in, sign out, home). The top layer: it may read every
    app below it (workflows < ledger < approvals < examples; the examples only where installed,
    ``settings.INSTALL_EXAMPLES``), and nothing imports it."""

    name = "portal"
    default_auto_field = "django.db.models.BigAutoField"
