from django.apps import AppConfig


class WorkflowsConfig(AppConfig):
    name = "workflows"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.conf import settings
        from django.utils.module_loading import autodiscover_modules

        from workflows.registry import import_workflow_modules

        autodiscover_modules("workflows")
        import_workflow_modules(settings.WORKFLOWS["MODULES"])
