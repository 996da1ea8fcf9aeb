"""/api/orders/<number>/refunds (POST: ask for a refund) and /api/refunds/<id> (GET: its state in
words). Customers see only their own: anything else is a 404, never a 403. An amount the order's
balance does not allow is a 409 ``balance_exceeded`` (the same request may succeed once another
request is rejected); a malformed one a 400."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from examples.refunds.models import RefundRequest
from examples.refunds.selectors import order_get, refund_request_get, refund_status
from examples.refunds.services import BalanceExceeded, TooManyOpenRequests, refund_request_create
from workflows.apis.common import ApiBase, StrictCharField, StrictSerializer, idempotency_key_header
from workflows.apis.converters import id_parameter, name_parameter
from workflows.apis.errors import error_response, error_responses
from workflows.apis.runs import idempotency_key_parameter

TAGS = ["refunds"]
ORDER_NUMBER = name_parameter("number", "The order's number.")
REFUND_ID = id_parameter("refund_id", "The refund request's id.")
# A positive amount in the order's currency with at most two decimal places, at most 10 digits before the point
# (the columns hold 12 digits, two of them decimals): "120", "120.5", "0.05"; not "0.00" or "1e2".
AMOUNT = "[1-9][0-9]{0,9}(?:\\.[0-9]{1,2})?|0\\.(?:[1-9][0-9]?|0[1-9])"
AMOUNT_FORM = (
    "An amount in the order's currency, as a string of digits: more than 0, at most two decimals"
    ' and ten digits before the point ("120.00").'
)


class RefundSerializer(serializers.Serializer[RefundRequest]):
    id = serializers.IntegerField()
    order = serializers.CharField(source="order.number")
    amount = serializers.DecimalField(max_digits=12, decimal_places=2)
    reason = serializers.CharField()
    status = serializers.SerializerMethodField()
    run = serializers.UUIDField(source="run_id", allow_null=True)
    created_at = serializers.DateTimeField()

    def get_status(self, obj: RefundRequest) -> str:
        return refund_status(obj)


class RefundCreateApi(ApiBase):
    class InputSerializer(StrictSerializer):
        amount = StrictCharField(
            pattern=AMOUNT,
            error_messages=dict.fromkeys(("pattern", "invalid", "blank", "null"), AMOUNT_FORM),
            help_text='The amount to refund in the order\'s currency, e.g. "120.00".',
        )
        reason = StrictCharField(required=False, allow_blank=True, default="", max_length=500)

    @extend_schema(
        operation_id="refund_create",
        tags=TAGS,
        request=InputSerializer,
        parameters=[
            ORDER_NUMBER,
            idempotency_key_parameter(
                "Scoped to the customer. Same key, order, amount and reason again: 200 with the existing "
                "request. Same key, anything else: 409."
            ),
        ],
        description="201 a new request; 200 the same Idempotency-Key with the same order, amount and "
        "reason (the existing request); 409 idempotency_conflict for the same key with another "
        "request, balance_exceeded for more than the order still has to refund.",
        responses={
            201: RefundSerializer,
            200: RefundSerializer,
            **error_responses(400, 401, 403, 404, 409, 413, 415, 429),
        },
    )
    def post(self, request: Request, number: str) -> Response:
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data: dict[str, Any] = serializer.validated_data
        order = order_get(user=request.user, number=number)
        if order is None:
            raise exceptions.NotFound()
        try:
            refund, created = refund_request_create(
                order=order,
                customer=request.user,  # type: ignore[arg-type]  # authenticated
                amount=data["amount"],
                reason=data["reason"],
                idempotency_key=idempotency_key_header(request),
            )
        except BalanceExceeded as exc:
            return error_response(
                "balance_exceeded", "; ".join(exc.messages), status.HTTP_409_CONFLICT, exc.message_dict
            )
        except TooManyOpenRequests as exc:
            return error_response("too_many_requests", str(exc), status.HTTP_429_TOO_MANY_REQUESTS)
        except DjangoValidationError as exc:
            raise exceptions.ValidationError(exc.message_dict if hasattr(exc, "error_dict") else exc.messages) from None
        return Response(
            RefundSerializer(refund).data,
            status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
            headers={"Location": f"/api/refunds/{refund.pk}"},
        )


class RefundDetailApi(ApiBase):
    @extend_schema(
        operation_id="refund_get",
        tags=TAGS,
        parameters=[REFUND_ID],
        description="The refund request and, in words, where it is (its owner only).",
        responses={200: RefundSerializer, **error_responses(401, 404)},
    )
    def get(self, request: Request, refund_id: int) -> Response:
        refund = refund_request_get(user=request.user, request_id=refund_id)
        if refund is None:
            raise exceptions.NotFound()
        return Response(RefundSerializer(refund).data)
