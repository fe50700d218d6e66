"""Configuration: one resolution order, in one place, into frozen dataclasses.

Every setting is a dataclass field with its help text. It can be given as a CLI
flag (``--cubes-per-shard``), a job-file key (``cubes_per_shard``) or an
environment variable (``PIPELINE_CUBES_PER_SHARD``); the first of those that is
set wins, in that order, then the field's default.
"""

from .options import (
    CONNECTION_SETTINGS,
    ProcessSettings,
    RunOptions,
    connection_options,
    process_settings,
)
from .resolve import check_flags_apply, check_unknown_keys, resolve
from .settings import (
    ENV_PREFIX,
    check_settings,
    env_name,
    flag_name,
    names_in_scope,
    setting,
    settings_of,
    split_list,
)

__all__ = [
    "CONNECTION_SETTINGS",
    "ENV_PREFIX",
    "ProcessSettings",
    "RunOptions",
    "check_flags_apply",
    "check_settings",
    "check_unknown_keys",
    "connection_options",
    "env_name",
    "flag_name",
    "process_settings",
    "resolve",
    "setting",
    "names_in_scope",
    "settings_of",
    "split_list",
]
