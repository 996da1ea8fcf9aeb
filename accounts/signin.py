"""Sign-in attempts, limited: a password cannot be guessed at the speed of a script.

The portal's and the admin's sign-in forms (``SignInForm``, ``AdminSignInForm``), and the admin's
change of one's own password (which checks the old one: ``PasswordChangeForm``), count each attempt
in Redis, three ways, each for SIGNIN_WINDOW_SECONDS from its first failure:

- by the name tried and the address it came from (SIGNIN_MAX_FAILURES_PER_NAME_AND_ADDRESS): one
  person mistyping, or one machine guessing one password;
- by the address (SIGNIN_MAX_FAILURES_PER_ADDRESS): one machine trying many names with a common
  password;
- by the name (SIGNIN_MAX_FAILURES_PER_NAME): many machines guessing one account's password.

An attempt is counted before its password is checked, in one step with the check of the limits (a
script in Redis): however many arrive at once, no more than a limit allows have their password
checked. Once a count is at its limit, every attempt it covers is refused until its window ends,
uncounted and without the password being checked (a right one included: otherwise the guessing
would go on, told only when it hit), and the page says when to try again (HTTP 429, with
Retry-After). A right password takes its attempt back from the name's and the address's counts and
clears its own name-and-address count; it clears no other: that would let someone with an account
of their own reset them between guesses at another's. It also marks the browser for the account
(a signed cookie; see "the browsers an account signed in from" below): from there, the name is
counted by the browser instead, so failures from elsewhere do not lock its owner out where they
usually sign in.

A name is counted as the form reads it (NFKC, as Django's username field normalises it: a
fullwidth ``ａｌｉｃｅ`` is ``alice``), by an HMAC of it under SECRET_KEY, so Redis keeps no name. An
IPv6 address is counted by its /64 (``accounts.addresses``: behind proxies, CLIENT_ADDRESS_HEADER and
CLIENT_ADDRESS_PROXIES say where the client's address is).

If Redis cannot be reached, sign-in is not limited (it is logged): the site stays usable while Redis
is down, as the rest of it cannot do much then either.
"""

from __future__ import annotations

import logging
import math
import secrets
import unicodedata
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import redis
from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm, AdminPasswordChangeForm
from django.contrib.auth import get_user_model
from django.contrib.auth.forms import AuthenticationForm
from django.core import signing
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponseBase
from django.utils.crypto import salted_hmac

from accounts.addresses import client_address, limit_script, redis_down

logger = logging.getLogger(__name__)

TOO_MANY = "too_many_failures"

# KEYS: the counts; ARGV[1]: the window in seconds, ARGV[1 + i]: the limit of KEYS[i]. Refused (the
# milliseconds to wait, nothing counted) if a count is at its limit; else each counted, a new count
# living for the window. Redis runs a script alone: no two attempts read the same count.
BEGIN = """
local wait = 0
for i, key in ipairs(KEYS) do
  if tonumber(redis.call('GET', key) or '0') >= tonumber(ARGV[i + 1]) then
    local ttl = redis.call('PTTL', key)
    if ttl < 0 then
      redis.call('EXPIRE', key, ARGV[1])
      ttl = tonumber(ARGV[1]) * 1000
    end
    if ttl > wait then wait = ttl end
  end
end
if wait > 0 then return wait end
for _, key in ipairs(KEYS) do
  redis.call('SET', key, 0, 'EX', ARGV[1], 'NX')
  redis.call('INCR', key)
end
return 0
"""
# KEYS: the counts to take the attempt back from, then the ones to clear (ARGV[1] of them): a count
# that ended meanwhile is not made again (it would live for ever).
RIGHT = """
local cleared = tonumber(ARGV[1])
for i, key in ipairs(KEYS) do
  if i > #KEYS - cleared then
    redis.call('DEL', key)
  elseif redis.call('EXISTS', key) == 1 then
    redis.call('DECR', key)
  end
end
return 0
"""


def _name_key(name: str) -> str:
    """The name as Django's username field reads it (NFKC), under an HMAC: no name is kept in Redis,
    nor one a dictionary could find from its hash."""
    normal = unicodedata.normalize("NFKC", name)
    return salted_hmac("accounts.signin.name", normal, algorithm="sha256").hexdigest()[:32]


@dataclass(frozen=True)
class Attempt:
    """One sign-in attempt: ``name`` tried from ``address``, in a browser marked for that name
    (``device``: its id) or not."""

    name: str
    address: str | None
    device: str | None = None

    @classmethod
    def of(cls, request: HttpRequest | None, name: str) -> Attempt:
        if request is None:
            return cls(name=name, address=None)
        return cls(name=name, address=client_address(request), device=marked_for(request, name))

    def _counts(self) -> list[tuple[str, int]]:
        """(Redis key, limit) of each count this attempt is in, those a right password clears last
        (the device's, the name-and-address one); a limit of 0 is no count."""
        prefix, name = settings.SIGNIN_KEY_PREFIX, _name_key(self.name)
        pair_limit = settings.SIGNIN_MAX_FAILURES_PER_NAME_AND_ADDRESS
        counts = []
        if self.device is None:
            counts.append((f"{prefix}:name:{name}", settings.SIGNIN_MAX_FAILURES_PER_NAME))
        if self.address is not None:
            counts.append((f"{prefix}:address:{self.address}", settings.SIGNIN_MAX_FAILURES_PER_ADDRESS))
        if self.device is not None:
            # the name's own browser: in a count of its own instead of the name's, from wherever it
            # is, so that a copy of its cookie has no more guesses than one address
            counts.append((f"{prefix}:device:{self.device}:{name}", pair_limit))
        if self.address is not None:
            counts.append((f"{prefix}:pair:{name}:{self.address}", pair_limit))
        return [(key, int(limit)) for key, limit in counts if int(limit) > 0]

    def begin(self) -> int:
        """Count this attempt, or refuse it: 0 if its password may be checked now, else the seconds
        until it may be made."""
        counts = self._counts()
        if not counts:
            return 0
        window = max(1, int(settings.SIGNIN_WINDOW_SECONDS))
        try:
            wait_ms = int(limit_script(BEGIN)(keys=[key for key, _ in counts], args=[window, *(n for _, n in counts)]))
        except redis.RedisError as exc:
            redis_down(logger, "sign-in attempts are not counted, nor limited", exc)
            return 0
        return max(1, math.ceil(wait_ms / 1000)) if wait_ms > 0 else 0

    def right(self) -> None:
        """The password was right: take the attempt back, and clear its name-and-address count (and
        its browser's)."""
        keys = [key for key, _ in self._counts()]
        if not keys:
            return
        prefix = settings.SIGNIN_KEY_PREFIX
        cleared = sum(1 for key in keys if key.startswith((f"{prefix}:pair:", f"{prefix}:device:")))
        try:
            limit_script(RIGHT)(keys=keys, args=[cleared])
        except redis.RedisError as exc:
            redis_down(logger, "a right sign-in's attempt is not taken back", exc)


# --- the browsers an account signed in from -------------------------------------------------------
# A successful sign-in marks its browser with a signed cookie: a random id of the browser's, and a
# mark of each account signed in there (the last few), an HMAC of the account's id and password
# hash. An attempt at a name from a browser marked for its account is not in the name's count but
# in one of the browser's own (with the name-and-address limit): failures from elsewhere, by however
# many addresses, do not lock the owner out where they usually sign in, and a copy of the cookie
# gets no more guesses, wherever it is sent from, than one address. A new password, or the name
# passing to another account, voids the mark. The name-and-address and address counts apply as
# anywhere. Over HTTPS the cookie is ``__Host-``: no other site of the domain can set or shadow it.
DEVICE_SALT = "accounts.signin.device"
DEVICE_ACCOUNTS = 5  # a shared computer's last few
DEVICE_DAYS = 90


def device_cookie_name() -> str:
    return "__Host-signin_device" if settings.SESSION_COOKIE_SECURE else "signin_device"


def _mark(user: Any) -> str:
    return salted_hmac(DEVICE_SALT, f"{user.pk}:{user.password}", algorithm="sha256").hexdigest()[:32]


def _device(request: HttpRequest) -> tuple[str | None, list[str]]:
    """This browser's id and its accounts' marks; (None, []) for no cookie, or one that is not ours
    (forged, another key's, older than DEVICE_DAYS)."""
    value = request.COOKIES.get(device_cookie_name())
    if not value:
        return None, []
    try:
        stored = signing.loads(value, salt=DEVICE_SALT, max_age=timedelta(days=DEVICE_DAYS))
    except signing.BadSignature:
        return None, []
    if not isinstance(stored, dict) or not isinstance(stored.get("d"), str) or not isinstance(stored.get("m"), list):
        return None, []
    return stored["d"], [mark for mark in stored["m"] if isinstance(mark, str)]


def marked_for(request: HttpRequest, name: str) -> str | None:
    """The browser's id if it is marked for the account ``name`` names now, else None."""
    device, marks = _device(request)
    if device is None or not marks:
        return None
    model = get_user_model()
    user = model._default_manager.filter(**{model.USERNAME_FIELD: name}).only("pk", "password").first()
    return device if user is not None and _mark(user) in marks else None


def remember_device(request: HttpRequest | None, user: Any) -> None:
    """After a right password: the cookie the page's answer sets (``device_cookie``), this account's
    mark first."""
    if request is None:
        return
    device, marks = _device(request)
    mark = _mark(user)
    kept = [mark, *(other for other in marks if other != mark)][:DEVICE_ACCOUNTS]
    value = {"d": device or secrets.token_hex(16), "m": kept}
    request.signin_device = signing.dumps(value, salt=DEVICE_SALT)  # type: ignore[attr-defined]


def device_cookie(request: HttpRequest, response: HttpResponseBase) -> None:
    """Set the cookie ``remember_device`` prepared, if a sign-in succeeded in this request."""
    value = getattr(request, "signin_device", None)
    if value:
        response.set_cookie(
            device_cookie_name(),
            value,
            max_age=DEVICE_DAYS * 86400,
            secure=settings.SESSION_COOKIE_SECURE,
            httponly=True,
            samesite="Lax",
        )


def wait_text(seconds: int) -> str:
    if seconds < 90:
        return f"{seconds} seconds"
    return f"{math.ceil(seconds / 60)} minutes"


def refusal(wait: int, what: str) -> ValidationError:
    return ValidationError(
        f"Too many failed {what}. Try again in %(wait)s.", code=TOO_MANY, params={"wait": wait_text(wait)}
    )


class LimitedSignIn(AuthenticationForm):
    """Django's sign-in form, with the attempts counted and limited (see the module's docstring)."""

    retry_after = 0

    def clean(self) -> dict[str, Any]:
        name, password = self.cleaned_data.get("username"), self.cleaned_data.get("password")
        if not name or not password:
            return super().clean()  # nothing is tried: the fields' own errors
        attempt = Attempt.of(self.request, name)
        self.retry_after = attempt.begin()
        if self.retry_after:
            raise refusal(self.retry_after, "sign-ins")
        try:
            cleaned = super().clean()
        finally:
            # authenticate() found the user: the password was right, whether or not this form then
            # lets them in (the admin's refuses a customer; that is no guess)
            if self.user_cache is not None:
                attempt.right()
        remember_device(self.request, self.get_user())
        return cleaned

    def refused(self) -> int:
        """Seconds to wait if this form was refused for too many failures, else 0."""
        return self.retry_after if self.has_error("__all__", TOO_MANY) else 0


def answered_refused(response: HttpResponseBase, form: Any) -> None:
    """Make a page's answer 429, with Retry-After, if its form was refused for too many failures."""
    wait = form.refused() if isinstance(form, LimitedSignIn | PasswordChangeForm) else 0
    if wait:
        response.status_code = 429
        response["Retry-After"] = str(wait)


class SignInForm(LimitedSignIn):
    """The portal's (``/accounts/login/``)."""


class AdminSignInForm(LimitedSignIn, AdminAuthenticationForm):
    """The admin's: staff only, as Django's admin form, and limited the same way."""


class PasswordChangeForm(AdminPasswordChangeForm):
    """The admin's change of one's own password: its check of the old password is a sign-in's, counted
    and limited with them (a stolen session must not make it a way to guess at full speed)."""

    retry_after = 0

    def __init__(self, user: Any, *args: Any, request: HttpRequest | None = None, **kwargs: Any) -> None:
        super().__init__(user, *args, **kwargs)
        self.request = request

    def clean_old_password(self) -> str:
        attempt = Attempt.of(self.request, self.user.get_username())
        self.retry_after = attempt.begin()
        if self.retry_after:
            raise refusal(self.retry_after, "password checks")
        old_password: str = super().clean_old_password()
        attempt.right()
        return old_password

    def refused(self) -> int:
        return self.retry_after if self.has_error("old_password", TOO_MANY) else 0
