"""refresher: keep a local copy of many web pages fresh, politely, under a fixed fetch budget."""

from __future__ import annotations

__version__ = "0.1.0"

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
