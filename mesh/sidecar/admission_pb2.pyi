from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Descriptor(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: str
    def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class AdmitItem(_message.Message):
    __slots__ = ("tenant", "metric", "amount", "descriptors")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    METRIC_FIELD_NUMBER: _ClassVar[int]
    AMOUNT_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTORS_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    metric: str
    amount: int
    descriptors: _containers.RepeatedCompositeFieldContainer[Descriptor]
    def __init__(self, tenant: _Optional[str] = ..., metric: _Optional[str] = ..., amount: _Optional[int] = ..., descriptors: _Optional[_Iterable[_Union[Descriptor, _Mapping]]] = ...) -> None: ...

class AdmitRequest(_message.Message):
    __slots__ = ("items", "timeout_ms")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[AdmitItem]
    timeout_ms: int
    def __init__(self, items: _Optional[_Iterable[_Union[AdmitItem, _Mapping]]] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class Verdict(_message.Message):
    __slots__ = ("allowed", "reason", "mode", "bound", "suspended", "limit", "step", "remaining", "retry_after_ms", "reset_after_ms", "error", "quota", "burst", "window", "rate", "shadow", "would_deny_reason")
    ALLOWED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    BOUND_FIELD_NUMBER: _ClassVar[int]
    SUSPENDED_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    REMAINING_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    RESET_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    QUOTA_FIELD_NUMBER: _ClassVar[int]
    BURST_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    RATE_FIELD_NUMBER: _ClassVar[int]
    SHADOW_FIELD_NUMBER: _ClassVar[int]
    WOULD_DENY_REASON_FIELD_NUMBER: _ClassVar[int]
    allowed: bool
    reason: str
    mode: str
    bound: str
    suspended: str
    limit: int
    step: str
    remaining: int
    retry_after_ms: int
    reset_after_ms: int
    error: str
    quota: QuotaLag
    burst: int
    window: Window
    rate: str
    shadow: bool
    would_deny_reason: str
    def __init__(self, allowed: _Optional[bool] = ..., reason: _Optional[str] = ..., mode: _Optional[str] = ..., bound: _Optional[str] = ..., suspended: _Optional[str] = ..., limit: _Optional[int] = ..., step: _Optional[str] = ..., remaining: _Optional[int] = ..., retry_after_ms: _Optional[int] = ..., reset_after_ms: _Optional[int] = ..., error: _Optional[str] = ..., quota: _Optional[_Union[QuotaLag, _Mapping]] = ..., burst: _Optional[int] = ..., window: _Optional[_Union[Window, _Mapping]] = ..., rate: _Optional[str] = ..., shadow: _Optional[bool] = ..., would_deny_reason: _Optional[str] = ...) -> None: ...

class Window(_message.Message):
    __slots__ = ("amount", "period_s")
    AMOUNT_FIELD_NUMBER: _ClassVar[int]
    PERIOD_S_FIELD_NUMBER: _ClassVar[int]
    amount: int
    period_s: int
    def __init__(self, amount: _Optional[int] = ..., period_s: _Optional[int] = ...) -> None: ...

class QuotaLag(_message.Message):
    __slots__ = ("cap", "own", "remote", "lag_ms", "unpublished")
    CAP_FIELD_NUMBER: _ClassVar[int]
    OWN_FIELD_NUMBER: _ClassVar[int]
    REMOTE_FIELD_NUMBER: _ClassVar[int]
    LAG_MS_FIELD_NUMBER: _ClassVar[int]
    UNPUBLISHED_FIELD_NUMBER: _ClassVar[int]
    cap: int
    own: int
    remote: int
    lag_ms: int
    unpublished: int
    def __init__(self, cap: _Optional[int] = ..., own: _Optional[int] = ..., remote: _Optional[int] = ..., lag_ms: _Optional[int] = ..., unpublished: _Optional[int] = ...) -> None: ...

class AdmitResponse(_message.Message):
    __slots__ = ("verdicts",)
    VERDICTS_FIELD_NUMBER: _ClassVar[int]
    verdicts: _containers.RepeatedCompositeFieldContainer[Verdict]
    def __init__(self, verdicts: _Optional[_Iterable[_Union[Verdict, _Mapping]]] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("ok", "error")
    OK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    error: str
    def __init__(self, ok: _Optional[bool] = ..., error: _Optional[str] = ...) -> None: ...

class RefundResponse(_message.Message):
    __slots__ = ("acks",)
    ACKS_FIELD_NUMBER: _ClassVar[int]
    acks: _containers.RepeatedCompositeFieldContainer[Ack]
    def __init__(self, acks: _Optional[_Iterable[_Union[Ack, _Mapping]]] = ...) -> None: ...
