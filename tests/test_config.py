from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from refresher._config import _CHECKS, Config, load_config, parse_override
from refresher._errors import ConfigError


def load(tmp_path: Path, text: str | None = None, **overrides: Any) -> Config:
    """The configuration from ``text`` as a config file (if given) and nested overrides."""
    path = None
    if text is not None:
        path = tmp_path / "refresher.toml"
        path.write_text(text, encoding="utf-8")
    return load_config(path, overrides=overrides or None, default_file=tmp_path / "none.toml")


def error_of(tmp_path: Path, text: str | None = None, **overrides: Any) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text, **overrides)
    return info.value


# -- layers ------------------------------------------------------------------------------------


def test_without_any_file_the_defaults_apply(tmp_path: Path) -> None:
    config = load(tmp_path)
    assert config == Config()
    assert config.budget.fetches_per_second == 10.0
    assert config.policy.name == "optimal"
    assert config.crawl.seeds == ()


def test_the_default_file_is_read_when_it_exists(tmp_path: Path) -> None:
    default = tmp_path / "etc.toml"
    default.write_text("[budget]\nfetches_per_second = 3\n", encoding="utf-8")
    assert load_config(default_file=default).budget.fetches_per_second == 3.0


def test_a_config_file_overrides_the_defaults(tmp_path: Path) -> None:
    config = load(tmp_path, '[budget]\nfetches_per_second = 2.5\n[policy]\nname = "uniform"\n')
    assert config.budget.fetches_per_second == 2.5
    assert config.policy.name == "uniform"
    assert config.crawl.workers == Config().crawl.workers


def test_overrides_win_over_the_file_and_keep_its_other_keys(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        "[politeness]\nmin_delay = 2\nmax_delay = 30\n",
        politeness={"max_delay": 40},
    )
    assert config.politeness.max_delay == 40.0
    assert config.politeness.min_delay == 2.0


def test_an_explicit_config_file_is_used_instead_of_the_default_file(tmp_path: Path) -> None:
    default = tmp_path / "etc.toml"
    default.write_text("[crawl]\nworkers = 3\n", encoding="utf-8")
    mine = tmp_path / "mine.toml"
    mine.write_text("[crawl]\nworkers = 7\n", encoding="utf-8")
    assert load_config(mine, default_file=default).crawl.workers == 7


def test_integers_are_accepted_where_numbers_are_expected(tmp_path: Path) -> None:
    value = load(tmp_path, "[fetch]\ntimeout = 5\n").fetch.timeout
    assert value == 5.0
    assert isinstance(value, float)


def test_the_control_socket_defaults_to_beside_the_store(tmp_path: Path) -> None:
    config = load(tmp_path, '[store]\npath = "/data/x.duckdb"\n')
    assert config.control_socket == Path("/data/control.sock")
    config = load(tmp_path, '[control]\nsocket = "/run/r.sock"\n')
    assert config.control_socket == Path("/run/r.sock")


# -- --set -------------------------------------------------------------------------------------


def test_a_set_flag_becomes_a_nested_dict_with_a_toml_value() -> None:
    assert parse_override("budget.fetches_per_second=5") == {"budget": {"fetches_per_second": 5}}
    assert parse_override("crawl.seeds=['http://a.example/']") == {
        "crawl": {"seeds": ["http://a.example/"]}
    }
    assert parse_override("control.tcp_port = 9000") == {"control": {"tcp_port": 9000}}


def test_a_set_flag_with_a_bare_word_is_a_string() -> None:
    assert parse_override("policy.name=uniform") == {"policy": {"name": "uniform"}}
    assert parse_override("store.path=var/a b.duckdb") == {"store": {"path": "var/a b.duckdb"}}
    assert parse_override("crawl.user_agent=bot/1 (x=y)") == {
        "crawl": {"user_agent": "bot/1 (x=y)"}
    }


def test_a_set_flag_quotes_a_key_part_with_dots() -> None:
    assert parse_override('dns.static."a.example"=127.0.0.1:8080') == {
        "dns": {"static": {"a.example": "127.0.0.1:8080"}}
    }
    assert parse_override("dns.static.'*.sim.test'='127.0.0.1:9'") == {
        "dns": {"static": {"*.sim.test": "127.0.0.1:9"}}
    }


def test_a_set_flag_can_be_loaded_as_an_override(tmp_path: Path) -> None:
    config = load(tmp_path, **parse_override("budget.fetches_per_second=5"))
    assert config.budget.fetches_per_second == 5.0


@pytest.mark.parametrize(
    "text", ["budget", "budget=5", "=5", "budget.=5", ".x=5", "a..b=1", "a.b\nc.d=1", 'a."b=1']
)
def test_a_malformed_set_flag_is_refused_with_an_example(text: str) -> None:
    with pytest.raises(ConfigError, match=r"section\.key=value.*--set budget"):
        parse_override(text)


# -- unknown keys ------------------------------------------------------------------------------


def test_an_unknown_top_level_key_is_named_with_the_close_match(tmp_path: Path) -> None:
    error = error_of(tmp_path, "[budgett]\nfetches_per_second = 1\n")
    assert error.key == "budgett"
    assert "did you mean 'budget'?" in str(error)
    assert "the top level" in str(error)


def test_an_unknown_key_in_a_section_is_named_with_the_close_match(tmp_path: Path) -> None:
    error = error_of(tmp_path, "[budget]\nfetches_per_secnd = 1\n")
    assert error.key == "budget.fetches_per_secnd"
    assert str(error).startswith("budget.fetches_per_secnd: unknown key")
    assert "did you mean 'fetches_per_second'?" in str(error)
    assert "[budget]" in str(error)


def test_an_unknown_key_with_no_close_match_lists_the_known_keys(tmp_path: Path) -> None:
    error = error_of(tmp_path, policy={"zzzzzz": 1})
    assert error.key == "policy.zzzzzz"
    assert "did you mean" not in str(error)
    assert "name, resolve_interval" in str(error)


def test_a_section_that_is_not_a_table_is_refused(tmp_path: Path) -> None:
    error = error_of(tmp_path, "budget = 5\n")
    assert error.key == "budget"
    assert "table" in str(error)


# -- wrong types -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "key", "expected"),
    [
        ('[budget]\nfetches_per_second = "fast"\n', "budget.fetches_per_second", "a number"),
        ("[crawl]\nworkers = true\n", "crawl.workers", "an integer"),
        ("[crawl]\nworkers = 2.5\n", "crawl.workers", "an integer"),
        ("[budget]\nfetches_per_second = false\n", "budget.fetches_per_second", "a number"),
        ("[budget]\nfetches_per_second = inf\n", "budget.fetches_per_second", "a number"),
        ('[crawl]\nseeds = ["http://a.example/", 3]\n', "crawl.seeds", "a list of strings"),
        ('[crawl]\nseeds = "http://a.example/"\n', "crawl.seeds", "a list of strings"),
        ("[policy]\nname = 3\n", "policy.name", "a string"),
        ('[store]\npath = ""\n', "store.path", "a path string"),
        ('[control]\ntcp_port = "80"\n', "control.tcp_port", "an integer"),
        ("[dns.static]\n'a.example' = 1\n", "dns.static", "a table of strings"),
    ],
)
def test_a_value_of_the_wrong_type_names_the_key_and_the_type(
    tmp_path: Path, text: str, key: str, expected: str
) -> None:
    error = error_of(tmp_path, text)
    assert error.key == key
    assert str(error).startswith(f"{key}: expected {expected}")
    assert "fix the value" in str(error)


def test_a_table_of_strings_is_accepted_for_dns_static(tmp_path: Path) -> None:
    config = load(tmp_path, "[dns.static]\n'*.a.example' = '127.0.0.1:8080'\n")
    assert dict(config.dns.static) == {"*.a.example": "127.0.0.1:8080"}


# -- impossible values -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "key", "fix"),
    [
        ({"crawl": {"workers": 0}}, "crawl.workers", "must be greater than 0"),
        ({"politeness": {"min_delay": -1}}, "politeness.min_delay", "must be 0 or more"),
        ({"policy": {"name": "fastest"}}, "policy.name", "must be one of 'uniform'"),
        ({"policy": {"weights": "indegree"}}, "policy.weights", "must be one of 'pagerank'"),
        ({"control": {"tcp_port": 70000}}, "control.tcp_port", "must be a TCP port between"),
        ({"control": {"tcp_port": 0}}, "control.tcp_port", "must be a TCP port between"),
        ({"log": {"level": "loud"}}, "log.level", "must be one of"),
        (
            {"discovery": {"html_parser": "html5lib"}},
            "discovery.html_parser",
            "must be one of 'lexbor', 'lxml'",
        ),
        ({"crawl": {"user_agent": "  "}}, "crawl.user_agent", "must not be empty"),
        ({"store": {"batch_size": -5}}, "store.batch_size", "must be greater than 0"),
    ],
)
def test_an_impossible_value_names_the_key_and_the_fix(
    tmp_path: Path, overrides: dict[str, Any], key: str, fix: str
) -> None:
    error = error_of(tmp_path, **overrides)
    assert error.key == key
    assert str(error).startswith(f"{key}: {fix}")


def test_a_max_delay_below_the_min_delay_is_refused(tmp_path: Path) -> None:
    error = error_of(tmp_path, politeness={"min_delay": 5, "max_delay": 2})
    assert error.key == "politeness.max_delay"
    assert "politeness.min_delay (5.0)" in str(error)
    assert "raise max_delay or lower min_delay" in str(error)


def test_a_max_delay_equal_to_the_min_delay_is_fine(tmp_path: Path) -> None:
    config = load(tmp_path, politeness={"min_delay": 5, "max_delay": 5})
    assert config.politeness.max_delay == 5.0


# -- files -------------------------------------------------------------------------------------


def test_an_invalid_toml_file_is_refused_naming_the_file(tmp_path: Path) -> None:
    error = error_of(tmp_path, "[budget\nfetches_per_second = 1\n")
    assert "is not valid TOML" in str(error)
    assert "refresher.toml" in str(error)


def test_a_missing_config_file_is_refused(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError, match="does not exist; fix --config"):
        load_config(missing, default_file=tmp_path / "none.toml")


def test_relative_paths_in_a_config_file_are_taken_from_its_directory(tmp_path: Path) -> None:
    etc = tmp_path / "etc"
    etc.mkdir()
    path = etc / "refresher.toml"
    path.write_text(
        '[store]\npath = "data/r.duckdb"\n'
        '[crawl]\nseeds_file = "seeds.txt"\n'
        '[control]\nsocket = "/run/refresher.sock"\n',
        encoding="utf-8",
    )
    config = load_config(path, default_file=tmp_path / "none.toml")
    assert config.store.path == etc / "data" / "r.duckdb"
    assert config.crawl.seeds_file == etc / "seeds.txt"
    assert config.control.socket == Path("/run/refresher.sock")


def test_relative_paths_in_overrides_are_left_as_given(tmp_path: Path) -> None:
    config = load(tmp_path, '[store]\npath = "a.duckdb"\n', store={"path": "b.duckdb"})
    assert config.store.path == Path("b.duckdb")


# -- seeds -------------------------------------------------------------------------------------


def test_all_seeds_merges_the_list_and_the_file(tmp_path: Path) -> None:
    seeds = tmp_path / "seeds.txt"
    seeds.write_text(
        "# my seeds\nhttp://b.example/\n\n   \n  http://c.example/x  \n  # indented comment\n",
        encoding="utf-8",
    )
    config = load(tmp_path, crawl={"seeds": ["http://a.example/"], "seeds_file": str(seeds)})
    assert config.all_seeds() == ["http://a.example/", "http://b.example/", "http://c.example/x"]


def test_all_seeds_without_a_file_is_the_list(tmp_path: Path) -> None:
    config = load(tmp_path, crawl={"seeds": ["http://a.example/"]})
    assert config.all_seeds() == ["http://a.example/"]


def test_an_unreadable_seeds_file_is_a_config_error(tmp_path: Path) -> None:
    config = load(tmp_path, crawl={"seeds_file": str(tmp_path / "missing.txt")})
    with pytest.raises(ConfigError) as info:
        config.all_seeds()
    assert info.value.key == "crawl.seeds_file"
    assert "missing.txt" in str(info.value)
    assert "fix the path" in str(info.value)


def test_a_seeds_file_that_is_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    seeds = tmp_path / "seeds.txt"
    seeds.write_bytes(b"http://a.example/\xff\xfe\n")
    config = load(tmp_path, crawl={"seeds_file": str(seeds)})
    with pytest.raises(ConfigError, match="encoding"):
        config.all_seeds()


class _PlugIn:
    name = "plug-in-test"

    def allocate(self, rates: Any, budget: float, **kwargs: Any) -> Any:
        return [budget]


def test_a_plug_in_policy_can_be_named_and_an_unknown_one_lists_the_registry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from refresher import policies

    monkeypatch.setattr(policies._registry, "_registered", {})
    with pytest.raises(ConfigError) as before:
        load_config(overrides={"policy": {"name": "plug-in-test"}}, default_file=tmp_path / "x")
    assert before.value.key == "policy.name" and "'optimal-age'" in str(before.value)
    policies.register(_PlugIn())
    config = load_config(
        overrides={"policy": {"name": "plug-in-test"}}, default_file=tmp_path / "x"
    )
    assert config.policy.name == "plug-in-test"
    assert Config().policy.name == policies.DEFAULT


def test_a_store_path_too_long_for_the_file_system_is_a_config_error(tmp_path: Path) -> None:
    # found by fuzz/fuzz.py config: Path.is_dir() raised OSError (ENAMETOOLONG)
    with pytest.raises(ConfigError, match=r"^store\.path: .*cannot be a file name"):
        load_config(
            overrides={"store": {"path": str(tmp_path / ("x" * 300) / "r.duckdb")}},
            default_file=tmp_path / "none.toml",
        )


def test_parse_processes_take_a_count_or_auto_and_anything_else_is_refused(
    tmp_path: Path,
) -> None:
    assert load(tmp_path, "[discovery]\nparse_processes = 2\n").discovery.parse_processes == 2
    auto = load(tmp_path, '[discovery]\nparse_processes = "auto"\n')
    assert auto.discovery.parse_processes == "auto"
    for bad in ('"two"', "-1"):
        e = error_of(tmp_path, f"[discovery]\nparse_processes = {bad}\n")
        assert str(e).startswith("discovery.parse_processes: must be 0 or more, or")
    e = error_of(tmp_path, "[discovery]\nparse_processes = true\n")
    assert "expected an integer or a string" in str(e)
    assert str(e).startswith("discovery.parse_processes: ") and "\n" not in str(e)
    assert "fix the value in the config file or the --set flag" in str(e)


def test_the_parse_processes_check_itself_refuses_a_boolean_as_a_count() -> None:
    # True is an int in Python; the check must not rest on the type coercion alone
    check = _CHECKS["discovery.parse_processes"]
    assert check(True) == check(False) == 'must be 0 or more, or "auto"'
    assert check(0) is None and check(3) is None and check("auto") is None
