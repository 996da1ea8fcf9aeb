"""The API's token authentication (settings.REST_FRAMEWORK and ``ApiBase``). A module of its own:
DRF imports it while ``rest_framework.views`` loads, so it must not import that."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.utils.translation import gettext_lazy as _
from rest_framework import authentication, exceptions
from rest_framework.authtoken.models import Token

from workflows import statements

if TYPE_CHECKING:
    from django.contrib.auth.models import _User


class TokenAuthentication(authentication.TokenAuthentication):
    """DRF's ``Authorization: Token <key>``, the token and its user read by one prepared statement
    (``workflows.statements.token_with_user``): every request of another system comes through here,
    and the ORM compiled the same join on each. Answers as DRF's does (the same refusals)."""

    def authenticate_credentials(self, key: str) -> tuple[_User, Token]:
        found = statements.token_with_user(key)
        if found is None:
            raise exceptions.AuthenticationFailed(_("Invalid token."))
        token, user = found
        if not user.is_active:
            raise exceptions.AuthenticationFailed(_("User inactive or deleted."))
        return user, token
