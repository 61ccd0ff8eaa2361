"""refresher: keep a local copy of many web pages fresh, politely, under a fixed fetch budget."""

from __future__ import annotations

__version__ = "0.1.0"

import importlib as _importlib
import typing as _typing

if _typing.TYPE_CHECKING:
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

#: each public name and the module it comes from, imported on first use (PEP 562): a parse
#: process (``python -m refresher.discover._parse_worker``) imports this package first, and
#: everything at once cost it 0.8 s of a new interpreter's start (DuckDB, SciPy, the daemon)
#: for the ~0.15 s its parser needs
_LAZY = {
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


def __getattr__(name: str) -> _typing.Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'refresher' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value  # the next look-up is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


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
