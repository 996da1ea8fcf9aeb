from django.apps import AppConfig

from workflows.conf import conf


class WorkflowsConfig(AppConfig):
    name = "workflows"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.utils.module_loading import autodiscover_modules

        from workflows import (
            access,
            checks,  # noqa: F401  (registers the system checks)
        )
        from workflows.apis import schema  # noqa: F401  (registers the OpenAPI schema's extensions)
        from workflows.registry import import_workflow_modules

        access.connect_signals()  # a user's sockets check again at once when their access changes
        autodiscover_modules("workflows")
        import_workflow_modules(conf()["MODULES"])
