from __future__ import annotations
import __future__

import importlib.metadata
import re
import types
from pathlib import Path

import refresher
from refresher import _errors

# The public API, as intended. Changing it is a decision: update this list with it.
PUBLIC_API = [
    "open_store",
    "StoreService",
    "RobotsUpdate",
    "Resolver",
    "PageRow",
    "NewPage",
    "HostUpdate",
    "HostRow",
    "FetchRecord",
    "Findings",
    "DuckDBStore",
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


def test_the_policies_are_installed_as_refresher_policies_and_no_top_level_name() -> None:
    from refresher import policies

    top_level = importlib.metadata.distribution("refresher").read_text("top_level.txt") or ""
    assert top_level.split() == ["refresher"]  # no "policies" to collide in site-packages
    assert policies.__name__ == "refresher.policies"
    assert policies.ENTRY_POINT_GROUP == "refresher.policies"
    assert {"uniform", "optimal"} <= set(policies.available())


def test_the_frontier_and_the_fetcher_take_only_public_names() -> None:
    # Fetcher needs a Resolver, Frontier's source returns PageRow/HostRow: all in refresher.
    resolver = refresher.Resolver(static={"a.example": "127.0.0.1:1"})
    fetcher = refresher.Fetcher(user_agent="test/1.0", resolver=resolver)
    assert fetcher.statistics().fetches == 0

    async def source(
        after: tuple[float, int], until: float, limit: int, known: frozenset[int]
    ) -> tuple[list[refresher.PageRow], dict[int, refresher.HostRow]]:
        return [], {}

    frontier = refresher.Frontier(source=source, budget=1.0)
    assert frontier.statistics().in_memory == 0
    assert issubclass(refresher.StoreService, object) and refresher.Store is not None


def test_nothing_imports_the_policies_by_their_folder_name() -> None:
    # One module object: a plug-in registered through refresher.policies must be the one the
    # daemon sees, so nothing may import the source folder as a top-level "policies".
    root = Path(__file__).parents[1]
    pattern = re.compile(r"^\s*(import policies\b|from policies\b)", re.M)
    files = [
        p for d in ("refresher", "tests", "bench", "analysis") for p in (root / d).rglob("*.py")
    ]
    offenders = [str(p.relative_to(root)) for p in files if pattern.search(p.read_text())]
    assert offenders == []


def test_the_lazy_table_names_the_modules_the_type_checker_imports_from() -> None:
    # refresher/__init__.py lists each name twice: imports under TYPE_CHECKING for mypy and
    # `_WHERE` for the PEP 562 lookup at run time. They must not drift apart.
    import ast

    tree = ast.parse(Path(refresher.__file__).read_text())
    checked = next(
        node
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
    )
    typed = {
        alias.name: node.module
        for node in checked.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert typed == refresher._WHERE
    assert set(typed) | {"__version__"} == set(refresher.__all__)
