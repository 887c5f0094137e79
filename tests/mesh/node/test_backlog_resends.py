"""A sender's resends do not refill its slice backlog: rows already queued, by
(worker_epoch, key, sequence), are dropped on arrival, so its fresh reports are neither
delayed behind copies nor shed for them."""

from __future__ import annotations

import asyncio

from mesh.core.messages import REPORT_ROWS_MAX, ReportBatch, encode
from mesh.node import Mesh
from tests.mesh._util import POLICY
from tests.mesh.node.test_resources import ANY_TENANT, EPOCH, _config, joined, owned_keys, reports
from tests.mesh.node.test_resources import send as send_over_grpc


def test_a_resend_of_rows_already_queued_is_not_queued_again() -> None:
    async def main() -> None:
        async with Mesh(_config([POLICY, ANY_TENANT])) as node:
            driver = node._require()
            owner = driver.member.owner
            keys = owned_keys(await joined(node), 2 * REPORT_ROWS_MAX)
            first, fresh = keys[:REPORT_ROWS_MAX], keys[REPORT_ROWS_MAX : 2 * REPORT_ROWS_MAX - 50]
            driver.ingest.backlog_rows_max = 2 * REPORT_ROWS_MAX  # room for one batch and the fresh
            driver.deliver(reports(node, first, seq=1))
            assert driver.ingest._backlog["good"].rows == REPORT_ROWS_MAX
            # Its resends, whole and in part: nothing new, nothing queued, nothing shed.
            driver.deliver(reports(node, first, seq=1))
            driver.deliver(reports(node, first[:100], seq=1))
            assert driver.ingest._backlog["good"].rows == REPORT_ROWS_MAX
            assert driver.reports_deduplicated == 2 and driver.reports_shed == 0
            # A batch of resent rows and fresh ones: the fresh ones are queued, and fit.
            mixed = ReportBatch(
                "good",
                node.ring.epoch,
                EPOCH,
                (*first[:50], *fresh),
                (1,) * (50 + len(fresh)),
                (1,) * (50 + len(fresh)),
                (0,) * (50 + len(fresh)),
                (1,) * (50 + len(fresh)),
            )
            driver.deliver(mixed)
            queued = len(first) + len(fresh)
            assert driver.ingest._backlog["good"].rows == queued and driver.reports_shed == 0
            assert driver.rows_deduplicated == REPORT_ROWS_MAX + 100 + 50
            # Another incarnation's rows are not the same rows.
            restarted = ReportBatch(
                "good",
                node.ring.epoch,
                EPOCH + 1,
                tuple(first),
                (1,) * len(first),
                (1,) * len(first),
                (0,) * len(first),
                (1,) * len(first),
            )
            driver.ingest.backlog_rows_max = 4 * REPORT_ROWS_MAX
            driver.deliver(restarted)
            assert driver.ingest._backlog["good"].rows == queued + len(first)
            await asyncio.sleep(0)
            while driver.ingest._backlog:
                await asyncio.sleep(0.001)
            assert not driver.ingest._backlog  # and with it, the rows it remembered
            assert owner.duplicates == 0  # no copy reached the owner
            assert owner.applied_units == queued + len(first)
            health = node.health()["bounds"]
            assert health["reports_deduplicated"] == 2 and health["rows_deduplicated"] == 406

    asyncio.run(main())


def test_resends_over_grpc_do_not_shed_a_senders_fresh_reports() -> None:
    """Over a real stream, end to end: a large batch, three resends of it, then fresh
    reports, with a backlog that holds two batches: every report is applied once and
    acknowledged, none shed. (Here the loop may apply slices between the stream's messages,
    so this holds with or without the deduplication; the test above pins that.)"""

    async def main() -> None:
        async with Mesh(_config([POLICY, ANY_TENANT])) as node:
            driver = node._require()
            keys = owned_keys(await joined(node), 2 * REPORT_ROWS_MAX)
            old, fresh = keys[:REPORT_ROWS_MAX], keys[REPORT_ROWS_MAX:]
            driver.ingest.backlog_rows_max = 2 * REPORT_ROWS_MAX
            payloads = [encode(reports(node, old))] * 4 + [encode(reports(node, fresh))]
            replies = await send_over_grpc(node.address, payloads, 10**9, quiet_s=1.0)
            acked = {k for r in replies for k, a in zip(r.keys, r.acks, strict=True) if a == 1}
            assert acked == set(keys)
            assert driver.reports_shed == 0 and driver.member.owner.applied_units == len(keys)

    asyncio.run(main())
