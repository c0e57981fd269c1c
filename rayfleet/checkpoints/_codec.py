"""The Arrow codec: a pydantic State class mapped to Arrow columns and back."""

from __future__ import annotations

import datetime as dt
import enum
import json
import threading
import types
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Union, cast, get_args, get_origin

import cloudpickle
import pyarrow as pa
import pydantic

from ..errors import InvalidSpecError, SnapshotError

# Columns and schema metadata every snapshot file carries besides the State fields.
IDENTITY_COLUMN, VERSION_COLUMN, EXTRA_COLUMN = "__identity", "__version", "__extra"
META_CLASS, META_PICKLED = b"rayfleet.state_class", b"rayfleet.pickled"
_SCALARS: dict[type, pa.DataType] = {
    bool: pa.bool_(), int: pa.int64(), float: pa.float64(), str: pa.string(), bytes: pa.binary(), dt.date: pa.date32(),
}


class _Unencodable(Exception):
    """A value Arrow cannot hold exactly; the codec pickles its field for this batch instead."""


@dataclass(frozen=True, slots=True)
class _Mapping:
    """How one annotation travels: its Arrow type, value -> Arrow-ready value, and ``as_py`` value -> value."""

    arrow_type: pa.DataType
    encode: Callable[[Any], Any]
    decode: Callable[[Any], Any]


def _exact(kind: type) -> Callable[[Any], Any]:
    # Exact type checks (not isinstance) keep subclasses such as bool-in-int or
    # datetime-in-date from silently coming back as their base type.
    def encode(value: Any) -> Any:
        if type(value) is not kind:
            raise _Unencodable
        return value

    return encode


def _encode_utc(value: Any) -> Any:
    # Only datetime.timezone.utc round-trips exactly; naive or other zones are pickled.
    if type(value) is not dt.datetime or value.tzinfo is not dt.timezone.utc:
        raise _Unencodable
    return value


def _decode_utc(value: Any) -> Any:
    return value.replace(tzinfo=dt.timezone.utc) if isinstance(value, dt.datetime) else value


def _compile(annotation: Any, seen: frozenset[type]) -> _Mapping | None:
    """The mapping for ``annotation``, or None when any part of it cannot live in Arrow."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return _compile(args[0], seen)
    if origin is Union or origin is types.UnionType:
        present = [arg for arg in args if arg is not type(None)]
        inner = _compile(present[0], seen) if len(present) == 1 < len(args) else None
        if inner is None:
            return None
        enc, dec = inner.encode, inner.decode
        return _Mapping(
            inner.arrow_type, lambda v: None if v is None else enc(v), lambda v: None if v is None else dec(v)
        )
    if origin is list or (origin is tuple and len(args) == 2 and args[1] is Ellipsis):
        return _compile_sequence(origin, args[0], seen)
    if origin is dict and len(args) == 2 and args[0] is str:
        return _compile_dict(args[1], seen)
    if origin is not None or not isinstance(annotation, type):
        return None
    if annotation is dt.datetime:
        return _Mapping(pa.timestamp("us", tz="UTC"), _encode_utc, _decode_utc)
    if annotation in _SCALARS:
        return _Mapping(_SCALARS[annotation], _exact(annotation), lambda v: v)
    if issubclass(annotation, enum.Enum) and issubclass(annotation, str):
        return _compile_enum(annotation)
    if issubclass(annotation, pydantic.BaseModel) and annotation not in seen:
        return _compile_model(annotation, seen | {annotation})
    return None


def _compile_sequence(container: type, item_type: Any, seen: frozenset[type]) -> _Mapping | None:
    item = _compile(item_type, seen)
    if item is None:
        return None
    enc, dec = item.encode, item.decode

    def encode(value: Any) -> Any:
        if type(value) is not container:
            raise _Unencodable
        return [enc(element) for element in cast("Iterable[Any]", value)]

    def decode(value: Any) -> Any:
        return container(dec(element) for element in value) if isinstance(value, list) else value

    return _Mapping(pa.list_(item.arrow_type), encode, decode)


def _compile_dict(value_type: Any, seen: frozenset[type]) -> _Mapping | None:
    item = _compile(value_type, seen)
    if item is None:
        return None
    enc, dec = item.encode, item.decode

    def encode(value: Any) -> Any:
        if type(value) is not dict or any(type(key) is not str for key in value):
            raise _Unencodable
        return [(key, enc(element)) for key, element in value.items()]

    def decode(value: Any) -> Any:
        return {key: dec(element) for key, element in value.items()} if isinstance(value, dict) else value

    return _Mapping(pa.map_(pa.string(), item.arrow_type), encode, decode)


def _compile_enum(enum_class: type[enum.Enum]) -> _Mapping:
    def encode(value: Any) -> Any:
        if type(value) is not enum_class or type(value.value) is not str:
            raise _Unencodable
        return value.value

    return _Mapping(pa.string(), encode, lambda v: enum_class(v) if isinstance(v, str) else v)


def _compile_model(model: type[pydantic.BaseModel], seen: frozenset[type]) -> _Mapping | None:
    # Private attributes and extra fields have no column, so such models are pickled whole.
    if not model.model_fields or model.__private_attributes__:
        return None
    fields = {name: _compile(info.annotation, seen) for name, info in model.model_fields.items()}
    if any(mapping is None for mapping in fields.values()):
        return None
    mappings: dict[str, _Mapping] = {name: mapping for name, mapping in fields.items() if mapping is not None}

    def encode(value: Any) -> Any:
        if type(value) is not model or value.__pydantic_extra__:
            raise _Unencodable
        return {name: mapping.encode(getattr(value, name)) for name, mapping in mappings.items()}

    def decode(value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        data = {name: mappings[name].decode(item) if name in mappings else item for name, item in value.items()}
        return model.model_validate(data, by_name=True)

    return _Mapping(pa.struct([pa.field(name, m.arrow_type) for name, m in mappings.items()]), encode, decode)


class StateCodec:
    """Maps one pydantic State class to Arrow columns and back.

    Each top-level field whose annotation maps fully to Arrow gets a typed column;
    any other field is a ``binary`` column of ``cloudpickle.dumps(value)``. When a
    batch holds a value a typed column cannot keep exactly (an int beyond int64, a
    naive or non-``timezone.utc`` datetime, a subclass instance), that field is
    pickled for that batch only; the file's metadata records which fields were.

    Guarantee: ``from_row`` of an encoded state returns a State equal (``==``) to
    it, except for pydantic private attributes of the State itself, which are not
    stored and come back as their defaults. Pickled values are unpickled on read,
    so only read snapshots you trust.
    """

    _cache: ClassVar[weakref.WeakKeyDictionary[type, StateCodec]] = weakref.WeakKeyDictionary()
    _cache_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, state_class: type[pydantic.BaseModel]) -> None:
        """Build the mapping of ``state_class``; prefer :meth:`for_class`, which shares codecs.

        Raises:
            InvalidSpecError: if ``state_class`` is not a pydantic model class.
        """
        if not (isinstance(state_class, type) and issubclass(state_class, pydantic.BaseModel)):
            raise InvalidSpecError(f"a State must be a pydantic model class, got {state_class!r}", field="state")
        self.state_class = state_class
        self.class_path = f"{state_class.__module__}:{state_class.__qualname__}"
        self._mappings: dict[str, _Mapping] = {}
        pickled: set[str] = set()
        fields: list[pa.Field] = []
        for name, info in state_class.model_fields.items():
            mapping = _compile(info.annotation, frozenset({state_class}))
            if mapping is None:
                pickled.add(name)
                fields.append(pa.field(name, pa.binary()))
            else:
                self._mappings[name] = mapping
                fields.append(pa.field(name, mapping.arrow_type))
        self.schema: pa.Schema = pa.schema(fields)
        self.pickled_fields: frozenset[str] = frozenset(pickled)

    @classmethod
    def for_class(cls, state_class: type[pydantic.BaseModel]) -> StateCodec:
        """The shared codec of ``state_class`` (built once; classes are weakly held)."""
        with cls._cache_lock:
            codec = cls._cache.get(state_class)
            if codec is None:
                codec = cls._cache[state_class] = cls(state_class)
            return codec

    def to_columns(self, states: list[pydantic.BaseModel]) -> tuple[dict[str, pa.Array], frozenset[str]]:
        """Encode ``states`` column-wise; returns the columns and the fields pickled in this batch.

        Raises:
            InvalidSpecError: if a state is not an instance of this codec's class, or a field
                holds a value that neither Arrow nor cloudpickle can store.
        """
        if any(type(state) is not self.state_class for state in states):
            raise InvalidSpecError(f"every state must be a {self.class_path} instance", field="state")
        columns: dict[str, pa.Array] = {}
        pickled = set(self.pickled_fields)
        for name in self.schema.names:
            values = [getattr(state, name) for state in states]
            mapping = self._mappings.get(name)
            if mapping is not None:
                try:
                    columns[name] = pa.array([mapping.encode(v) for v in values], type=mapping.arrow_type)
                    continue
                except (_Unencodable, pa.ArrowException, OverflowError, ValueError, TypeError):
                    pickled.add(name)
            try:
                columns[name] = pa.array([cloudpickle.dumps(v) for v in values], type=pa.binary())
            except Exception as error:  # noqa: BLE001 - pickling runs arbitrary __reduce__ code; any failure means unstorable
                raise InvalidSpecError(
                    f"{self.class_path}.{name} holds a value that can be neither stored in Arrow nor pickled "
                    f"({type(error).__name__}: {error}); keep State to plain data (no locks, sockets, generators "
                    f"or open files)", field=f"state.{name}",
                ) from None
        return columns, frozenset(pickled)

    def from_row(
        self, table: pa.Table, row_index: int, *, identity: str = "", location: str = ""
    ) -> pydantic.BaseModel:
        """Rebuild the State in row ``row_index`` via ``model_validate``.

        Columns missing from the table fall back to the field's default; columns
        the State does not declare are refused (the State forbids extras).

        Raises:
            SnapshotError: if the columns cannot be decoded or fail validation;
                ``identity`` and ``location`` name the snapshot in the error.
        """
        metadata = table.schema.metadata or {}
        try:
            pickled = set(json.loads(metadata.get(META_PICKLED, b"[]")))
            data: dict[str, Any] = {}
            for name in table.column_names:
                if name.startswith("__"):
                    continue
                scalar = table.column(name)[row_index]
                if name in pickled:
                    data[name] = cloudpickle.loads(scalar.as_py())
                    continue
                value = scalar.as_py(maps_as_pydicts="strict")
                mapping = self._mappings.get(name)
                data[name] = mapping.decode(value) if mapping is not None else value
            return self.state_class.model_validate(data, by_name=True)
        except pydantic.ValidationError as error:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '<root>'}: {e['msg']}" for e in error.errors())
            detail = f"stored columns do not fit {self.class_path} ({problems})"
        except Exception as error:  # noqa: BLE001 - unpickling can raise anything; report it as corruption
            detail = f"cannot decode columns as {self.class_path} ({type(error).__name__}: {error})"
        raise SnapshotError(identity=identity, location=location, detail=detail)
