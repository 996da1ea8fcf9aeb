"""The embedded model: deterministic rules that speak the refund and supplier domains, no network.

It reads the last user message and the results of the tools it called since (the ``tool``
messages after it), and either calls the next tool or answers in words, word by word:

- "I'd like a refund for order 1042 because it arrived damaged": ``find_order``, then
  ``request_refund`` for the refundable amount (an amount in the message with its currency, e.g.
  "£20" or "5 CHF", wins), then a sentence with the result; any other number in it is asked about
  first, never guessed at;
- "what's happening with my refund": ``refund_status``, then the requests in words;
- "how is the assessment of Acme going": ``assessment_status``, then the assessments in words;
- anything else: what it can do here.

It calls only tools present in the request, and says so in words when a tool it would need is
missing. The same conversation always gives the same events: a tool call's id is made of the turn
(the number of user messages) and the round (the assistant messages since the last user message)
and the tool's name, so a recovered turn that runs a round again asks for the same call, and a
recovered answer (``ModelRequest.prefix``) continues with the same text.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from django.conf import settings

from agents.providers.base import ChatMessage, Finish, ModelEvent, ModelRequest, TextDelta, ToolCall

# What the customer asks for.
REFUND_WORD = re.compile(r"\brefund(?:s|ed|ing)?\b|\bmoney back\b", re.IGNORECASE)
ASSESSMENT_WORD = re.compile(r"\b(?:assessment|supplier|vendor)s?\b", re.IGNORECASE)
STATUS_QUESTION = re.compile(
    r"\b(?:what'?s|what\s+is)\s+happening\b|\bstatus\b|\bhow(?:'s|\s+is|\s+are)\b|\bwhere(?:'s|\s+is|\s+are)\b"
    r"|\bany\s+news\b|\bupdate\b|\bprogress\b|\bgoing\b",
    re.IGNORECASE,
)
# The details in it.
ORDER_NUMBER = re.compile(r"(?:\border\b\s*(?:number|no\.?)?\s*#?\s*|#)(?P<number>\d[\w-]*)", re.IGNORECASE)
REQUEST_ID = re.compile(r"\brequest\s*(?:number|no\.?)?\s*#?\s*(?P<id>\d+)\b", re.IGNORECASE)
# An amount: ASCII digits, commas only between groups of three ("1,250.00"), at most two decimals.
NUMBER = r"(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]{1,2})?"
# Currencies written as their ISO codes besides the three with symbols and words.
ISO_CODES = "chf|jpy|cad|aud|nzd|sek|nok|dkk|pln|czk|huf|sgd|hkd|inr|cny|zar|mxn|brl"
# What may follow an amount's digits to name its currency ("20 pounds", "5 CHF").
CURRENCY_WORDS = rf"gbp|eur|usd|pounds?|euros?|dollars?|{ISO_CODES}"
AMOUNT = re.compile(
    rf"(?P<symbol>[£$€])\s*(?P<value>{NUMBER})(?![0-9]|[.,][0-9])"
    rf"|\b(?P<bare>{NUMBER})\s*(?P<word>{CURRENCY_WORDS})\b",
    re.IGNORECASE,
)
# Any number written: one that is not the order's, a request's or an amount read above is asked
# about, never guessed at ("a refund of 1.00 for order 1041" is not a refund of all of it).
ANY_NUMBER = re.compile(r"\d[\d.,]*\d|\d")
# Anything written as money, well formed or not ("-5 pounds", "£1e1", "£5.005", "£12,50", "−5",
# "£５"): an amount the customer wrote that AMOUNT does not read exactly is asked about, never read
# as another amount.
SIGN = "+\u2212\u2012\u2013\u2014-"  # plus, minus and dashes; the hyphen last, literal in a class
MONEY_ATTEMPT = re.compile(
    rf"(?P<symbolled>[{SIGN}]?\s*[£$€]\s*[{SIGN}]?[\d.,eE{SIGN}]*\d[\d.,eE{SIGN}]*)"
    rf"|(?P<worded>[{SIGN}]?\d[\d.,eE{SIGN}]*)\s*(?:{CURRENCY_WORDS})\b",
    re.IGNORECASE,
)
CLEAN_AMOUNT = re.compile(rf"(?:[£$€]\s*)?{NUMBER}")
# The currency an amount was written in, by its symbol or word.
CURRENCY_OF = {
    "£": "GBP",
    "$": "USD",
    "€": "EUR",
    "gbp": "GBP",
    "pound": "GBP",
    "pounds": "GBP",
    "usd": "USD",
    "dollar": "USD",
    "dollars": "USD",
    "eur": "EUR",
    "euro": "EUR",
    "euros": "EUR",
    **{code: code.upper() for code in ISO_CODES.split("|")},
}
REASON = re.compile(
    r"\b(?:because|since|due\s+to|reason(?:\s+is)?:?)\s+(?:it(?:'s|\s+was|\s+is)?\s+|they\s+)?(?P<reason>[^.!?]+)",
    re.IGNORECASE,
)
SUPPLIER = re.compile(
    r"\b(?:(?:assessment|review)\s+(?:of|for)\s+(?:the\s+)?(?:supplier\s+)?|supplier\s+)(?P<name>[\w&'.-]+(?:\s+[\w&'.-]+)*?)"
    r"(?=\s+(?:going|doing|coming|getting|progressing|now|please|is|at)\b|\s*[?!,;]|\s*\.?\s*$)",
    re.IGNORECASE,
)

CURRENCY_SYMBOLS = {"GBP": "£", "EUR": "€", "USD": "$"}
# Statuses after which a request no longer changes: no promise to report a change.
FINAL_STATUSES = {"confirmed", "refunded", "rejected", "expired", "failed", "cancelled", "canceled"}
NO_REASON = "not given"
WHICH_ORDER = (
    'Which order? Tell me its number, for example "a refund for order 1042 because it arrived damaged",'
    ' or ask "what\'s happening with my refund?" to hear how your refunds are going.'
)


@dataclass(frozen=True)
class Situation:
    """What the rules decide from: the customer's last message and this turn's tool results so far."""

    text: str
    results: dict[str, dict[str, Any]]  # tool name -> its latest result in this turn
    tools: frozenset[str]
    turn: int  # user messages so far
    round: int  # 1 + assistant messages since the last user message


@dataclass(frozen=True)
class Call:
    """The rules want a tool called."""

    name: str
    arguments: dict[str, Any]


Decision = Call | str


class RulesProvider:
    """The embedded default model: no network, the same events for the same conversation."""

    name = "rules"

    def stream(self, request: ModelRequest) -> Iterator[ModelEvent]:
        situation = situation_of(request)
        decision = decide(situation)
        if isinstance(decision, Call):
            yield ToolCall(id=call_id(situation, decision.name), name=decision.name, arguments=decision.arguments)
            yield Finish("tool_calls")
            return
        delay = float(getattr(settings, "AGENTS_RULES_WORD_DELAY", 0))
        for word in words(rest_after(decision, request.prefix)):
            if delay > 0:
                time.sleep(delay)
            yield TextDelta(word)
        yield Finish("stop")


def call_id(situation: Situation, tool: str) -> str:
    """Stable for a round: a recovered turn that runs the round again asks for the same call."""
    return f"rules-{situation.turn}-{situation.round}-{tool}"


def words(text: str) -> list[str]:
    """The text in pieces of one word and the spaces after it (spaces before the first word lead it)."""
    return re.findall(r"\s*\S+\s*|\s+", text)


def rest_after(text: str, prefix: str) -> str:
    """What is left to say once ``prefix`` was delivered: the text after their common beginning."""
    common = 0
    for delivered, planned in zip(prefix, text):
        if delivered != planned:
            break
        common += 1
    return text[common:]


# -- reading the conversation


def situation_of(request: ModelRequest) -> Situation:
    messages = request.messages
    last_user = max((i for i, m in enumerate(messages) if m.role == "user"), default=-1)
    since = messages[last_user + 1 :]
    return Situation(
        text=messages[last_user].content if last_user >= 0 else "",
        results=tool_results(since),
        tools=frozenset(tool.name for tool in request.tools),
        turn=sum(1 for m in messages if m.role == "user"),
        round=1 + sum(1 for m in since if m.role == "assistant"),
    )


def tool_results(messages: tuple[ChatMessage, ...]) -> dict[str, dict[str, Any]]:
    """Each tool's latest result; a tool message names its tool, or its call does."""
    names = {call.id: call.name for m in messages for call in m.tool_calls}
    results: dict[str, dict[str, Any]] = {}
    for message in messages:
        if message.role == "tool":
            results[message.name or names.get(message.tool_call_id, "")] = parse_result(message.content)
    return results


def parse_result(content: str) -> dict[str, Any]:
    """A tool's result as a JSON object; anything else is reported as the tool's error."""
    try:
        value = json.loads(content)
    except ValueError:
        return {"error": content.strip() or "no result"}
    return value if isinstance(value, dict) else {"error": content.strip()}


# -- deciding


def decide(situation: Situation) -> Decision:
    text = situation.text
    if ASSESSMENT_WORD.search(text) or (SUPPLIER.search(text) and not REFUND_WORD.search(text)):
        return assessment(situation)  # "the review of Acme" too, but not "the review of my refund"
    if REFUND_WORD.search(text):
        if STATUS_QUESTION.search(text):
            return refund_status(situation)
        if ORDER_NUMBER.search(text):
            return refund(situation)
        return WHICH_ORDER
    return help_text(situation.tools)


def refund(situation: Situation) -> Decision:
    """Look the order up, ask for the refund, say what became of it."""
    unreadable = unreadable_amount(situation.text)
    if unreadable is not None:
        return (
            f"I couldn't read the amount {unreadable!r}. Please write it as a positive amount with at most "
            "two decimal places, e.g. £20.00, or leave it out to ask for all that is left to refund."
        )
    stray = stray_number(situation.text)
    if stray is not None:
        return (
            f"I'm not sure what {stray!r} is. If it is the amount to refund, please write it with its currency,"
            " e.g. £20.00 or 20 GBP; to ask for all that is left to refund, leave out every number but the order's."
        )
    number = match_group(ORDER_NUMBER, situation.text, "number")
    order = situation.results.get("find_order")
    if order is None:
        if "find_order" not in situation.tools:
            return "I can't look up orders here, so I can't ask for a refund."
        return Call("find_order", {"number": number})
    if "error" in order:
        return f"I couldn't find order {number}: {error_text(order)}."
    currency = str(order.get("currency") or "")
    refundable = decimal_or_none(order.get("refundable"))
    if refundable is not None and refundable <= 0:
        return f"Order {number} has nothing left to refund."
    written_in = currency_written(situation.text)
    if written_in and currency and written_in != currency.upper():
        return (
            f"Order {number} was paid in {currency}, and you wrote an amount in {written_in}. "
            f"Please write the amount in {currency}, or leave it out to ask for all that is left to refund."
        )
    asked = requested_amount(situation.text)
    amount = asked if asked is not None else refundable
    refunded = situation.results.get("request_refund")
    if refunded is None:
        if "request_refund" not in situation.tools:
            return (
                f"Order {number} can be refunded up to {money(refundable, currency)}, but I can't ask for refunds here."
            )
        return Call(
            "request_refund", {"order": number, "amount": amount_text(amount), "reason": reason_of(situation.text)}
        )
    if "error" in refunded:
        return f"I couldn't ask for a refund on order {number}: {error_text(refunded)}."
    status = status_words(refunded.get("status"))
    done = decimal_or_none(refunded.get("amount"))
    asked_for = money(done if done is not None else amount, currency)
    sentence = f"I've asked for a refund of {asked_for} on order {number}. It is {status}"
    return sentence + ("." if status in FINAL_STATUSES else "; I'll tell you here when it changes.")


def refund_status(situation: Situation) -> Decision:
    """The customer's refund requests in words (one request, or one order's, when named)."""
    result = situation.results.get("refund_status")
    if result is None:
        if "refund_status" not in situation.tools:
            return "I can't look up refund requests here."
        request_id = match_group(REQUEST_ID, situation.text, "id")
        return Call("refund_status", {"request_id": int(request_id)} if request_id else {})
    if "error" in result:
        return f"I couldn't look up your refunds: {error_text(result)}."
    requests = [r for r in result.get("requests") or [] if isinstance(r, dict)]
    number = match_group(ORDER_NUMBER, situation.text, "number")
    if number:
        requests = [r for r in requests if str(r.get("order")) == number]
    if not requests:
        return f"I found no refund requests for order {number}." if number else "I found no refund requests of yours."
    return " ".join(
        f"Your refund of {money(decimal_or_none(r.get('amount')), str(r.get('currency') or ''))} on order"
        f" {r.get('order')} (request {r.get('request_id')}) is {status_words(r.get('status'))}."
        for r in requests
    )


def assessment(situation: Situation) -> Decision:
    """A supplier's assessments in words."""
    supplier = match_group(SUPPLIER, situation.text, "name")
    if not supplier:
        return 'Which supplier? Ask me, for example, "how is the assessment of Acme going?"'
    result = situation.results.get("assessment_status")
    if result is None:
        if "assessment_status" not in situation.tools:
            return "I can't look up supplier assessments here."
        return Call("assessment_status", {"supplier": supplier})
    if "error" in result:
        return f"I couldn't look up the assessment of {supplier}: {error_text(result)}."
    found = [a for a in result.get("assessments") or [] if isinstance(a, dict)]
    if not found:
        return f"I found no assessment of {supplier}."
    return " ".join(
        f"The assessment of {a.get('supplier') or supplier} (number {a.get('id')}) is {status_words(a.get('status'))}."
        for a in found
    )


def help_text(tools: frozenset[str]) -> str:
    """What the customer can ask here: only what the tools present allow."""
    can = []
    if {"find_order", "request_refund"} <= tools:
        can.append('ask for a refund ("a refund for order 1042 because it arrived damaged")')
    if "refund_status" in tools:
        can.append('tell you how your refunds are going ("what\'s happening with my refund?")')
    if "assessment_status" in tools:
        can.append('tell you how a supplier\'s assessment is going ("how is the assessment of Acme going?")')
    if not can:
        return "Hello! I can't look anything up here, but I'm listening."
    listed = can[0] if len(can) == 1 else ", ".join(can[:-1]) + " and " + can[-1]
    return f"Hello! I can {listed}."


# -- the details


def match_group(pattern: re.Pattern[str], text: str, group: str) -> str:
    found = pattern.search(text)
    return found.group(group).strip() if found else ""


def requested_amount(text: str) -> Decimal | None:
    """An amount the customer named ("£20", "20 pounds"), which wins over the refundable amount."""
    found = AMOUNT.search(text)
    if not found:
        return None
    return decimal_or_none((found.group("value") or found.group("bare")).replace(",", ""))


def currency_written(text: str) -> str:
    """The currency of the amount the customer wrote ("$20": USD), or "" when they wrote none."""
    found = AMOUNT.search(text)
    if not found:
        return ""
    return CURRENCY_OF.get((found.group("symbol") or found.group("word") or "").lower(), "")


def unreadable_amount(text: str) -> str | None:
    """The first amount the customer wrote that is not exactly a positive amount with at most two
    decimal places ("-5 pounds", "£1e1", "£5.005"), as written; None when every amount reads."""
    for found in MONEY_ATTEMPT.finditer(text):
        written = (found.group("symbolled") or found.group("worded")).strip().rstrip(".,")
        if CLEAN_AMOUNT.fullmatch(written) is None:
            return written
    return None


def stray_number(text: str) -> str | None:
    """The first number written that is not the order's number, a request's number or an amount read
    exactly (with its currency); None when there is none."""
    known = [found.span() for pattern in (ORDER_NUMBER, REQUEST_ID, AMOUNT) for found in pattern.finditer(text)]
    for found in ANY_NUMBER.finditer(text):
        if not any(start <= found.start() and found.end() <= end for start, end in known):
            return found.group()
    return None


def reason_of(text: str) -> str:
    return match_group(REASON, text, "reason") or NO_REASON


def decimal_or_none(value: object) -> Decimal | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        amount = Decimal(str(value))
        return amount.quantize(Decimal("0.01")) if amount.is_finite() else None
    except InvalidOperation:  # not a number, or too large to have cents
        return None


def amount_text(amount: Decimal | None) -> str:
    return "" if amount is None else f"{amount:.2f}"


def money(amount: Decimal | None, currency: str) -> str:
    """£120.00 for the currencies with a symbol, 120.00 CHF for the others, the plain amount without one."""
    if amount is None:
        return "an amount I don't know"
    symbol = CURRENCY_SYMBOLS.get(currency.upper())
    if symbol:
        return f"{symbol}{amount:.2f}"
    return f"{amount:.2f} {currency}".strip()


def status_words(status: object) -> str:
    return str(status or "unknown").replace("_", " ").strip()


def error_text(result: dict[str, Any]) -> str:
    return str(result.get("error") or "an unknown error").rstrip(".")
