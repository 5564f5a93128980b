from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CallRequest(_message.Message):
    __slots__ = ("payload", "headers")
    class HeadersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    payload: _struct_pb2.Value
    headers: _containers.ScalarMap[str, str]
    def __init__(self, payload: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., headers: _Optional[_Mapping[str, str]] = ...) -> None: ...

class CallResponse(_message.Message):
    __slots__ = ("result", "error")
    RESULT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    result: _struct_pb2.Value
    error: Error
    def __init__(self, result: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., error: _Optional[_Union[Error, _Mapping]] = ...) -> None: ...

class StreamRequest(_message.Message):
    __slots__ = ("payload", "headers")
    class HeadersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    payload: _struct_pb2.Value
    headers: _containers.ScalarMap[str, str]
    def __init__(self, payload: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., headers: _Optional[_Mapping[str, str]] = ...) -> None: ...

class StreamResponse(_message.Message):
    __slots__ = ("item", "error")
    ITEM_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    item: _struct_pb2.Value
    error: Error
    def __init__(self, item: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., error: _Optional[_Union[Error, _Mapping]] = ...) -> None: ...

class Error(_message.Message):
    __slots__ = ("message", "node", "timed_out")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    TIMED_OUT_FIELD_NUMBER: _ClassVar[int]
    message: str
    node: str
    timed_out: bool
    def __init__(self, message: _Optional[str] = ..., node: _Optional[str] = ..., timed_out: _Optional[bool] = ...) -> None: ...
