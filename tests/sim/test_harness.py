"""The one harness for tests, bench and analysis: its TOML reads back as the config it meant."""

from __future__ import annotations

from pathlib import Path

from refresher import load_config
from refresher.sim._harness import harness_config, toml_value, write_config


def test_a_harness_config_reads_back_with_the_callers_sections_merged_over_the_base(
    tmp_path: Path,
) -> None:
    tables = harness_config(
        tmp_path,
        user_agent="refresher-test/1.0 (+http://127.0.0.1/)",
        crawl={"seeds": ["http://a.example/"], "workers": 3},
        dns={"static": {"*.sim.test": "127.0.0.1:8080"}},
        log={"level": "debug"},
    )
    config = load_config(write_config(tmp_path / "refresher.toml", tables))
    assert config.store.path == tmp_path / "refresher.duckdb"
    assert config.control_socket == tmp_path / "control.sock"
    assert config.crawl.workers == 3 and config.crawl.seeds == ("http://a.example/",)
    assert config.crawl.user_agent.startswith("refresher-test/")
    assert config.log.level == "debug" and config.log.format == "json"  # merged, not replaced
    assert config.dns.static == {"*.sim.test": "127.0.0.1:8080"}


def test_toml_values_quote_strings_and_paths_and_nest_tables() -> None:
    assert toml_value('a "b"') == '"a \\"b\\""'
    assert toml_value(Path("/x y")) == '"/x y"'
    assert toml_value([1, 2.5, True]) == "[1, 2.5, true]"
    assert toml_value({"k.v": "x"}) == '{ "k.v" = "x" }'
