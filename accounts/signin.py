"""Sign-in attempts, limited: a password cannot be guessed at the speed of a script.

The portal's and the admin's sign-in forms (``SignInForm``, ``AdminSignInForm``) count each failed
attempt in Redis, three ways, each for SIGNIN_WINDOW_SECONDS from its first failure:

- by the name tried and the address it came from (SIGNIN_MAX_FAILURES_PER_NAME_AND_ADDRESS): one
  person mistyping, or one machine guessing one password;
- by the address (SIGNIN_MAX_FAILURES_PER_ADDRESS): one machine trying many names with a common
  password;
- by the name (SIGNIN_MAX_FAILURES_PER_NAME): many machines guessing one account's password.

Once a count reaches its limit, every attempt it covers is refused until its window ends, without
the password being checked (a right one included: otherwise the guessing would go on, told only when
it hit), and the page says when to try again (HTTP 429, with Retry-After). A sign-in that succeeds
clears only its own name-and-address count: clearing the others would let someone with an account
of their own reset them between guesses at another's.

An IPv6 address is counted by its /64, the block one machine is usually given. Behind a proxy every
request comes from the proxy's address: CLIENT_ADDRESS_HEADER names the header the proxy puts the
client's address in.

If Redis cannot be reached, sign-in is not limited (it is logged): the site stays usable while Redis
is down, as the rest of it cannot do much then either.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import math
import os
import unicodedata
from dataclasses import dataclass
from typing import Any

import redis
from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponseBase

logger = logging.getLogger(__name__)

TOO_MANY = "too_many_failures"

_client: tuple[int, redis.Redis] | None = None


def _redis() -> redis.Redis:
    """One client per process, with short timeouts: a sign-in must not hang on Redis."""
    global _client
    if _client is None or _client[0] != os.getpid():
        _client = (os.getpid(), redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2))
    return _client[1]


def client_address(request: HttpRequest) -> str:
    """The address a request came from: the last one in CLIENT_ADDRESS_HEADER when that is set (the
    one the proxy in front added; earlier ones the client may have written itself), else the
    connection's. An IPv6 address as its /64."""
    address = str(request.META.get("REMOTE_ADDR") or "")
    header = settings.CLIENT_ADDRESS_HEADER
    if header:
        forwarded = [part.strip() for part in request.headers.get(header, "").split(",") if part.strip()]
        if forwarded:
            address = forwarded[-1]
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return address[:64]  # not an address (a test client's, a misconfigured header's): counted as it is
    if isinstance(parsed, ipaddress.IPv6Address):
        if parsed.ipv4_mapped is not None:
            return str(parsed.ipv4_mapped)
        return str(ipaddress.IPv6Network(f"{parsed}/64", strict=False))
    return str(parsed)


def _name_key(name: str) -> str:
    """The name as counted: case and compatibility forms folded (``Alice`` and ``ａｌｉｃｅ`` are one
    name's guesses), hashed so no name is kept in Redis."""
    folded = unicodedata.normalize("NFKC", name).casefold().strip()
    return hashlib.sha256(folded.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Attempt:
    """One sign-in attempt: ``name`` tried from ``address``."""

    name: str
    address: str | None

    @classmethod
    def of(cls, request: HttpRequest | None, name: str) -> Attempt:
        return cls(name=name, address=client_address(request) if request is not None else None)

    def _counts(self) -> list[tuple[str, int]]:
        """(Redis key, limit) of each count this attempt is in; a limit of 0 is no count."""
        prefix, name = settings.SIGNIN_KEY_PREFIX, _name_key(self.name)
        counts = [(f"{prefix}:name:{name}", settings.SIGNIN_MAX_FAILURES_PER_NAME)]
        if self.address is not None:
            counts += [
                (f"{prefix}:pair:{name}:{self.address}", settings.SIGNIN_MAX_FAILURES_PER_NAME_AND_ADDRESS),
                (f"{prefix}:address:{self.address}", settings.SIGNIN_MAX_FAILURES_PER_ADDRESS),
            ]
        return [(key, limit) for key, limit in counts if limit > 0]

    def refused_for(self) -> int:
        """Seconds until this attempt may be made, or 0 if it may be now."""
        counts = self._counts()
        if not counts:
            return 0
        try:
            with _redis().pipeline(transaction=False) as pipe:
                for key, _ in counts:
                    pipe.get(key)
                    pipe.pttl(key)
                replies = pipe.execute()
        except redis.RedisError:
            logger.exception("sign-in attempts cannot be counted (Redis); this one is not limited")
            return 0
        waits = [
            max(1, math.ceil(int(ttl) / 1000))
            for (_, limit), failures, ttl in zip(counts, replies[::2], replies[1::2], strict=True)
            if failures is not None and int(failures) >= limit
        ]
        return max(waits, default=0)

    def failed(self) -> None:
        """Count a failure in each count, each window starting at its first failure."""
        window = max(1, int(settings.SIGNIN_WINDOW_SECONDS))
        try:
            with _redis().pipeline(transaction=True) as pipe:
                for key, _ in self._counts():
                    pipe.incr(key)
                    pipe.expire(key, window, nx=True)
                pipe.execute()
        except redis.RedisError:
            logger.exception("a failed sign-in could not be counted (Redis)")

    def succeeded(self) -> None:
        counts = [key for key, _ in self._counts() if ":pair:" in key]
        if not counts:
            return
        try:
            _redis().delete(*counts)
        except redis.RedisError:
            logger.exception("a sign-in's failures could not be cleared (Redis)")


def wait_text(seconds: int) -> str:
    if seconds < 90:
        return f"{seconds} seconds"
    return f"{math.ceil(seconds / 60)} minutes"


class LimitedSignIn(AuthenticationForm):
    """Django's sign-in form, with the attempts counted and limited (see the module's docstring)."""

    def clean(self) -> dict[str, Any]:
        name, password = self.cleaned_data.get("username"), self.cleaned_data.get("password")
        if not name or not password:
            return super().clean()  # nothing is tried: the fields' own errors
        attempt = Attempt.of(self.request, name)
        wait = attempt.refused_for()
        if wait:
            self.retry_after = wait
            raise ValidationError(
                "Too many failed sign-ins. Try again in %(wait)s.",
                code=TOO_MANY,
                params={"wait": wait_text(wait)},
            )
        try:
            cleaned = super().clean()
        except ValidationError:
            attempt.failed()
            raise
        attempt.succeeded()
        return cleaned

    def refused(self) -> int:
        """Seconds to wait if this form was refused for too many failures, else 0."""
        return int(getattr(self, "retry_after", 0)) if self.has_error("__all__", TOO_MANY) else 0


def answered_refused(response: HttpResponseBase, form: Any) -> None:
    """Make a sign-in page's answer 429, with Retry-After, if its form was refused for too many failures."""
    wait = form.refused() if isinstance(form, LimitedSignIn) else 0
    if wait:
        response.status_code = 429
        response["Retry-After"] = str(wait)


class SignInForm(LimitedSignIn):
    """The portal's (``/accounts/login/``)."""


class AdminSignInForm(LimitedSignIn, AdminAuthenticationForm):
    """The admin's: staff only, as Django's admin form, and limited the same way."""
