"""A reader's view of rollout state, for scripts and the CLI: the live view plus a blocking ``catch_up``.

The topic is compacted by Kafka's log cleaner, which leaves older versions of a key until it has run (never in
the open segment), so several versions of a key may be there and the newest wins (see ``views.RolloutsView``).
"""

from __future__ import annotations

from litstream.infra.settings import Settings
from litstream.schemas.codec import Codec, default_codec
from litstream.schemas.events import RolloutSnapshot

from .views import RolloutsView


class StateView(RolloutsView):
    def __init__(self, settings: Settings, codec: Codec | None = None) -> None:
        super().__init__(settings, codec or default_codec(settings.schema_registry_url))

    def catch_up(self, timeout: float = 30.0) -> dict[str, RolloutSnapshot]:
        """Everything written so far (every partition read to its end), as rollout id -> newest snapshot."""
        self.caught_up(timeout)
        with self.changed:
            return dict(self.snapshots)

    def __enter__(self) -> StateView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
