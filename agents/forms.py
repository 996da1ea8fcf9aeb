"""The chat's forms: starting a conversation from the site (``agents.views.chat_start``)."""

from __future__ import annotations

from typing import Any, cast

from django import forms
from django.contrib.auth.models import User

from accounts.selectors import accounts_of
from agents import selectors
from agents.registry import agent_kinds


class StartForm(forms.Form):
    """A kind, a name and one of the user's accounts: the agent that the chat page of that name
    shows, created if it is new."""

    kind = forms.ChoiceField(label="With")
    # No max_length: a browser would count it in UTF-16 units (an emoji as two) and cut the name
    # short without a word; clean_name counts characters, as the agent's column does.
    name = forms.CharField(
        label="Name",
        help_text="Your name for the conversation, such as an order number; the same name opens it again.",
    )
    account = forms.ChoiceField(label="For")

    def __init__(self, *args: Any, user: User, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        kind, account = (cast(forms.ChoiceField, self.fields[field]) for field in ("kind", "account"))
        kind.choices = [(name, name) for name in agent_kinds()]
        account.choices = [(found.slug, found.name) for found in accounts_of(user)]

    def clean_name(self) -> str:
        name: str = self.cleaned_data["name"].strip()
        if not selectors.reachable_name(name):  # the rule of every path to an agent (selectors.addressable)
            raise forms.ValidationError(f"A name is {selectors.NAME_RULE}.")
        return name
