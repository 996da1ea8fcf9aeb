from django.contrib.admin.apps import AdminConfig as DjangoAdminConfig


class AdminConfig(DjangoAdminConfig):
    """django.contrib.admin with the project's site (config.admin.AdminSite) as ``admin.site``."""

    default_site = "config.admin.AdminSite"
