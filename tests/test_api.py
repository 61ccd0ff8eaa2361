from __future__ import annotations
import __future__

import importlib.metadata
import types

import refresher
from refresher import _errors

# The public API, as intended. Changing it is a decision: update this list with it.
PUBLIC_API = [
    "SCHEMA_VERSION",
    "Archive",
    "ArchiveError",
    "BodyTooLarge",
    "Change",
    "Config",
    "ConfigError",
    "ConnectFailure",
    "ControlError",
    "DNSFailure",
    "Daemon",
    "FetchError",
    "FetchResult",
    "FetchTimeout",
    "Fetcher",
    "Frontier",
    "InvalidURL",
    "ProtocolFailure",
    "ReadFailure",
    "RefresherError",
    "RobotsRules",
    "Sink",
    "Store",
    "StoreError",
    "TooManyRedirects",
    "Version",
    "__version__",
    "load_config",
    "request",
    "run_daemon",
]


def test_all_is_exactly_the_intended_public_api() -> None:
    assert sorted(refresher.__all__) == sorted(PUBLIC_API)
    assert len(refresher.__all__) == len(set(refresher.__all__))


def test_every_name_in_all_exists() -> None:
    missing = [name for name in refresher.__all__ if not hasattr(refresher, name)]
    assert missing == []


def test_nothing_public_is_missing_from_all() -> None:
    def is_public(name: str) -> bool:
        value = getattr(refresher, name)
        return not (
            name.startswith("_")
            or isinstance(value, types.ModuleType)
            # `from __future__ import annotations` leaves this name behind; it is not API.
            or value is __future__.annotations
        )

    public = {name for name in dir(refresher) if is_public(name)}
    assert public - set(refresher.__all__) == set()


def test_star_import_gives_the_public_api() -> None:
    namespace: dict[str, object] = {}
    exec("from refresher import *", namespace)
    assert set(PUBLIC_API) <= namespace.keys()


def test_every_error_of_the_error_tree_is_exported_and_derives_from_refresher_error() -> None:
    assert set(_errors.__all__) <= set(refresher.__all__)
    for name in _errors.__all__:
        error = getattr(refresher, name)
        assert error is getattr(_errors, name)
        assert issubclass(error, refresher.RefresherError)


def test_the_version_matches_the_installed_distribution() -> None:
    assert refresher.__version__ == importlib.metadata.version("refresher")
