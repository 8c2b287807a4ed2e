"""LaterFields: a pydantic model whose fields added after its JSON was first written are left out of
that JSON while at their defaults (manifests stay readable by older workers; hashes stay the same)."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, SerializerFunctionWrapHandler, model_serializer
from pydantic_core import to_jsonable_python


class LaterFields(BaseModel):
    """A spec whose fields named in LATER were added after manifests were first written: its JSON
    (manifests, and so the job id) leaves each of them out while it is at its default, so that a
    worker older than a field reads the manifest of a job that does not use it (a fleet mid-upgrade),
    and the ids of jobs planned before it stay the same. `all_fields` puts them back (diffs)."""

    LATER: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _leave_out_defaults(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = handler(self)
        for name in self.LATER:
            if getattr(self, name) == type(self).model_fields[name].default:
                data.pop(name, None)
        return data

    def all_fields(self) -> dict[str, Any]:
        """The JSON dump with every field, those at their default included (nested specs too)."""
        return {name: value.all_fields() if isinstance(value, LaterFields) else to_jsonable_python(value)
                for name, value in ((n, getattr(self, n)) for n in type(self).model_fields)}  # fmt: skip
