"""What instances cost: the packaged price table, a user's own, or one price per worker-hour.

A worker here is one single-threaded Dask worker process, one per vCPU (as the
Terraform module starts them), so a worker-hour costs the instance's hourly
price over its vCPUs: $4.08 / 96 = $0.0425 on a c5.24xlarge.
"""

from __future__ import annotations

import functools
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..errors import ConfigError

__all__ = ["Instance", "PriceTable", "WorkerPrice", "load_prices", "worker_price"]

#: The Terraform module's defaults (terraform/variables.tf).
DEFAULT_WORKER_INSTANCE = "c5.24xlarge"
DEFAULT_SCHEDULER_INSTANCE = "m5.2xlarge"
DEFAULT_WORKER_INSTANCES = 5


@dataclass(frozen=True)
class Instance:
    name: str
    vcpus: int
    memory_gib: float
    network_gbps: float
    usd_per_hour: float


@dataclass(frozen=True)
class PriceTable:
    instances: dict[str, Instance]
    #: None when the price file has no [load_balancers.nlb]: fleets are then priced
    #: without it, and say so.
    load_balancer_per_hour: float | None
    as_of: str
    region: str
    origin: str

    def instance(self, name: str, setting: str = "instance_type") -> Instance:
        try:
            return self.instances[name]
        except KeyError:
            # --price-per-worker-hour prices the run's workers, not a fleet's instances
            other = "--price-per-worker-hour, or " if setting == "instance_type" else ""
            raise ConfigError(
                f"{setting} {name!r}: not in the price table {self.origin}; expected one of "
                f"{', '.join(sorted(self.instances))} (or give {other}a --price-file that "
                "lists it)"
            ) from None


@dataclass(frozen=True)
class WorkerPrice:
    """Dollars per worker-hour, and where that figure came from (for the reader): in
    full (``source``, a run's cost line) and in a few words (``basis``)."""

    usd_per_hour: float
    source: str
    basis: str = ""


def load_prices(price_file: str | None = None) -> PriceTable:
    """The packaged table, or ``price_file`` (TOML of the same format) when given."""
    return _parse(*_price_text(price_file)) if price_file else _packaged_prices()


@functools.lru_cache(maxsize=1)
def _packaged_prices() -> PriceTable:
    """Parsed once per process: every run prices its workers (0.6 ms a parse)."""
    return _parse(*_price_text(None))


def _price_text(price_file: str | None) -> tuple[str, str]:
    if price_file:
        origin = str(price_file)
        try:
            text = Path(price_file).read_text()
        except OSError as exc:
            raise ConfigError(f"price_file {price_file}: cannot be read: {exc}") from None
    else:
        origin = "pipeline/costs/prices.toml"
        text = resources.files("pipeline.costs").joinpath("prices.toml").read_text()
    return origin, text


def _parse(origin: str, text: str) -> PriceTable:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"price_file {origin}: not valid TOML: {exc}") from None
    instances = {}
    for name, row in (data.get("instances") or {}).items():
        instances[name] = _instance(origin, name, row)
    if not instances:
        raise ConfigError(f'price_file {origin}: expected an [instances."TYPE"] table or more')
    nlb = (data.get("load_balancers") or {}).get("nlb", {}).get("usd_per_hour")
    if nlb is not None and (not isinstance(nlb, int | float) or nlb < 0):
        raise ConfigError(f"price_file {origin}: load_balancers.nlb.usd_per_hour: expected $/h")
    return PriceTable(
        instances,
        None if nlb is None else float(nlb),
        str(data.get("as_of", "an unknown date")),
        str(data.get("region", "")),
        origin,
    )


def _instance(origin: str, name: str, row) -> Instance:
    fields = {"vcpus": int, "memory_gib": float, "network_gbps": float, "usd_per_hour": float}
    values = {}
    for key, kind in fields.items():
        value = row.get(key) if isinstance(row, dict) else None
        ok = isinstance(value, int | float) and not isinstance(value, bool) and value > 0
        if not ok or (kind is int and not isinstance(value, int)):
            raise ConfigError(
                f"price_file {origin}: instances.{name!r}.{key}: expected a positive "
                f"{'integer' if kind is int else 'number'}, got {value!r}"
            )
        values[key] = kind(value)
    return Instance(name, **values)


def worker_price(options) -> WorkerPrice:
    """The price of one worker-hour under ``options`` (a ``RunOptions``): its
    ``price_per_worker_hour``, else its ``instance_type``'s $/h over its vCPUs.

    Every run is priced, on a laptop's embedded cluster too, so a price nobody chose
    says so: the default instance type is named as the default, with the settings
    that change it."""
    if options.price_per_worker_hour is not None:
        setting = "price_per_worker_hour"
        return WorkerPrice(options.price_per_worker_hour, setting, setting)
    table = load_prices(options.price_file)
    inst = table.instance(options.instance_type)
    default = options.instance_type == type(options).instance_type
    basis = f"priced as {inst.name} ({'the default ' if default else ''}instance_type)"
    origin = f" from {table.origin}" if options.price_file else ""
    change = "; set instance_type or price_per_worker_hour to change it" if default else ""
    return WorkerPrice(
        inst.usd_per_hour / inst.vcpus,
        f"{basis}: ${inst.usd_per_hour:g}/h over {inst.vcpus} workers, "
        f"{table.region or 'region not given'} on-demand prices of {table.as_of}{origin}{change}",
        basis,
    )
