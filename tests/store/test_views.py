"""The freshness views against hand-computed figures on small, known histories."""

from __future__ import annotations

import decimal
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb
import pytest

from refresher._errors import StoreError
from refresher.store import DuckDBStore
from refresher.store._views import PRIOR_RATE, attach_truth, create_views, views_sql

OK_STATUSES = (200, 304)


@dataclass
class History:
    """Rows written straight into a real store file, and the same facts for the reference."""

    con: duckdb.DuckDBPyConnection
    pages: dict[int, tuple[str, str, float, float | None]] = field(default_factory=dict)
    fetches: list[tuple[int, float, int | None, bool]] = field(default_factory=list)
    hosts: dict[str, int] = field(default_factory=dict)

    def page(self, pid: int, url: str, *, first_seen: float, rate: float | None) -> None:
        host = url.split("/")[2]
        if host not in self.hosts:
            self.hosts[host] = len(self.hosts) + 1
            self.con.execute(
                "INSERT INTO hosts (id, name, scheme) VALUES (?, ?, 'http')",
                [self.hosts[host], host],
            )
        self.con.execute(
            "INSERT INTO pages (id, url, host_id, first_seen, due_at, rate)"
            " VALUES (?, ?, ?, ?, 0, ?)",
            [pid, url, self.hosts[host], first_seen, rate],
        )
        self.pages[pid] = (url, host, first_seen, rate)

    def fetch(
        self, pid: int, at: float, status: int | None = 200, *, changed: bool = False
    ) -> None:
        fid = len(self.fetches) + 1
        host_id = self.hosts[self.pages[pid][1]]
        self.con.execute(
            "INSERT INTO fetches (id, page_id, host_id, started_at, finished_at, duration,"
            " status, bytes, changed, not_modified, error_kind, policy, redirects)"
            " VALUES (?, ?, ?, ?, ?, 0.01, ?, 0, ?, ?, ?, 'uniform', 0)",
            [
                fid,
                pid,
                host_id,
                at - 0.01,
                at,
                status,
                changed,
                status == 304,
                None if status is not None else "connect",
            ],
        )
        self.fetches.append((pid, at, status, changed))

    def policy(self, started_at: float, name: str, budget: float) -> None:
        self.con.execute("INSERT INTO policy_periods VALUES (?, ?, ?)", [started_at, name, budget])

    def truth(self, changes: dict[str, list[float]], rates: dict[str, float]) -> None:
        """Truth tables in the store's own database (the placeholders are then not made)."""
        self.con.execute("CREATE TABLE truth_pages (url VARCHAR, host VARCHAR, rate DOUBLE)")
        self.con.execute("CREATE TABLE truth_changes (url VARCHAR, changed_at DOUBLE)")
        for url, rate in rates.items():
            self.con.execute(
                "INSERT INTO truth_pages VALUES (?, ?, ?)", [url, url.split("/")[2], rate]
            )
        for url, times in changes.items():
            for t in times:
                self.con.execute("INSERT INTO truth_changes VALUES (?, ?)", [url, t])

    def rows(self, sql: str) -> list[dict[str, Any]]:
        cur = self.con.execute(sql)
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[DuckDBStore]:
    s = DuckDBStore(tmp_path / "refresher.duckdb")
    yield s
    s.close()


@pytest.fixture
def history(store: DuckDBStore) -> History:
    return History(store._con)


# -- the closed forms, written out independently of the SQL --------------------------------------


def fresh_integral(lam: float, u: float, v: float) -> float:
    """∫_u^v e^(−λx) dx."""
    return v - u if lam == 0 else (math.exp(-lam * u) - math.exp(-lam * v)) / lam


def age_integral(lam: float, u: float, v: float) -> float:
    """∫_u^v (x − (1 − e^(−λx))/λ) dx, in 60-digit decimals: the closed form cancels badly."""
    if lam == 0:
        return 0.0
    with decimal.localcontext() as ctx:
        ctx.prec = 60
        lam_, u_, v_ = Decimal(lam), Decimal(u), Decimal(v)
        exact = (
            (v_ * v_ - u_ * u_) / 2
            - (v_ - u_) / lam_
            + ((-lam_ * u_).exp() - (-lam_ * v_).exp()) / (lam_ * lam_)
        )
        return float(exact)


def reference(
    h: History, t0: float, t1: float, truth: dict[str, list[float]] | None = None
) -> dict[int, dict[str, float]]:
    """Per page: page-seconds, covered seconds, estimated and true fresh seconds and age areas."""
    out: dict[int, dict[str, float]] = {}
    for pid, (url, _host, first_seen, rate) in h.pages.items():
        lam = rate if rate is not None else math.nan
        times = sorted(t for p, t, st, _ in h.fetches if p == pid and st in OK_STATUSES)
        r = {"page": max(0.0, t1 - max(t0, first_seen)), "covered": 0.0}
        r.update(est_fresh=0.0, est_age=0.0, true_fresh=0.0, true_age=0.0)
        changes = sorted((truth or {}).get(url, []))
        for k, s in enumerate(times):
            e = times[k + 1] if k + 1 < len(times) else math.inf
            a, b = max(s, t0), min(e, t1)
            if b <= a:
                continue
            r["covered"] += b - a
            r["est_fresh"] += fresh_integral(lam, a - s, b - s)
            r["est_age"] += age_integral(lam, a - s, b - s)
            c = next((x for x in changes if x > s), math.inf)
            r["true_fresh"] += max(0.0, min(b, c) - a)
            if c < b:
                z = max(a, c)
                r["true_age"] += ((b - c) ** 2 - (z - c) ** 2) / 2
        if r["page"] > 0:
            out[pid] = r
    return out


# -- the hand-made history ----------------------------------------------------------------------

A1, A2, B1, B2 = (
    "http://a.test/1",
    "http://a.test/2",
    "http://b.test/1",
    "http://b.test/2",
)
TRUTH = {A1: [4.0, 15.0, 16.0, 25.0], A2: [1.0, 30.5], B1: [7.0], B2: [9.5]}
TRUE_RATES = {A1: 0.1, A2: 0.05, B1: 0.02, B2: 0.3}


def build(h: History, *, truth: bool = True) -> None:
    """Four pages over 30 s: a 304, a failed fetch, λ̂ = 0, and a page never fetched."""
    h.page(1, A1, first_seen=0.0, rate=0.1)
    h.page(2, A2, first_seen=0.0, rate=0.05)
    h.page(3, B1, first_seen=5.0, rate=0.0)
    h.page(4, B2, first_seen=8.0, rate=0.2)
    h.fetch(1, 0.0)
    h.fetch(1, 10.0, 304)
    h.fetch(1, 20.0, changed=True)
    h.fetch(2, 2.0)
    h.fetch(2, 12.0, 500)  # a failed fetch refreshes nothing
    h.fetch(2, 22.0, changed=True)
    h.fetch(3, 6.0)
    h.fetch(4, 9.0, None)  # no response: page 4 never gets a copy
    h.policy(0.0, "uniform", 2.0)
    h.policy(15.0, "optimal", 2.0)
    if truth:
        h.truth(TRUTH, TRUE_RATES)
    create_views(h.con)


def test_true_freshness_over_a_window_matches_the_hand_computation(history: History) -> None:
    build(history)
    (row,) = history.rows("SELECT * FROM true_freshness(0, 30)")
    # a.test/1 refreshed at 0, 10, 20; changes at 4, 15, 16, 25: fresh [0,4) [10,15) [20,25),
    # stale with age t−4 on [4,10), t−15 on [15,20), t−25 on [25,30).
    a1_fresh, a1_age = 4 + 5 + 5, 6**2 / 2 + 5**2 / 2 + 5**2 / 2
    # a.test/2 refreshed at 2 and 22 (the 500 at 12 is no refresh); next change at 30.5.
    a2_fresh, a2_age = 20 + 8, 0.0
    # b.test/1 refreshed at 6, changed at 7 and never refreshed again.
    b1_fresh, b1_age = 1, 23**2 / 2
    covered = 30 + 28 + 24  # b.test/2 never had a copy
    assert row["pages"] == 4
    assert row["pages_with_copy"] == 3
    assert row["page_seconds"] == pytest.approx(30 + 30 + 25 + 22, abs=1e-9)
    assert row["covered_seconds"] == pytest.approx(covered, abs=1e-9)
    assert row["coverage"] == pytest.approx(covered / 107, abs=1e-12)
    assert row["freshness"] == pytest.approx((a1_fresh + a2_fresh + b1_fresh) / covered, abs=1e-9)
    assert row["age"] == pytest.approx((a1_age + a2_age + b1_age) / covered, abs=1e-9)
    assert row["refreshes"] == 6


def test_estimated_freshness_integrates_the_exponential_between_refreshes(
    history: History,
) -> None:
    build(history)
    (row,) = history.rows("SELECT * FROM freshness(0, 30)")
    # λ̂ = 0.1 over three 10 s gaps, 0.05 over gaps of 20 s and 8 s, λ̂ = 0 over 24 s.
    fresh = 3 * (1 - math.exp(-1)) / 0.1
    fresh += (1 - math.exp(-1)) / 0.05 + (1 - math.exp(-0.4)) / 0.05 + 24
    age = 3 * (10**2 / 2 - 10 / 0.1 + (1 - math.exp(-1)) / 0.1**2)
    age += 20**2 / 2 - 20 / 0.05 + (1 - math.exp(-1)) / 0.05**2
    age += 8**2 / 2 - 8 / 0.05 + (1 - math.exp(-0.4)) / 0.05**2
    assert row["freshness"] == pytest.approx(fresh / 82, abs=1e-9)
    assert row["age"] == pytest.approx(age / 82, abs=1e-9)
    (truth_row,) = history.rows("SELECT * FROM true_freshness(0, 30)")
    assert truth_row["estimated_freshness"] == pytest.approx(fresh / 82, abs=1e-9)
    assert truth_row["estimated_age"] == pytest.approx(age / 82, abs=1e-9)


@pytest.mark.parametrize(("t0", "t1"), [(5.0, 25.0), (0.0, 15.0), (15.0, 22.0), (3.0, 100.0)])
def test_every_window_matches_the_reference_per_page(
    history: History, t0: float, t1: float
) -> None:
    build(history)
    ref = reference(history, t0, t1, TRUTH)
    rows = history.rows(f"SELECT * FROM true_freshness_per_page({t0}, {t1})")
    assert {r["page_id"] for r in rows} == set(ref)
    for r in rows:
        want = ref[r["page_id"]]
        assert r["page_seconds"] == pytest.approx(want["page"], abs=1e-9)
        assert r["covered_seconds"] == pytest.approx(want["covered"], abs=1e-9)
        if want["covered"] == 0:
            assert r["freshness"] is None and r["age"] is None
            continue
        assert r["freshness"] == pytest.approx(want["true_fresh"] / want["covered"], abs=1e-9)
        assert r["age"] == pytest.approx(want["true_age"] / want["covered"], abs=1e-9)
        assert r["estimated_freshness"] == pytest.approx(
            want["est_fresh"] / want["covered"], abs=1e-9
        )
        assert r["estimated_age"] == pytest.approx(want["est_age"] / want["covered"], abs=1e-9)
        assert r["true_rate"] == TRUE_RATES[history.pages[r["page_id"]][0]]


def test_per_host_splits_add_up_to_the_whole(history: History) -> None:
    build(history)
    hosts = {r["host"]: r for r in history.rows("SELECT * FROM true_freshness_per_host(0, 30)")}
    assert set(hosts) == {"a.test", "b.test"}
    a, b = hosts["a.test"], hosts["b.test"]
    assert a["pages"] == 2 and b["pages"] == 2 and b["pages_with_copy"] == 1
    assert a["freshness"] == pytest.approx((14 + 28) / 58, abs=1e-9)
    assert a["age"] == pytest.approx(43 / 58, abs=1e-9)
    assert b["freshness"] == pytest.approx(1 / 24, abs=1e-9)
    assert b["age"] == pytest.approx(264.5 / 24, abs=1e-9)
    assert b["page_seconds"] == pytest.approx(25 + 22, abs=1e-9)
    est = {r["host"]: r for r in history.rows("SELECT * FROM freshness_per_host(0, 30)")}
    ref = reference(history, 0, 30)
    for host, pids in (("a.test", (1, 2)), ("b.test", (3, 4))):
        covered = sum(ref[p]["covered"] for p in pids)
        assert est[host]["freshness"] == pytest.approx(
            sum(ref[p]["est_fresh"] for p in pids) / covered, abs=1e-9
        )
        assert est[host]["age"] == pytest.approx(
            sum(ref[p]["est_age"] for p in pids) / covered, abs=1e-9
        )


def test_policy_periods_split_the_history_at_each_change_of_policy(history: History) -> None:
    build(history)
    rows = history.rows("SELECT * FROM freshness_by_policy")
    assert [(r["policy"], r["window_start"], r["window_end"]) for r in rows] == [
        ("uniform", 0.0, 15.0),
        ("optimal", 15.0, 22.0),  # the last period ends with the last recorded fetch
    ]
    true_rows = history.rows("SELECT * FROM true_freshness_by_policy()")
    for r, tr in zip(rows, true_rows, strict=True):
        ref = reference(history, r["window_start"], r["window_end"], TRUTH)
        covered = sum(x["covered"] for x in ref.values())
        assert r["budget"] == 2.0
        assert r["covered_seconds"] == pytest.approx(covered, abs=1e-9)
        assert r["freshness"] == pytest.approx(
            sum(x["est_fresh"] for x in ref.values()) / covered, abs=1e-9
        )
        assert r["age"] == pytest.approx(
            sum(x["est_age"] for x in ref.values()) / covered, abs=1e-9
        )
        assert tr["policy"] == r["policy"]
        assert tr["freshness"] == pytest.approx(
            sum(x["true_fresh"] for x in ref.values()) / covered, abs=1e-9
        )


def test_freshness_by_host_covers_the_whole_history_and_now(history: History) -> None:
    build(history)
    by_host = {r["host"]: r for r in history.rows("SELECT * FROM freshness_by_host")}
    window = {r["host"]: r for r in history.rows("SELECT * FROM freshness_per_host(0, 22)")}
    for host in ("a.test", "b.test"):
        assert by_host[host]["window_start"] == 0.0 and by_host[host]["window_end"] == 22.0
        assert by_host[host]["freshness"] == pytest.approx(window[host]["freshness"], abs=1e-12)
    # now = 22: a.test/1 refreshed 2 s ago at λ̂ 0.1, a.test/2 just refreshed
    assert by_host["a.test"]["freshness_now"] == pytest.approx((math.exp(-0.2) + 1) / 2, abs=1e-12)
    assert by_host["b.test"]["freshness_now"] == 1.0  # λ̂ = 0; the page without copy is left out


def test_page_freshness_now_is_the_exponential_since_the_last_refresh(history: History) -> None:
    build(history)
    rows = {r["page_id"]: r for r in history.rows("SELECT * FROM page_freshness_now")}
    assert rows[1]["now"] == 22.0 and rows[1]["last_refresh"] == 20.0
    assert rows[1]["freshness"] == pytest.approx(math.exp(-0.2), abs=1e-12)
    assert rows[1]["age"] == pytest.approx(2 - (1 - math.exp(-0.2)) / 0.1, abs=1e-12)
    assert rows[2]["last_refresh"] == 22.0 and rows[2]["freshness"] == 1.0
    assert rows[3]["freshness"] == 1.0 and rows[3]["age"] == 0.0  # λ̂ = 0 never goes stale
    assert rows[4]["last_refresh"] is None and rows[4]["freshness"] is None  # no copy yet
    (now,) = history.rows("SELECT * FROM freshness_now")
    assert now["pages"] == 4 and now["pages_with_copy"] == 3
    assert now["freshness"] == pytest.approx((math.exp(-0.2) + 2) / 3, abs=1e-12)


def test_a_series_of_windows_tiles_the_interval(history: History) -> None:
    build(history)
    rows = history.rows("SELECT * FROM true_freshness_series(0, 30, 7)")
    assert [(r["window_start"], r["window_end"]) for r in rows] == [
        (0.0, 7.0),
        (7.0, 14.0),
        (14.0, 21.0),
        (21.0, 28.0),
        (28.0, 30.0),
    ]
    for r in rows:
        (single,) = history.rows(
            f"SELECT * FROM true_freshness({r['window_start']}, {r['window_end']})"
        )
        for column in ("pages", "pages_with_copy", "refreshes"):
            assert r[column] == single[column]
        for column in ("page_seconds", "covered_seconds", "freshness", "age"):
            assert r[column] == pytest.approx(single[column], abs=1e-12)
    # the page-seconds of the tiles add up to the whole window's
    (whole,) = history.rows("SELECT * FROM true_freshness(0, 30)")
    assert sum(r["page_seconds"] for r in rows) == pytest.approx(whole["page_seconds"], abs=1e-9)
    assert sum(r["refreshes"] for r in rows) == whole["refreshes"]


def test_a_window_before_any_page_existed_has_no_row(history: History) -> None:
    build(history)
    assert history.rows("SELECT * FROM freshness(-10, -5)") == []
    assert history.rows("SELECT * FROM true_freshness_per_page(-10, -5)") == []


def test_a_tiny_rate_keeps_its_digits(history: History) -> None:
    lam, gap = 1e-9, 10.0
    history.page(1, A1, first_seen=0.0, rate=lam)
    history.fetch(1, 0.0)
    history.fetch(1, gap)
    create_views(history.con)
    (now,) = history.rows("SELECT * FROM page_freshness_now")
    assert now["age"] == 0.0
    (row,) = history.rows(f"SELECT * FROM freshness_per_page(0, {gap})")
    y = lam * gap
    # series: ∫₀^L e^(−λx) dx / L = 1 − y/2 + y²/6; ∫₀^L E[age] dx / L = L·(y/6 − y²/24)
    assert row["freshness"] == pytest.approx(1 - y / 2 + y * y / 6, rel=1e-15)
    assert row["age"] == pytest.approx(gap * (y / 6 - y * y / 24), rel=1e-9)


def test_missing_rates_fall_back_to_history_then_pooled_then_prior(history: History) -> None:
    history.page(1, A1, first_seen=0.0, rate=None)
    history.page(2, A2, first_seen=0.0, rate=None)
    history.page(3, B1, first_seen=0.0, rate=None)
    history.page(4, B2, first_seen=0.0, rate=0.25)
    for t in (0.0, 10.0, 30.0):
        history.fetch(1, t, changed=t == 30.0)
    history.fetch(1, 40.0, 503)
    history.fetch(2, 5.0)
    create_views(history.con)
    rates = {r["page_id"]: r for r in history.rows("SELECT * FROM page_rates")}
    # two intervals over 30 s, one changed: Cho & Garcia-Molina
    assert rates[1]["rate_source"] == "history"
    assert rates[1]["rate"] == pytest.approx(-math.log(1.5 / 2.5) * 2 / 30, rel=1e-12)
    assert (rates[1]["intervals"], rates[1]["changes"], rates[1]["span"]) == (2, 1, 30.0)
    # fetched once: every page's changes over every page's observed seconds
    assert rates[2]["rate_source"] == "pooled" and rates[2]["rate"] == pytest.approx(1 / 30)
    assert rates[3]["rate_source"] == "pooled"
    assert rates[4]["rate_source"] == "estimator" and rates[4]["rate"] == 0.25


def test_with_no_history_at_all_the_prior_rate_is_used(history: History) -> None:
    history.page(1, A1, first_seen=0.0, rate=None)
    history.page(2, A2, first_seen=0.0, rate=math.nan)
    history.fetch(1, 3.0)
    create_views(history.con)
    rows = history.rows("SELECT * FROM page_rates ORDER BY page_id")
    assert [(r["rate_source"], r["rate"]) for r in rows] == [
        ("prior", PRIOR_RATE),
        ("prior", PRIOR_RATE),
    ]


def test_true_macros_return_nothing_until_a_truth_is_attached(history: History) -> None:
    build(history, truth=False)
    assert history.rows("SELECT * FROM true_freshness(0, 30)") == []
    assert history.rows("SELECT * FROM true_freshness_by_host()") == []


def truth_database(path: Path) -> Path:
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE truth_pages (url VARCHAR, host VARCHAR, rate DOUBLE)")
    con.execute("CREATE TABLE truth_changes (url VARCHAR, changed_at DOUBLE)")
    con.executemany(
        "INSERT INTO truth_pages VALUES (?, ?, ?)",
        [[u, u.split("/")[2], r] for u, r in TRUE_RATES.items()],
    )
    con.executemany(
        "INSERT INTO truth_changes VALUES (?, ?)", [[u, t] for u, ts in TRUTH.items() for t in ts]
    )
    con.close()
    return path


@pytest.mark.parametrize("form", ["duckdb", "parquet"])
def test_an_attached_truth_file_feeds_the_true_macros(
    history: History, tmp_path: Path, form: str
) -> None:
    build(history, truth=False)
    truth = truth_database(tmp_path / "truth.duckdb")
    if form == "parquet":
        directory = tmp_path / "truth"
        directory.mkdir()
        con = duckdb.connect(str(truth), read_only=True)
        for name in ("truth_pages", "truth_changes"):
            con.execute(f"COPY {name} TO '{directory / name}.parquet' (FORMAT parquet)")
        con.close()
        truth = directory
    attach_truth(history.con, truth)
    (row,) = history.rows("SELECT * FROM true_freshness(0, 30)")
    assert row["freshness"] == pytest.approx(43 / 82, abs=1e-9)


def test_a_truth_without_the_agreed_tables_is_refused(history: History, tmp_path: Path) -> None:
    build(history, truth=False)
    with pytest.raises(StoreError, match="no truth file"):
        attach_truth(history.con, tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(StoreError, match="truth_pages, truth_changes"):
        attach_truth(history.con, tmp_path / "empty")
    bad = duckdb.connect(str(tmp_path / "bad.duckdb"))
    bad.execute("CREATE TABLE truth_pages (address VARCHAR)")
    bad.close()
    with pytest.raises(StoreError, match="agreed columns"):
        attach_truth(history.con, tmp_path / "bad.duckdb")


def test_views_over_a_read_only_store_are_temporary(tmp_path: Path) -> None:
    store = DuckDBStore(tmp_path / "refresher.duckdb")
    build(History(store._con), truth=False)
    store._con.execute("DROP VIEW freshness_now")  # so that only the TEMP one can answer
    store.close()
    con = duckdb.connect(str(store.path), read_only=True)
    create_views(con, temporary=True)
    attach_truth(con, truth_database(tmp_path / "truth.duckdb"))
    assert con.execute("SELECT pages FROM freshness_now").fetchall() == [(4,)]
    (fresh,) = con.execute("SELECT freshness FROM true_freshness(0, 30)").fetchone() or (None,)
    assert fresh == pytest.approx(43 / 82, abs=1e-9)
    con.close()


def test_views_in_an_attached_database_work_when_it_is_opened(
    history: History, tmp_path: Path
) -> None:
    build(history)
    copy = tmp_path / "copy.duckdb"
    history.con.execute(f"ATTACH '{copy}' AS copy")
    for table in ("pages", "hosts", "fetches", "policy_periods"):
        history.con.execute(f"CREATE TABLE copy.{table} AS SELECT * FROM {table}")
    history.con.execute("DELETE FROM copy.fetches WHERE finished_at > 15")
    create_views(history.con, schema="copy")
    (current,) = history.con.execute("SELECT current_database()").fetchone() or ("",)
    assert current == "refresher"  # the connection's default is put back
    history.con.execute("DETACH copy")
    con = duckdb.connect(str(copy), read_only=True)
    (row,) = con.execute("SELECT covered_seconds FROM freshness(0, 30)").fetchall()
    con.close()
    assert row[0] == pytest.approx(30 + 28 + 24, abs=1e-9)  # the copy's history, not the store's


def test_random_histories_match_the_reference(history: History) -> None:
    rng = random.Random(7)
    truth: dict[str, list[float]] = {}
    for pid in range(1, 21):
        url = f"http://h{pid % 3}.test/p{pid}"
        rate = rng.choice([None, 0.0, rng.uniform(0.001, 0.5)])
        history.page(pid, url, first_seen=rng.uniform(0, 20), rate=rate)
        t = history.pages[pid][2]
        for _ in range(rng.randrange(0, 8)):
            t += rng.expovariate(0.2)
            history.fetch(pid, t, rng.choice([200, 200, 304, 500, None]))
        truth[url] = sorted(rng.uniform(0, 80) for _ in range(rng.randrange(0, 10)))
    history.truth(truth, {u: 0.1 for u in truth})
    create_views(history.con)
    rates = {r["page_id"]: r["rate"] for r in history.rows("SELECT * FROM page_rates")}
    # the reference takes λ̂ as the SQL chose it (the fallbacks are tested on their own)
    for pid, (url, host, fs, _) in list(history.pages.items()):
        history.pages[pid] = (url, host, fs, rates[pid])
    for t0, t1 in ((0.0, 80.0), (13.5, 41.25), (30.0, 31.0)):
        ref = reference(history, t0, t1, truth)
        rows = {
            r["page_id"]: r
            for r in history.rows(f"SELECT * FROM true_freshness_per_page({t0}, {t1})")
        }
        assert set(rows) == set(ref)
        for pid, want in ref.items():
            got = rows[pid]
            assert got["covered_seconds"] == pytest.approx(want["covered"], abs=1e-9)
            if want["covered"] > 0:
                assert got["freshness"] == pytest.approx(
                    want["true_fresh"] / want["covered"], abs=1e-9
                )
                assert got["age"] == pytest.approx(want["true_age"] / want["covered"], abs=1e-9)
                assert got["estimated_age"] == pytest.approx(
                    want["est_age"] / want["covered"], abs=1e-9
                )
        (total,) = history.rows(f"SELECT * FROM true_freshness({t0}, {t1})")
        covered = sum(x["covered"] for x in ref.values())
        assert total["page_seconds"] == pytest.approx(
            sum(x["page"] for x in ref.values()), abs=1e-9
        )
        assert total["pages_with_copy"] == sum(1 for x in ref.values() if x["covered"] > 0)
        assert total["freshness"] == pytest.approx(
            sum(x["true_fresh"] for x in ref.values()) / covered, abs=1e-9
        )
        assert total["age"] == pytest.approx(
            sum(x["true_age"] for x in ref.values()) / covered, abs=1e-9
        )


def test_the_analysis_script_is_the_generated_sql(history: History) -> None:
    script = Path(__file__).parents[2] / "analysis" / "views.sql"
    assert script.read_text() == views_sql(), (
        "regenerate: python -m refresher.store._views > analysis/views.sql"
    )
    build(history, truth=False)
    history.con.execute(script.read_text())
    assert history.rows("SELECT pages FROM freshness_now") == [{"pages": 4}]


def test_an_attached_truth_shows_when_its_pages_appeared(history: History, tmp_path: Path) -> None:
    build(history, truth=False)
    attach_truth(history.con, truth_database(tmp_path / "old.duckdb"))
    assert {r["created_at"] for r in history.rows("SELECT created_at FROM truth_pages")} == {None}
    newer = truth_database(tmp_path / "new.duckdb")
    con = duckdb.connect(str(newer))
    con.execute("ALTER TABLE truth_pages ADD COLUMN created_at DOUBLE DEFAULT 7.5")
    con.close()
    attach_truth(history.con, newer)
    assert {r["created_at"] for r in history.rows("SELECT created_at FROM truth_pages")} == {7.5}
