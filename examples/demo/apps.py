from django.apps import AppConfig


class DemoConfig(AppConfig):
    name = "examples.demo"
    label = "demo"
