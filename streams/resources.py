"""Resources (policy versions, prompt templates) folded from ``resources`` (pure).

Versions are numbered by the fold, in log order: the first publication of an id is version 1, each later one
adds one and becomes the latest — so concurrent publishers can never hand out the same version twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import TypeAdapter

from litstream.schemas.events import NamedResourceRecord, ResourcesPublished
from litstream.schemas.models import NamedResources, Resource, ResourcesUpdate

_RESOURCE = TypeAdapter(Resource)


def to_records(resources: NamedResources) -> dict[str, NamedResourceRecord]:
    out = {}
    for name, res in resources.items():
        data = res.model_dump()
        out[name] = NamedResourceRecord(**{k: v for k, v in data.items() if k in NamedResourceRecord.model_fields})
    return out


def from_records(records: dict[str, NamedResourceRecord]) -> NamedResources:
    out: dict[str, Any] = {}
    for name, rec in records.items():
        data = {k: v for k, v in rec.model_dump().items() if v is not None}
        if rec.resource_type == "prompt_template":
            data.pop("sampling_parameters", None)
        out[name] = _RESOURCE.validate_python(data)
    return out


@dataclass
class ResourcesState:
    by_id: dict[str, ResourcesUpdate] = field(default_factory=dict)
    latest_id: str | None = None
    producers: dict[str, int] = field(default_factory=dict)

    @property
    def latest(self) -> ResourcesUpdate | None:
        return self.by_id.get(self.latest_id) if self.latest_id else None


def apply_resources(state: ResourcesState, ev: ResourcesPublished) -> bool:
    """Fold one publication; returns False for a redelivery (nothing changes)."""
    if ev.producer_seq <= state.producers.get(ev.producer_id, -1):
        return False
    state.producers[ev.producer_id] = ev.producer_seq
    prev = state.by_id.get(ev.resources_id)
    state.by_id[ev.resources_id] = ResourcesUpdate(
        resources_id=ev.resources_id, create_time=prev.create_time if prev else ev.create_time,
        update_time=ev.update_time, version=prev.version + 1 if prev else 1, resources=from_records(ev.resources),
    )
    state.latest_id = ev.resources_id
    return True
