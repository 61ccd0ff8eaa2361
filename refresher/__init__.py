"""refresher: keep a local copy of many web pages fresh, politely, under a fixed fetch budget."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from refresher._config import Config, load_config
    from refresher._errors import (
        ArchiveError,
        ArchiveUnreachable,
        BodyTooLarge,
        ConfigError,
        ConnectFailure,
        ControlError,
        DNSFailure,
        FetchError,
        FetchTimeout,
        InvalidURL,
        ProtocolFailure,
        ReadFailure,
        RefresherError,
        StoreError,
        TooManyRedirects,
    )
    from refresher.archive._archive import Archive, Version
    from refresher.archive._sinks import Change, Sink
    from refresher.crawl._dns import Resolver
    from refresher.crawl._fetch import Fetcher, FetchResult
    from refresher.crawl._frontier import Frontier
    from refresher.crawl._robots import RobotsRules
    from refresher.ops._control import request
    from refresher.ops._daemon import Daemon, run_daemon
    from refresher.store import (
        SCHEMA_VERSION,
        DuckDBStore,
        FetchRecord,
        Findings,
        HostRow,
        HostUpdate,
        NewPage,
        PageRow,
        RobotsUpdate,
        Store,
        StoreService,
        open_store,
    )

# Each public name is imported on first use (PEP 562), not with the package: a parse process
# (refresher.discover._parse_worker) imports refresher.discover and needs none of them, and
# importing them all (the store, the daemon, SciPy) took 0.45 of its 0.7 CPU s start and
# 40 MiB of its memory.
_WHERE = {
    "Config": "refresher._config",
    "load_config": "refresher._config",
    "ArchiveError": "refresher._errors",
    "ArchiveUnreachable": "refresher._errors",
    "BodyTooLarge": "refresher._errors",
    "ConfigError": "refresher._errors",
    "ConnectFailure": "refresher._errors",
    "ControlError": "refresher._errors",
    "DNSFailure": "refresher._errors",
    "FetchError": "refresher._errors",
    "FetchTimeout": "refresher._errors",
    "InvalidURL": "refresher._errors",
    "ProtocolFailure": "refresher._errors",
    "ReadFailure": "refresher._errors",
    "RefresherError": "refresher._errors",
    "StoreError": "refresher._errors",
    "TooManyRedirects": "refresher._errors",
    "Archive": "refresher.archive._archive",
    "Version": "refresher.archive._archive",
    "Change": "refresher.archive._sinks",
    "Sink": "refresher.archive._sinks",
    "Resolver": "refresher.crawl._dns",
    "Fetcher": "refresher.crawl._fetch",
    "FetchResult": "refresher.crawl._fetch",
    "Frontier": "refresher.crawl._frontier",
    "RobotsRules": "refresher.crawl._robots",
    "request": "refresher.ops._control",
    "Daemon": "refresher.ops._daemon",
    "run_daemon": "refresher.ops._daemon",
    "SCHEMA_VERSION": "refresher.store",
    "DuckDBStore": "refresher.store",
    "FetchRecord": "refresher.store",
    "Findings": "refresher.store",
    "HostRow": "refresher.store",
    "HostUpdate": "refresher.store",
    "NewPage": "refresher.store",
    "PageRow": "refresher.store",
    "RobotsUpdate": "refresher.store",
    "Store": "refresher.store",
    "StoreService": "refresher.store",
    "open_store": "refresher.store",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'refresher' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The public names and the private ones (not the helpers imported above)."""
    return sorted({*__all__, *(name for name in globals() if name.startswith("_"))})


__all__ = [
    "SCHEMA_VERSION",
    "Archive",
    "ArchiveError",
    "ArchiveUnreachable",
    "BodyTooLarge",
    "Change",
    "Config",
    "ConfigError",
    "ConnectFailure",
    "ControlError",
    "DNSFailure",
    "Daemon",
    "DuckDBStore",
    "FetchError",
    "FetchRecord",
    "FetchResult",
    "FetchTimeout",
    "Fetcher",
    "Findings",
    "Frontier",
    "HostRow",
    "HostUpdate",
    "InvalidURL",
    "NewPage",
    "PageRow",
    "ProtocolFailure",
    "ReadFailure",
    "RefresherError",
    "Resolver",
    "RobotsRules",
    "RobotsUpdate",
    "Sink",
    "Store",
    "StoreError",
    "StoreService",
    "TooManyRedirects",
    "Version",
    "__version__",
    "load_config",
    "open_store",
    "request",
    "run_daemon",
]
