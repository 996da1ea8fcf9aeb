from django.apps import AppConfig
from django.conf import settings


class AgentsConfig(AppConfig):
    name = "agents"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.models.signals import post_delete, post_save, pre_save
        from django.utils.module_loading import autodiscover_modules

        from accounts.models import Membership
        from agents import fibers, services
        from agents.registry import import_agent_modules
        from workflows import access, hooks

        # A turn's run terminated by anyone (a stop, staff in the admin) cancels the turn.
        hooks.on_run_terminated(services.on_run_terminated)
        # A turn's run the engine failed outside the workflow's own steps fails the turn.
        hooks.on_run_failed(services.on_run_failed)
        # A fiber's run terminated by anyone (a cancel, staff in the admin) cancels the fiber.
        hooks.on_run_terminated(fibers.on_run_terminated)
        hooks.on_run_failed(fibers.on_run_failed)
        # A member removed from an account (or the membership moved): their open chats close at once.
        for signal in (pre_save, post_save, post_delete):
            signal.connect(access.membership_changed, sender=Membership, dispatch_uid="agents.membership_changed")
        autodiscover_modules("agents")
        import_agent_modules(getattr(settings, "AGENTS_MODULES", []))
