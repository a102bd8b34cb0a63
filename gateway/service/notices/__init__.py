"""Signed webhook notices of each proposal's steps, per tenant.

``signing`` (how a notice is signed and how a receiver checks it: the only module a
receiver needs), ``settings`` (the ``notices`` section of the configuration),
``events`` (which ledger rows are notices and what a notice says), ``notifier`` (the
delivery loop: the ledger as outbox, a cursor per tenant, retries with backoff).
``docs/notices.md`` describes the scheme for receivers in any language.
"""

from capgate.gateway.service.notices.notifier import Notifier
from capgate.gateway.service.notices.settings import EVENT_TYPES, NoticeSettings, TenantWebhook
from capgate.gateway.service.notices.signing import (
    EVENT_ID_HEADER,
    EVENT_TYPE_HEADER,
    SIGNATURE_HEADER,
    sign_notice,
    signature_header,
    verify_notice,
)

__all__ = [
    "EVENT_ID_HEADER",
    "EVENT_TYPES",
    "EVENT_TYPE_HEADER",
    "SIGNATURE_HEADER",
    "NoticeSettings",
    "Notifier",
    "TenantWebhook",
    "sign_notice",
    "signature_header",
    "verify_notice",
]
