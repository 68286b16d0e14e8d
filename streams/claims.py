"""The claim protocol, written once: take offers (``offers.OfferReader``), claim them through the log
(``log_writer.LogWriter``), and learn after one trip whether each claim won, from this process's replica of the
fold. The store's ``dequeue_many_rollouts`` and the runner both claim through it.

An offer is committed once its claim's outcome is known, whoever won: a process that dies with a claim in flight
leaves the offer to the partition's next owner, whose claim the fold refuses if the first one landed. A claim the
broker did not acknowledge in time goes back to the queue and is claimed again (the fold takes one claim per
attempt, so a second claim of a landed first one is refused and the offer is handled then).
"""

from __future__ import annotations

import time

from litstream.schemas.events import AttemptStarted, RolloutSnapshot
from litstream.schemas.models import new_attempt_id

from .log_writer import LogWriter, StoreError
from .offers import OfferReader, Taken


class Claims:
    """Claims of one process; ``lost`` counts the claims another claimant won (or the fold refused)."""

    def __init__(self, log: LogWriter, offers: OfferReader) -> None:
        self.log = log
        self.offers = offers
        self.lost = 0

    async def claim(self, limit: int, worker_id: str | None) -> list[RolloutSnapshot]:
        """Claim up to ``limit`` rollouts on offer here, oldest first; the snapshot of each claim that won (its
        newest attempt is the claim's). Empty when nothing is on offer here. Stale offers are skipped."""
        won: list[RolloutSnapshot] = []
        async with self.offers.in_use():
            while len(won) < limit:
                offers = await self.offers.take(limit - len(won))
                if not offers:
                    break
                won += await self._claim_offers(offers, worker_id)
        return won

    async def _claim_offers(self, offers: list[Taken], worker_id: str | None) -> list[RolloutSnapshot]:
        claims = [AttemptStarted(meta=self.log.events.factory.meta(o.rollout_id), attempt_id=new_attempt_id(),
                                 sequence_id=o.attempt_sequence, start_time=time.time(), worker_id=worker_id)
                  for o, _ in offers]
        try:
            answers = await self.log.outcomes(self.log.send_lifecycle(claims), claims)
        except StoreError:
            self.offers.retry(offers)  # not known to be durable: claimed again by the next take
            raise
        self.offers.handled(offers)
        won = [done.snapshot for done in answers if done.accepted and done.snapshot is not None]
        self.lost += len(offers) - len(won)
        return won
