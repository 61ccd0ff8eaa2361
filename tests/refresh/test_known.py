"""Known change rates (``estimate.known_rates``): the file read, bad files refused, and a listed
page planned at exactly its known rate."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import trio

from refresher._config import load_config
from refresher._errors import ConfigError
from refresher.refresh._allocate import InputSettings, PolicyInputs, page_freshness, plan
from refresher.refresh._known import load_known_rates, with_known_rates
from refresher.sim._simweb import SimwebConfig, plan_web, site_of, write_truth
from refresher.store import DuckDBStore, NewPage, StoreService

NOW = 1_700_000_000.0


def _csv(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "rates.csv"
    path.write_text(text)
    return path


def test_a_csv_of_urls_and_rates_is_read_with_its_urls_in_canonical_form(tmp_path: Path):
    known = load_known_rates(
        _csv(tmp_path, "url,rate\nHTTP://H.example:80/a,0.5\nhttp://h.example/b,0\n")
    )
    assert known.urls.tolist() == ["http://h.example/a", "http://h.example/b"]
    assert known.rates.tolist() == [0.5, 0.0]


@pytest.mark.parametrize("fmt", ["duckdb", "parquet"])
def test_a_simulated_webs_truth_file_gives_every_page_its_true_rate(tmp_path: Path, fmt: str):
    config = SimwebConfig(seed=3, hosts=2, pages_per_host=4)
    site = site_of(plan_web(config, start=NOW), config)
    path = tmp_path / ("truth.duckdb" if fmt == "duckdb" else "truth")
    truth = write_truth(site, path, until=NOW)
    known = load_known_rates(path)
    want = dict(zip(truth.urls.tolist(), truth.rates.tolist(), strict=True))
    assert dict(zip(known.urls.tolist(), known.rates.tolist(), strict=True)) == want


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("url,speed\nhttp://h.example/a,1\n", "url, rate"),
        ("url,rate\nhttp://h.example/a,-1\n", "row 1: the rate of 'http://h.example/a' is -1.0"),
        ("url,rate\nhttp://h.example/a,fast\n", "row 1: the rate of 'http://h.example/a' is nan"),
        ("url,rate\nftp://h.example/a,1\n", "row 1"),
        ("url,rate\nhttp://h.example/a,1\nhttp://h.example/a,2\n", "2 times"),
    ],
)
def test_a_bad_known_rates_file_is_refused_naming_the_key_and_the_fault(
    tmp_path: Path, text: str, problem: str
):
    with pytest.raises(ConfigError, match=r"estimate\.known_rates") as e:
        load_known_rates(_csv(tmp_path, text))
    assert problem in str(e.value)


def test_the_config_refuses_a_known_rates_file_that_is_not_there(tmp_path: Path):
    with pytest.raises(ConfigError, match=r"estimate.known_rates: cannot read .*missing.csv"):
        load_config(
            overrides={"estimate": {"known_rates": str(tmp_path / "missing.csv")}},
            default_file=tmp_path / "none.toml",
        )


def _inputs(n: int = 4) -> PolicyInputs:
    return PolicyInputs(
        page_ids=np.arange(10, 10 + n, dtype=np.int64),
        host_index=np.zeros(n, dtype=np.intp),
        host_caps=np.array([np.inf]),
        last_fetch=np.full(n, np.nan),
        rates=np.full(n, 1e-3),
        rate_n=np.ones(n),
        weights=np.ones(n),
        rate_sd=np.full(n, 1.5),
        static_p=np.full(n, 0.2),
    )


def test_a_listed_page_is_planned_at_exactly_its_known_rate():
    # ids 11 and 13 listed (13 known never to change), 99 not planned, 10 and 12 left alone
    got = with_known_rates(_inputs(), np.array([13, 99, 11, -1]), np.array([0.0, 5.0, 0.25, 7.0]))
    assert got.rates.tolist() == [1e-3, 0.25, 1e-3, pytest.approx(0.0, abs=1e-9)]
    assert got.rate_sd is not None and got.rate_sd.tolist() == [1.5, 0.0, 1.5, 0.0]
    assert got.static_p is not None and got.static_p.tolist() == [0.2, 0.0, 0.2, 1.0]
    # the plan: no exploration for the page that never changes, freshness 1 for it
    made = plan(got, "optimal", 1.0, explore=0.05, decide="expected")
    assert made.target[3] == 0.0
    assert page_freshness(got, made.target)[3] == 1.0


async def test_the_allocators_inputs_take_the_known_rates_of_the_stores_pages(tmp_path: Path):
    store = DuckDBStore(tmp_path / "s.duckdb")
    rows = store.add_pages(
        [NewPage(url=f"http://h.example/{i}", host="h.example", scheme="http") for i in range(3)],
        now=NOW,
    )
    path = _csv(tmp_path, "url,rate\nhttp://h.example/1,0.125\nhttp://other.example/,1\n")
    service = StoreService(store)
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        settings = InputSettings(weights="none", known=load_known_rates(path))
        got = await settings.load(service)
        service.close()
    assert got.page_ids.tolist() == [r.id for r in rows]
    assert got.rates[1] == 0.125 and got.rates[0] != 0.125
    assert got.rate_sd is not None and got.rate_sd[1] == 0.0
