"""Freshness and age in DuckDB: documented views and table macros over the fetch history.

Everything here is SQL over the store's tables (``pages``, ``hosts``, ``fetches``,
``policy_periods``) or over a snapshot's copies of them (see :mod:`refresher.store._snapshot`), so a
stock ``duckdb`` CLI can run it. :func:`create_views` (re)creates the objects;
``analysis/views.sql`` is the same SQL as a file for ``.read``.

Units: every time is unix seconds (DOUBLE; ``to_timestamp(x)`` shows it), every duration and
every age is seconds, freshness is a fraction in [0, 1], rates are per second.

The model (Cho & Garcia-Molina 2003; docs/model.md). A *refresh* is a successful fetch
(:func:`refresher.store.is_success`: a complete 2xx answer, or a 304 to a conditional GET; the
copy equals the live page as of the fetch's ``finished_at``); a failed fetch refreshes nothing.
Between a
refresh at s and the next one the copy is estimated fresh at t with probability
``P = e^(−λ̂(t−s))`` and its expected age is ``E[age] = (t−s) − (1 − e^(−λ̂(t−s)))/λ̂``.
Time averages integrate these exactly between refresh points (∫ e^(−λx) dx = (1 − e^(−λL))/λ
over a gap of length L). With the simulated web's truth attached, the *true* freshness and age
are exact: a copy is fresh from its refresh until the first true change after it, and from that
change its age grows linearly until the next refresh.

λ̂ is ``pages.rate`` (the estimator's, changes per second). Where it is NULL the views fall
back, in this order (``rate_source`` says which): ``history`` — Cho & Garcia-Molina's estimator
on the page's own successful fetches, ``−ln((n − X + 0.5)/(n + 0.5)) · n / span`` with n
intervals, X of them changed, over ``span`` seconds; ``pooled`` — every page's changes over every
page's observed seconds, for pages fetched once only; ``prior`` — :data:`PRIOR_RATE` (one change
a day) when there is no history at all. λ̂ = 0 means the page is estimated never to change
(always fresh, age 0). The store keeps only the latest λ̂, so past windows use today's λ̂.

Time averages are over the time a page *has a copy* (from its first refresh on):
``freshness = fresh page-seconds / covered page-seconds``, likewise ``age``; with every page
covered this is the mean over pages of each page's time average. ``coverage`` is covered
page-seconds over page-seconds of existence (from ``pages.first_seen``), so
``freshness · coverage`` is the strict figure that counts a page without a copy as stale.

Views (no parameters; "now" is ``history_span.ended_at``, the last recorded event, so a
snapshot reads the same however long after it is opened):

- ``history_span(started_at, ended_at)``
- ``refreshes(fetch_id, page_id, refreshed_at, next_refresh_at, status, changed, policy)``
- ``page_rates(page_id, rate, rate_source, intervals, changes, span)``
- ``page_freshness_now(page_id, url, host, last_refresh, now, since_refresh, rate, rate_source,
  freshness, age)`` — one row per page, NULL freshness/age for a page without a copy
- ``freshness_now(now, pages, pages_with_copy, freshness, age)``
- ``policy_windows(window_start, window_end, policy, budget)`` — the policy periods
- ``freshness_by_policy(window_start, window_end, policy, budget, <window columns>)``
- ``freshness_by_host(window_start, window_end, host, <window columns>, freshness_now,
  age_now)`` — over the whole history

Table macros (t0, t1: unix seconds; step: seconds), each returning the window columns
``pages, pages_with_copy, page_seconds, covered_seconds, coverage, freshness, age, refreshes``:

- ``freshness(t0, t1)``, ``freshness_per_host(t0, t1)``, ``freshness_series(t0, t1, step)``
- ``freshness_per_page(t0, t1)`` (per page, with ``rate`` and ``rate_source``)
- with truth: ``true_freshness(t0, t1)``, ``true_freshness_per_host(t0, t1)``,
  ``true_freshness_series(t0, t1, step)``, ``true_freshness_per_page(t0, t1)``,
  ``true_freshness_by_policy()``, ``true_freshness_by_host()``: ``freshness``/``age`` are the
  true ones, ``estimated_freshness``/``estimated_age`` the estimates over the same pages.

The truth (written by the simulated web): ``truth_pages(url, host, rate, created_at)`` (true
changes per second; unix seconds the page appeared, NULL for pages there from the start) and
``truth_changes(url, changed_at)`` (unix seconds of every true change); ``url`` is the canonical
URL, as in ``pages.url``. Without it those two names are empty placeholder views and
the true_* macros return no rows; :func:`attach_truth` (or ``CREATE TEMP VIEW truth_pages AS
...`` by hand) shadows them for one session. Only pages both in the store and in the truth
count; changes after the truth was written are unknown, so keep windows within it.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Literal

import duckdb

from refresher._errors import StoreError
from refresher.store._interface import success_sql

__all__ = [
    "MACROS",
    "PRIOR_RATE",
    "SUCCESS",
    "TRUTH_PLACEHOLDERS",
    "VIEWS",
    "attach_truth",
    "create_views",
    "views_sql",
]

#: λ̂ when a page has no estimate and there is no history at all: one change a day, per second.
PRIOR_RATE = 1.0 / 86_400.0

#: A fetch that refreshes the copy (alias ``f`` for fetches).
SUCCESS = success_sql("f")

_INF = "CAST('infinity' AS DOUBLE)"

# Scalar helpers. 1 − e^(−y) and its integrals lose every digit to cancellation for small y
# (λ̂ of one change a month over a gap of seconds), so small y takes the Taylor series.
_HELPERS: tuple[tuple[str, str], ...] = (
    (
        "_rf_one_minus_exp",
        "(y) AS CASE WHEN y < 1e-5 THEN y * (1 - y * (1 / 2 - y / 6)) ELSE 1 - exp(-y) END",
    ),
    # y − (1 − e^(−y)): λ·E[age] at λΔ = y
    (
        "_rf_age_kernel",
        "(y) AS CASE WHEN y < 1e-2"
        " THEN y * y * (1 / 2 - y * (1 / 6 - y * (1 / 24 - y * (1 / 120 - y / 720))))"
        " ELSE y - 1 + exp(-y) END",
    ),
    # G(y) = ∫₀^y (x − 1 + e^(−x)) dx = y²/2 − y + 1 − e^(−y)
    (
        "_rf_age_area",
        "(y) AS CASE WHEN y < 1e-2"
        " THEN y * y * y * (1 / 6 - y * (1 / 24 - y * (1 / 120 - y * (1 / 720 - y / 5040))))"
        " ELSE y * y / 2 - y + 1 - exp(-y) END",
    ),
    # E[age] (seconds) d seconds after a refresh
    (
        "_rf_expected_age",
        "(lam, d) AS CASE WHEN lam <= 0 THEN 0.0 ELSE _rf_age_kernel(lam * d) / lam END",
    ),
    # ∫ e^(−λx) dx over [u, v] (seconds after the refresh): expected fresh seconds
    (
        "_rf_fresh_integral",
        "(lam, u, v) AS CASE WHEN lam <= 0 THEN v - u"
        " ELSE exp(-lam * u) * _rf_one_minus_exp(lam * (v - u)) / lam END",
    ),
    # ∫ E[age](x) dx over [u, v]: seconds²
    (
        "_rf_age_integral",
        "(lam, u, v) AS CASE WHEN lam <= 0 THEN 0.0"
        " ELSE (_rf_age_area(lam * v) - _rf_age_area(lam * u)) / (lam * lam) END",
    ),
)

#: Empty stand-ins so the true_* macros bind; a session's truth shadows them (TEMP views).
TRUTH_PLACEHOLDERS: tuple[tuple[str, str], ...] = (
    (
        "truth_pages",
        "SELECT CAST(NULL AS VARCHAR) AS url, CAST(NULL AS VARCHAR) AS host,"
        " CAST(NULL AS DOUBLE) AS rate, CAST(NULL AS DOUBLE) AS created_at WHERE false",
    ),
    (
        "truth_changes",
        "SELECT CAST(NULL AS VARCHAR) AS url, CAST(NULL AS DOUBLE) AS changed_at WHERE false",
    ),
)

_HISTORY_SPAN = """
SELECT (SELECT min(first_seen) FROM pages) AS started_at,
       greatest((SELECT max(finished_at) FROM fetches), (SELECT max(first_seen) FROM pages),
                (SELECT max(started_at) FROM policy_periods)) AS ended_at
"""

_REFRESHES = f"""
SELECT f.id AS fetch_id, f.page_id, f.finished_at AS refreshed_at,
       lead(f.finished_at) OVER (PARTITION BY f.page_id ORDER BY f.finished_at, f.id)
           AS next_refresh_at,
       f.status, f.changed, f.policy
FROM fetches f
WHERE {SUCCESS}
"""

_PAGE_RATES = f"""
WITH hist AS (
    SELECT f.page_id, count(*) - 1 AS intervals, count(*) FILTER (WHERE f.changed) AS changes,
           max(f.finished_at) - min(f.finished_at) AS span
    FROM fetches f WHERE {SUCCESS} GROUP BY f.page_id
), pooled AS (
    SELECT sum(changes) / nullif(sum(span), 0) AS rate FROM hist WHERE intervals > 0
), chosen AS (
    SELECT p.id AS page_id, h.intervals, h.changes, h.span,
           CASE WHEN p.rate >= 0 AND isfinite(p.rate) THEN 'estimator'
                WHEN h.intervals > 0 AND h.span > 0 THEN 'history'
                WHEN pooled.rate > 0 THEN 'pooled'
                ELSE 'prior' END AS rate_source,
           p.rate AS stored, pooled.rate AS pooled_rate
    FROM pages p LEFT JOIN hist h ON h.page_id = p.id CROSS JOIN pooled
)
SELECT page_id,
       CASE rate_source
           WHEN 'estimator' THEN stored
           WHEN 'history' THEN -ln((intervals - least(changes, intervals) + 0.5)
                                   / (intervals + 0.5)) * intervals / span
           WHEN 'pooled' THEN pooled_rate
           ELSE {PRIOR_RATE!r} END AS rate,
       rate_source, coalesce(intervals, 0) AS intervals, coalesce(changes, 0) AS changes,
       span
FROM chosen
"""

_PAGE_FRESHNESS_NOW = f"""
WITH last AS (
    SELECT f.page_id, max(f.finished_at) AS last_refresh
    FROM fetches f WHERE {SUCCESS} GROUP BY f.page_id
)
SELECT p.id AS page_id, p.url, h.name AS host, l.last_refresh, s.ended_at AS now,
       s.ended_at - l.last_refresh AS since_refresh, r.rate, r.rate_source,
       CASE WHEN l.last_refresh IS NULL THEN NULL
            WHEN r.rate <= 0 THEN 1.0
            ELSE exp(-r.rate * (s.ended_at - l.last_refresh)) END AS freshness,
       CASE WHEN l.last_refresh IS NULL THEN NULL
            ELSE _rf_expected_age(r.rate, s.ended_at - l.last_refresh) END AS age
FROM pages p
JOIN hosts h ON h.id = p.host_id
JOIN page_rates r ON r.page_id = p.id
LEFT JOIN last l ON l.page_id = p.id
CROSS JOIN history_span s
"""

_FRESHNESS_NOW = """
SELECT (SELECT ended_at FROM history_span) AS now, count(*) AS pages,
       count(last_refresh) AS pages_with_copy, avg(freshness) AS freshness, avg(age) AS age
FROM page_freshness_now
"""

_POLICY_WINDOWS = """
SELECT started_at AS window_start,
       greatest(started_at, coalesce(lead(started_at) OVER (ORDER BY started_at),
                                     (SELECT ended_at FROM history_span))) AS window_end,
       policy, budget
FROM policy_periods
"""

_WHOLE_HISTORY = "SELECT started_at AS window_start, ended_at AS window_end FROM history_span"
_ONE_WINDOW = "SELECT CAST(t0 AS DOUBLE) AS window_start, CAST(t1 AS DOUBLE) AS window_end"
_SERIES = """
SELECT CAST(t0 AS DOUBLE) + i * CAST(step AS DOUBLE) AS window_start,
       least(CAST(t0 AS DOUBLE) + (i + 1) * CAST(step AS DOUBLE), CAST(t1 AS DOUBLE))
           AS window_end
FROM range(0, CAST(ceil((t1 - t0) / step) AS BIGINT)) AS _steps(i)
"""

Per = Literal["all", "host", "page"]


def _windowed(windows: str, *, per: Per, truth: bool) -> str:
    """Time-averaged freshness and age per window of ``windows`` (and per host or page).

    ``windows`` is a query with columns ``window_start``, ``window_end`` and any others, which
    are passed through. Segments between refreshes are clipped to each window by an interval
    join; exposure (page-seconds of existence) comes from cumulative sums of ``first_seen``
    looked up with ASOF joins, so it costs O(pages + windows), not O(pages × windows).
    """
    if truth:
        page_set = """
        SELECT p.id, p.url, p.host_id, p.first_seen, t.rate AS true_rate
        FROM pages p
        JOIN (SELECT url, any_value(rate) AS rate FROM truth_pages GROUP BY url) t
            ON t.url = p.url
        """
        # Change times keyed by page id: an ASOF join on integers is much faster than on URLs.
        changes = """
    tc AS MATERIALIZED (
        SELECT ps.id AS page_id, t.changed_at FROM truth_changes t JOIN ps ON ps.url = t.url
    ),"""
        change = "tc.changed_at AS c"
        change_join = (
            "ASOF LEFT JOIN tc ON tc.page_id = r.page_id AND tc.changed_at > r.refreshed_at"
        )
        true_sums = f"""
            sum(greatest(0.0, least(b, coalesce(c, {_INF})) - a)) AS true_fresh,
            sum(CASE WHEN c < b THEN (b - greatest(a, c)) * (b + greatest(a, c) - 2 * c) / 2
                     ELSE 0.0 END) AS true_age,"""
    else:
        page_set = (
            "SELECT p.id, p.url, p.host_id, p.first_seen, CAST(NULL AS DOUBLE) AS true_rate"
            " FROM pages p"
        )
        changes = ""
        change = "CAST(NULL AS DOUBLE) AS c"
        change_join = ""
        true_sums = ""
    key = "ps.host_id" if per == "host" else "ps.id" if per == "page" else "0"
    common = f"""
    WITH w AS MATERIALIZED (
        SELECT row_number() OVER (ORDER BY window_start, window_end) AS window_id, *
        FROM ({windows})
    ),
    ps AS MATERIALIZED ({page_set}),{changes}
    seg AS MATERIALIZED (
        SELECT r.page_id, {key} AS k, r.refreshed_at AS s,
               coalesce(r.next_refresh_at, {_INF}) AS e, pr.rate AS lam, {change}
        FROM refreshes r
        JOIN ps ON ps.id = r.page_id
        JOIN page_rates pr ON pr.page_id = r.page_id
        {change_join}
    ),
    clip AS (
        SELECT window_id, page_id, k, lam, c, a, b, a - s AS u, b - s AS v, starts_inside
        FROM (
            SELECT w.window_id, seg.page_id, seg.k, seg.lam, seg.s, seg.c,
                   greatest(seg.s, w.window_start) AS a, least(seg.e, w.window_end) AS b,
                   seg.s >= w.window_start AS starts_inside
            FROM seg JOIN w ON seg.s < w.window_end AND seg.e > w.window_start
        )
    )"""
    sums = f"""
               sum(b - a) AS covered,
               sum(_rf_fresh_integral(lam, u, v)) AS est_fresh,
               sum(_rf_age_integral(lam, u, v)) AS est_age,{true_sums}
               count(*) FILTER (WHERE starts_inside) AS refreshes"""
    fresh, age = ("true_fresh", "true_age") if truth else ("est_fresh", "est_age")
    est_columns = (
        """,
           a.est_fresh / nullif(a.covered, 0) AS estimated_freshness,
           a.est_age / nullif(a.covered, 0) AS estimated_age"""
        if truth
        else ""
    )
    if per == "page":
        extra = ", ps.true_rate" if truth else ""
        return f"""{common},
    agg AS (SELECT window_id, page_id,{sums} FROM clip GROUP BY window_id, page_id)
    SELECT w.* EXCLUDE (window_id), ps.id AS page_id, ps.url, h.name AS host,
           w.window_end - greatest(w.window_start, ps.first_seen) AS page_seconds,
           coalesce(a.covered, 0.0) AS covered_seconds,
           coalesce(a.covered, 0.0)
               / nullif(w.window_end - greatest(w.window_start, ps.first_seen), 0) AS coverage,
           a.{fresh} / nullif(a.covered, 0) AS freshness,
           a.{age} / nullif(a.covered, 0) AS age,
           coalesce(a.refreshes, 0) AS refreshes{est_columns},
           pr.rate, pr.rate_source{extra}
    FROM w
    JOIN ps ON ps.first_seen < w.window_end
    JOIN hosts h ON h.id = ps.host_id
    JOIN page_rates pr ON pr.page_id = ps.id
    LEFT JOIN agg a ON a.window_id = w.window_id AND a.page_id = ps.id
    ORDER BY w.window_start, w.window_end, ps.url
    """
    # Page counts and page-seconds of existence come from cumulative sums over first_seen (and
    # counts over each page's first refresh), looked up with ASOF joins: O(pages + windows),
    # not O(pages × windows). Times are taken from an origin so that n·t − Σ first_seen keeps
    # its digits.
    host_column = "h.name AS host, " if per == "host" else ""
    host_join = "JOIN hosts h ON h.id = e.k" if per == "host" else ""
    host_order = ", host" if per == "host" else ""
    return f"""{common},
    origin AS (SELECT coalesce(min(first_seen), 0.0) AS o FROM ps),
    births AS (
        SELECT {key} AS k, ps.first_seen - origin.o AS fs, count(*) AS n
        FROM ps CROSS JOIN origin GROUP BY ALL
    ),
    cum AS (
        SELECT k, fs, CAST(sum(n) OVER (PARTITION BY k ORDER BY fs) AS BIGINT) AS n_le,
               sum(n * fs) OVER (PARTITION BY k ORDER BY fs) AS s_le
        FROM births
    ),
    firsts AS (
        SELECT k, fr, count(*) OVER (PARTITION BY k ORDER BY fr) AS n_le
        FROM (SELECT k, min(s) - any_value(origin.o) AS fr
              FROM seg CROSS JOIN origin GROUP BY page_id, k)
    ),
    wk AS (
        SELECT w.window_id, keys.k, w.window_start - origin.o AS t0_,
               w.window_end - origin.o AS t1_
        FROM w CROSS JOIN (SELECT DISTINCT k FROM births) keys CROSS JOIN origin
    ),
    exposure AS (
        SELECT wk.window_id, wk.k, coalesce(c1.n_le, 0) AS pages,
               (coalesce(c1.n_le, 0) * wk.t1_ - coalesce(c1.s_le, 0.0))
               - (coalesce(c0.n_le, 0) * wk.t0_ - coalesce(c0.s_le, 0.0)) AS page_seconds,
               coalesce(f1.n_le, 0) AS pages_with_copy
        FROM wk
        ASOF LEFT JOIN cum c1 ON c1.k = wk.k AND c1.fs < wk.t1_
        ASOF LEFT JOIN cum c0 ON c0.k = wk.k AND c0.fs < wk.t0_
        ASOF LEFT JOIN firsts f1 ON f1.k = wk.k AND f1.fr < wk.t1_
    ),
    agg AS (SELECT window_id, k,{sums} FROM clip GROUP BY window_id, k)
    SELECT w.* EXCLUDE (window_id), {host_column}
           e.pages, e.pages_with_copy, e.page_seconds,
           coalesce(a.covered, 0.0) AS covered_seconds,
           coalesce(a.covered, 0.0) / nullif(e.page_seconds, 0) AS coverage,
           a.{fresh} / nullif(a.covered, 0) AS freshness,
           a.{age} / nullif(a.covered, 0) AS age,
           coalesce(a.refreshes, 0) AS refreshes{est_columns}
    FROM exposure e
    JOIN w ON w.window_id = e.window_id
    LEFT JOIN agg a ON a.window_id = e.window_id AND a.k = e.k
    {host_join}
    WHERE e.pages > 0
    ORDER BY w.window_start, w.window_end{host_order}
    """


_FRESHNESS_BY_HOST = f"""
WITH span AS ({_windowed(_WHOLE_HISTORY, per="host", truth=False)}),
now_ AS (
    SELECT host, avg(freshness) AS freshness_now, avg(age) AS age_now
    FROM page_freshness_now GROUP BY host
)
SELECT span.*, now_.freshness_now, now_.age_now
FROM span LEFT JOIN now_ ON now_.host = span.host
ORDER BY span.host
"""

#: (name, query) of every view, in creation order.
VIEWS: tuple[tuple[str, str], ...] = (
    ("history_span", _HISTORY_SPAN),
    ("refreshes", _REFRESHES),
    ("page_rates", _PAGE_RATES),
    ("page_freshness_now", _PAGE_FRESHNESS_NOW),
    ("freshness_now", _FRESHNESS_NOW),
    ("policy_windows", _POLICY_WINDOWS),
    ("freshness_by_policy", _windowed("SELECT * FROM policy_windows", per="all", truth=False)),
    ("freshness_by_host", _FRESHNESS_BY_HOST),
)

#: (name, parameters, query) of every table macro, in creation order.
MACROS: tuple[tuple[str, str, str], ...] = (
    ("freshness", "t0, t1", _windowed(_ONE_WINDOW, per="all", truth=False)),
    ("freshness_per_host", "t0, t1", _windowed(_ONE_WINDOW, per="host", truth=False)),
    ("freshness_per_page", "t0, t1", _windowed(_ONE_WINDOW, per="page", truth=False)),
    ("freshness_series", "t0, t1, step", _windowed(_SERIES, per="all", truth=False)),
    ("true_freshness", "t0, t1", _windowed(_ONE_WINDOW, per="all", truth=True)),
    ("true_freshness_per_host", "t0, t1", _windowed(_ONE_WINDOW, per="host", truth=True)),
    ("true_freshness_per_page", "t0, t1", _windowed(_ONE_WINDOW, per="page", truth=True)),
    ("true_freshness_series", "t0, t1, step", _windowed(_SERIES, per="all", truth=True)),
    (
        "true_freshness_by_policy",
        "",
        _windowed("SELECT * FROM policy_windows", per="all", truth=True),
    ),
    ("true_freshness_by_host", "", _windowed(_WHOLE_HISTORY, per="host", truth=True)),
)


def _statements(*, temporary: bool, placeholders: bool) -> list[str]:
    temp = "TEMP " if temporary else ""
    out = [f"CREATE OR REPLACE {temp}MACRO {name}{body}" for name, body in _HELPERS]
    if placeholders:
        out += [f"CREATE OR REPLACE {temp}VIEW {n} AS {q.strip()}" for n, q in TRUTH_PLACEHOLDERS]
    out += [f"CREATE OR REPLACE {temp}VIEW {name} AS {q.strip()}" for name, q in VIEWS]
    out += [
        f"CREATE OR REPLACE {temp}MACRO {name}({params}) AS TABLE {q.strip()}"
        for name, params, q in MACROS
    ]
    return out


def views_sql(*, temporary: bool = True) -> str:
    """Every statement :func:`create_views` runs, as one script for the duckdb CLI's ``.read``.

    TEMP objects by default, so the script also works on a database opened read-only.
    """
    header = (
        "-- refresher: freshness and age views (generated by `python -m refresher.store._views`;\n"
        "-- do not edit). Open the store or a snapshot, then `.read analysis/views.sql`.\n"
        "-- Units: unix seconds, seconds, fractions. Docs: refresher/store/_views.py.\n"
        "-- With a simulated web's truth, afterwards (replacing the empty placeholders):\n"
        "--   CREATE OR REPLACE TEMP VIEW truth_pages AS FROM 'truth/truth_pages.parquet';\n"
        "--   CREATE OR REPLACE TEMP VIEW truth_changes AS FROM 'truth/truth_changes.parquet';\n\n"
    )
    return header + "".join(
        f"{s};\n\n" for s in _statements(temporary=temporary, placeholders=True)
    )


def _visible(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    try:
        con.execute(f"SELECT * FROM {name} LIMIT 0").fetchall()
    except duckdb.CatalogException:
        return False
    return True


def create_views(
    con: duckdb.DuckDBPyConnection, *, schema: str | None = None, temporary: bool = False
) -> None:
    """(Re)create the views and macros over the tables of ``schema``.

    ``schema`` is a schema or an attached database (``"snap"``, ``"snap.main"``) that holds the
    store's tables and receives the objects; None means the connection's default. The objects
    refer to the tables by bare name, so open that database as the main one to use its macros.
    ``temporary`` creates TEMP objects (for a database opened read-only). Placeholder
    ``truth_pages``/``truth_changes`` views are made only where no such name is visible.
    """
    previous: tuple[Any, ...] | None = None
    try:
        if schema is not None:
            row = con.execute("SELECT current_database(), current_schema()").fetchall()[0]
            previous = (row[0], row[1])
            con.execute(f"USE {schema}")
        placeholders = not all(_visible(con, n) for n, _ in TRUTH_PLACEHOLDERS)
        for statement in _statements(temporary=temporary, placeholders=placeholders):
            con.execute(statement)
    except duckdb.Error as e:
        raise StoreError(
            f"cannot create the freshness views: {e}; the database needs the store's tables "
            "(pages, hosts, fetches, policy_periods)"
        ) from e
    finally:
        if previous is not None:
            with contextlib.suppress(duckdb.Error):
                con.execute(f'USE "{previous[0]}"."{previous[1]}"')


def _literal(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"


def attach_truth(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    """Make the simulated web's truth visible to this session as TEMP views.

    ``path`` is a DuckDB file with tables ``truth_pages`` and ``truth_changes`` (attached
    read-only as ``rf_truth``), or a directory holding ``truth_pages.parquet`` and
    ``truth_changes.parquet``. The TEMP views shadow the placeholders, so the true_* macros
    see the truth.
    """
    if path.is_dir():
        sources = {
            name: f"read_parquet({_literal(path / f'{name}.parquet')})"
            for name in ("truth_pages", "truth_changes")
        }
        missing = [n for n in sources if not (path / f"{n}.parquet").is_file()]
        if missing:
            raise StoreError(
                f"the truth directory {str(path)!r} lacks {', '.join(missing)}.parquet; "
                "give the directory the simulated web wrote"
            )
    elif path.is_file():
        try:
            con.execute("DETACH DATABASE IF EXISTS rf_truth")
            con.execute(f"ATTACH {_literal(path)} AS rf_truth (READ_ONLY)")
        except duckdb.Error as e:
            raise StoreError(
                f"cannot open the truth file {str(path)!r}: {e}; give a DuckDB file with "
                "tables truth_pages and truth_changes, or a directory of Parquet files"
            ) from e
        sources = {name: f"rf_truth.{name}" for name in ("truth_pages", "truth_changes")}
    else:
        raise StoreError(f"no truth file or directory at {str(path)!r}; fix the path")
    try:
        columns = {
            str(r[0])
            for r in con.execute(f"DESCRIBE SELECT * FROM {sources['truth_pages']}").fetchall()
        }
        # created_at (unix seconds a page appeared, NULL for the first ones) came later;
        # an older truth has none
        created = "created_at" if "created_at" in columns else "NULL"
        con.execute(
            "CREATE OR REPLACE TEMP VIEW truth_pages AS SELECT CAST(url AS VARCHAR) AS url,"
            " CAST(host AS VARCHAR) AS host, CAST(rate AS DOUBLE) AS rate,"
            f" CAST({created} AS DOUBLE) AS created_at FROM {sources['truth_pages']}"
        )
        con.execute(
            "CREATE OR REPLACE TEMP VIEW truth_changes AS SELECT CAST(url AS VARCHAR) AS url,"
            f" CAST(changed_at AS DOUBLE) AS changed_at FROM {sources['truth_changes']}"
        )
    except duckdb.Error as e:
        raise StoreError(
            f"the truth at {str(path)!r} does not have the agreed columns: {e}; expected "
            "truth_pages(url, host, rate[, created_at]) and truth_changes(url, changed_at)"
        ) from e


if __name__ == "__main__":
    print(views_sql(), end="")
