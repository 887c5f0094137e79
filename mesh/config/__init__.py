"""A mesh node's configuration file: one YAML file, validated with errors that name the key.

Below the node and the peer layer (both read it) and above the core (it builds the core's
`CoreConfig` and policies). The file's shape is documented in `_node.py`.
"""

from mesh.config._envoy import EnvoyRlsConfig, RuleLimit, RuleNode, bucket_tenant
from mesh.config._node import (
    FLEET_SECRET_MIN_BYTES,
    NODE_RETRY_MAX_MS,
    POLICY_WATCH_MS,
    CoordinatorConfig,
    Identity,
    MembershipConfig,
    NodeConfig,
    TlsConfig,
    is_loopback,
    load_config,
    load_policy_file,
    parse_config,
    read_fleet_secret,
    resolve_identity,
)
from mesh.config._replica import check_replica_name
from mesh.config._sharedstate import PostgresConfig, RedisConfig, SharedStateConfig
from mesh.config._sidecar import SidecarConfig
from mesh.config._strict import StrictConfig

__all__ = [
    "FLEET_SECRET_MIN_BYTES",
    "NODE_RETRY_MAX_MS",
    "POLICY_WATCH_MS",
    "CoordinatorConfig",
    "EnvoyRlsConfig",
    "RuleLimit",
    "RuleNode",
    "bucket_tenant",
    "Identity",
    "MembershipConfig",
    "NodeConfig",
    "TlsConfig",
    "is_loopback",
    "load_config",
    "load_policy_file",
    "parse_config",
    "read_fleet_secret",
    "resolve_identity",
    "RedisConfig",
    "SharedStateConfig",
    "SidecarConfig",
    "StrictConfig",
    "PostgresConfig",
    "check_replica_name",
]
