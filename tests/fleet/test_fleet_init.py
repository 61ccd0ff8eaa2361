"""`refresher fleet init`: the schema and the partitions, idempotent, refusing what it cannot
use; a DSN's password never shown."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from refresher._errors import StoreError
from refresher.ops._cli import main
from refresher.store._pg_dsn import dsn_problem, redact
from refresher.store._pg_schema import PG_SCHEMA_VERSION, check_schema, init_fleet
from refresher.store._timeline import LISTED_COLUMN, TIMELINE_COLUMNS


def _config(tmp_path: Path, dsn: str, partitions: int = 8) -> Path:
    path = tmp_path / "fleet.toml"
    path.write_text(
        f'[store]\npath = "{tmp_path}/r.duckdb"\n'
        f"[fleet]\ndsn = {dsn!r}\nnode_id = 'n1'\npartitions = {partitions}\n"
    )
    return path


def _rows(dsn: str, sql: str) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn) as con:
        return con.execute(sql).fetchall()


def test_fleet_init_creates_the_schema_and_p_partitions_and_is_idempotent(
    postgres: Callable[..., str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dsn = postgres()
    config = _config(tmp_path, dsn, partitions=8)
    assert main(["fleet", "init", "--config", str(config)]) == 0
    assert "created at schema version" in capsys.readouterr().out
    assert _rows(dsn, "SELECT count(*), min(partition), max(partition) FROM partitions") == [
        (8, 0, 7)
    ]
    assert _rows(dsn, "SELECT value FROM fleet_meta WHERE key = 'schema_version'") == [
        (str(PG_SCHEMA_VERSION),)
    ]
    assert main(["fleet", "init", "--config", str(config)]) == 0
    assert "already at schema version" in capsys.readouterr().out
    assert _rows(dsn, "SELECT count(*) FROM partitions") == [(8,)]
    assert not list(tmp_path.glob("*.duckdb")), "fleet init created a DuckDB store"


def test_fleet_init_migrates_a_version_3_fleet_to_an_index_on_the_fetches_finish_times(
    postgres: Callable[..., str],
) -> None:
    dsn = postgres()
    init_fleet(dsn, partitions=8)
    index = "SELECT count(*) FROM pg_indexes WHERE indexname = 'fetches_finished'"
    with psycopg.connect(dsn, autocommit=True) as con:  # the fleet as version 3 made it
        con.execute("DROP INDEX fetches_finished")
        for table, columns in (  # version 5
            ("pages", (*TIMELINE_COLUMNS, LISTED_COLUMN)),
            ("hosts", ("sitemap_passed", "sitemap_failed")),
        ):
            con.execute(f"ALTER TABLE {table} " + ", ".join(f"DROP COLUMN {c}" for c in columns))
        con.execute("DROP TABLE sitemap_entries")
        con.execute("UPDATE fleet_meta SET value = '3' WHERE key = 'schema_version'")
        with pytest.raises(StoreError, match="run `refresher fleet init"):
            check_schema(con, partitions=8, dsn=dsn)
    assert init_fleet(dsn, partitions=8).migrated_from == 3
    assert _rows(dsn, index) == [(1,)]
    with psycopg.connect(dsn) as con:
        check_schema(con, partitions=8, dsn=dsn)


def test_fleet_init_over_a_unix_socket_dsn_works(postgres: Callable[..., str]) -> None:
    dsn = postgres(unix=True)
    assert init_fleet(dsn, partitions=4).migrated_from == 0
    with psycopg.connect(dsn) as con:
        check_schema(con, partitions=4, dsn=dsn)


def test_fleet_init_refuses_another_partition_count_in_one_line(
    postgres: Callable[..., str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dsn = postgres()
    init_fleet(dsn, partitions=8)
    assert main(["fleet", "init", "--config", str(_config(tmp_path, dsn, partitions=16))]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "created with 8 partitions, not 16" in err
    assert "fleet.partitions = 8" in err
    assert _rows(dsn, "SELECT count(*) FROM partitions") == [(8,)]


def test_a_schema_newer_than_the_code_is_refused_by_init_and_by_a_node(
    postgres: Callable[..., str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dsn = postgres()
    init_fleet(dsn, partitions=8)
    with psycopg.connect(dsn) as con:
        con.execute(
            "UPDATE fleet_meta SET value = %s WHERE key = 'schema_version'",
            (str(PG_SCHEMA_VERSION + 1),),
        )
    assert main(["fleet", "init", "--config", str(_config(tmp_path, dsn))]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "newer than this refresher understands" in err
    with psycopg.connect(dsn) as con, pytest.raises(StoreError, match="upgrade refresher"):
        check_schema(con, partitions=8, dsn=dsn)


def test_a_node_refuses_a_database_without_a_fleet(postgres: Callable[..., str]) -> None:
    dsn = postgres()
    with psycopg.connect(dsn) as con, pytest.raises(StoreError, match="refresher fleet init"):
        check_schema(con, partitions=8, dsn=dsn)


def test_fleet_init_without_a_dsn_says_which_key_to_set(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["fleet", "init", "--store", str(tmp_path / "r.duckdb")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("refresher fleet: fleet.dsn: is empty; set it"), err


def test_an_unreachable_database_is_one_line_without_the_password(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # port 1 on loopback: nothing listens there
    dsn = "postgresql://refresher:s3cret-pw@127.0.0.1:1/fleet?connect_timeout=5"
    assert main(["fleet", "init", "--config", str(_config(tmp_path, dsn))]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "cannot connect" in err
    assert "s3cret-pw" not in err
    assert "refresher:***@127.0.0.1:1" in err


@pytest.mark.parametrize(
    ("dsn", "shown"),
    [
        ("postgresql://u:pw1@db:5432/f", "postgresql://u:***@db:5432/f"),
        (
            "postgresql://u@db/f?password=pw1&sslmode=require",
            "postgresql://u@db/f?password=***&sslmode=require",
        ),
        ("host=db user=u password=pw1 dbname=f", "host=db user=u password=*** dbname=f"),
        ("host=db password='p w1' dbname=f", "host=db password=*** dbname=f"),
        ("postgresql://u@db/f", "postgresql://u@db/f"),
    ],
)
def test_a_dsns_password_is_redacted(dsn: str, shown: str) -> None:
    assert redact(dsn) == shown
    assert "pw1" not in redact(dsn)


@pytest.mark.parametrize(
    "dsn",
    [
        "not a dsn",
        "http://db/f",
        "host=db password=pw1 nonsense",
        "postgresql://u:pw1@db:notaport/f",
    ],
)
def test_a_malformed_dsn_is_refused_without_repeating_its_password(dsn: str) -> None:
    problem = dsn_problem(dsn)
    assert problem is not None
    assert "pw1" not in problem


def test_good_dsns_pass() -> None:
    assert dsn_problem("postgresql://u:pw@db:5432/f") is None
    assert dsn_problem("postgres://db/f") is None
    assert dsn_problem("host=/run/postgresql dbname=f") is None


def test_the_postgres_fixture_fails_with_what_to_install_when_the_binaries_are_absent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import conftest

    monkeypatch.setattr(conftest, "_pg_binary", lambda name: None)
    with pytest.raises(pytest.fail.Exception, match="apt-get install postgresql"):
        conftest.PostgresServer()


def test_a_config_never_shows_the_dsns_password() -> None:
    from refresher._config import load_config

    config = load_config(
        overrides={"fleet": {"dsn": "postgresql://u:pw-secret@db/f"}},
        default_file=Path("/nonexistent"),
    )
    assert config.fleet.dsn.endswith("@db/f")
    assert "pw-secret" not in repr(config) and "pw-secret" not in str(config.fleet)


def test_a_node_absent_for_less_than_a_lease_is_refused_in_one_line(tmp_path: Path) -> None:
    from refresher._config import load_config
    from refresher._errors import ConfigError

    path = tmp_path / "r.toml"
    path.write_text(
        '[fleet]\ndsn = "postgresql://db/f"\nnode_id = "a"\nlease_ttl = 10\nabsent_after = 5\n'
    )
    with pytest.raises(ConfigError, match=r"fleet\.absent_after.*must exceed fleet\.lease_ttl"):
        load_config(path)
