"""The mesh's sans-I/O core: every decision a worker or an owner makes, with no I/O.

Nothing under this package imports asyncio, grpc, sockets, sqlite, threads, a wall clock or
randomness (one import-linter contract on the package keeps it so). Time enters as integer
nanoseconds passed in; outputs are values (verdicts) and effects (messages to send). The
asyncio node (`mesh.node`), the simulator (`sim/`) and the tests drive these same objects.

    gcra, shares      the arithmetic, each formula in exactly one place
    policy            TenantRatePolicy, RateKey, the policy cache
    ring              the consistent-hash ring that picks a key's owner
    messages          UsageReport, RateSnapshot, their batches, hand-over, and the codec
    gate              the per-(tenant, metric) state the hot path touches, for every mode
    admission         the hot path: gates per mode, tenant queues, try_admit
    reporter, owner   the worker and the owner halves of the global mode
    member            one member's cores wired together
"""
