"""`Mesh.admit` and `admit_blocking` name a metric no policy of any tenant names (a typo such as
`read_lops`) in a ConfigError, as the sidecar does, rather than answering `policy_unknown`;
a real metric with no policy for this tenant is still the `policy_unknown` verdict."""

from __future__ import annotations

import asyncio

import pytest

from mesh.core.verdict import Reason
from mesh.errors import ConfigError
from mesh.node import Mesh
from tests.mesh._util import POLICY


def _cfg() -> dict[str, object]:
    return {"member_id": "solo", "policies": {"inline": [POLICY]}}


def test_admit_names_an_unknown_metric() -> None:
    async def main() -> None:
        async with Mesh(_cfg()) as mesh:
            with pytest.raises(ConfigError) as err:
                await mesh.admit("acme", "read_lops", timeout_s=0.1)
            assert err.value.field == "metric" and "'read_lops'" in str(err.value)
            v = await mesh.admit("nobody", "read_iops", timeout_s=0.1)
            assert v.reason is Reason.POLICY_UNKNOWN
            assert (await mesh.admit("acme", "read_iops", timeout_s=0.1)).allowed

    asyncio.run(main())


def test_admit_blocking_names_an_unknown_metric() -> None:
    mesh = Mesh(_cfg()).start()
    try:
        with pytest.raises(ConfigError, match="read_lops"):
            mesh.admit_blocking("acme", "read_lops", timeout_s=0.1)
        assert mesh.admit_blocking("acme", "read_iops", timeout_s=0.1).allowed
    finally:
        mesh.stop()
