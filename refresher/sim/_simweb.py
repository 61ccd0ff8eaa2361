"""``refresher simweb``: a simulated web with ground truth, for demos, tests and benchmarks.

One loopback port serves many virtual hosts (``h17.sim.test``, reached by the daemon through
``[dns] static``), built deterministically from a seed on top of :class:`refresher.sim._site.Site`:

* **Change rates.** Every page changes as a Poisson process with its own true rate, drawn from
  a mix of classes (:class:`RateClass`): by default a few pages never change, most change
  rarely with a heavy-tailed (log-normal, σ = 1.5) rate, and some change about hourly, which
  a crawler sees as a change on almost every visit. The mix follows the shape measured on the
  real web (Cho & Garcia-Molina 2000: about a fifth of pages change daily or more, a third
  more slowly than monthly). Rates are given per ``rate_unit`` of simulated time (a day) and
  time is compressed ``time_scale`` times, so a few minutes' run covers weeks of a real web.
* **Links.** Every page links to the next page of its host (so all are reachable from ``/``)
  and to ``links_per_page − 1`` others drawn by popularity, a share ``locality`` of them on
  its own host. Popularity is Zipf, rank^(−1/α) with α = ``popularity_exponent``, so
  in-degrees have a power-law tail P(K > k) ~ k^(−α) (1.1: the density exponent 2.1 Broder
  et al. measured in 2000); a host's root is its most popular page. A page links to another
  at most once, which caps in-degrees on small hosts: the tail needs hosts of a hundred
  pages or more to show its exponent.
* **Hosts.** Exact shares of hosts have robots.txt rules (``Disallow: /private/``), no
  robots.txt (404), or one that allows everything; some of those with a robots.txt ask for a
  Crawl-delay. Some send honest ETag/Last-Modified and answer conditional GETs, some none,
  some wrong ones; some gzip; some publish ``/sitemap.xml`` (announced in robots.txt).
* **New pages** appear as a Poisson process (``new_pages_per_minute`` of wall time) during
  ``new_pages_horizon`` seconds. Each is listed in its host's sitemap from its creation and
  linked from ``new_page_parents`` changing pages of its host from their next change on, as a
  front page lists a new article when it is next updated.

The truth (every page with its true rate in changes per wall second and its creation time,
and every true change) is written to a DuckDB file or to Parquet files by
:func:`write_truth`, periodically and on exit by :func:`serve_simweb`::

    truth_pages(url VARCHAR, host VARCHAR, rate DOUBLE, created_at DOUBLE)
    truth_changes(url VARCHAR, changed_at DOUBLE)

URLs are in the crawler's canonical form (``http://h3.sim.test/p7``: no port, lowercase);
times are Unix seconds.
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import os
import random
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Literal

import numpy as np
import trio

from refresher._errors import ConfigError, InvalidURL, StoreError
from refresher.discover._url import canonicalize
from refresher.sim._site import (
    SITEMAP_LASTMODS,
    HostSpec,
    PageSpec,
    Site,
    SitemapLastmod,
    _stable_hash,
    serve_site,
)
from refresher.store._truth import write_truth_tables

__all__ = [
    "DEFAULT_RATE_MIX",
    "RATE_UNITS",
    "RateClass",
    "SimwebConfig",
    "SimwebPlan",
    "SimwebSummary",
    "Truth",
    "add_arguments",
    "build_site",
    "collect_truth",
    "main",
    "parse_rate_mix",
    "plan_web",
    "run",
    "serve_simweb",
    "site_of",
    "summarize",
    "write_truth",
]

#: Seconds of simulated time in each rate unit the command line accepts.
RATE_UNITS: dict[str, float] = {"second": 1.0, "minute": 60.0, "hour": 3600.0, "day": 86400.0}

_TRUTH_SUFFIXES = (".duckdb", ".db", ".ddb")
_MAX_NEW_PAGES = 1_000_000  # pages are planned up front; more would be a mistake
_DRAW_TRIES = 32  # weighted draws per wanted page before drawing exactly from the rest


@dataclass(frozen=True, slots=True, kw_only=True)
class RateClass:
    """One class of the change-rate mix.

    ``share`` is the fraction of pages in the class. Their rates are log-normal with median
    ``median`` (changes per rate unit of simulated time; 0: the pages never change) and
    log-space standard deviation ``sigma`` (0: every page has the median rate).
    """

    name: str
    share: float
    median: float = 0.0
    sigma: float = 0.0


#: The default mix, in changes per simulated day: a tenth never change, three quarters change
#: about every ten days with a heavy tail both ways, and some change about hourly.
DEFAULT_RATE_MIX: tuple[RateClass, ...] = (
    RateClass(name="never", share=0.10),
    RateClass(name="rare", share=0.75, median=0.1, sigma=1.5),
    RateClass(name="frequent", share=0.15, median=24.0, sigma=1.0),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class SimwebConfig:
    """The simulated web. The defaults are the demo: 10 hosts × 30 pages, 3 simulated days
    per wall minute, so the median page changes every few minutes of wall time and the
    frequent ones every second or so.

    Rates in ``rate_mix`` are changes per ``rate_unit`` seconds of simulated time;
    ``time_scale`` is simulated seconds per wall second, so a page's true rate is
    ``rate / rate_unit × time_scale`` changes per wall second. Shares of hosts are exact
    (rounded to whole hosts); the ``crawl_delay_share`` of all hosts that ask for a
    Crawl-delay are chosen among those that serve a robots.txt. ``new_pages_per_minute`` is
    for the whole site, per wall minute, during the first ``new_pages_horizon`` wall seconds.
    ``truth_path`` (None: no truth file) is a ``.duckdb`` file or a directory for Parquet
    files (``truth_format`` overrides the guess); :func:`serve_simweb` rewrites it every
    ``truth_interval`` seconds and on exit. ``sitemap_lastmod`` is what every sitemap host
    writes as its entries' ``<lastmod>`` (:attr:`refresher.sim._site.HostSpec.sitemap_lastmod`:
    honest, date, build or now).
    """

    seed: int = 0
    hosts: int = 10
    pages_per_host: int = 30
    domain: str = "sim.test"
    rate_mix: tuple[RateClass, ...] = DEFAULT_RATE_MIX
    rate_unit: float = 86400.0
    time_scale: float = 4320.0
    links_per_page: int = 8
    locality: float = 0.8
    popularity_exponent: float = 1.1
    robots_rules_share: float = 0.4
    no_robots_share: float = 0.2
    crawl_delay_share: float = 0.2
    crawl_delay: float = 1.0
    private_share: float = 0.1
    validators_none_share: float = 0.2
    validators_wrong_share: float = 0.1
    sitemap_share: float = 0.5
    sitemap_lastmod: SitemapLastmod = "honest"
    gzip_share: float = 0.5
    page_size: int = 2000
    new_pages_per_minute: float = 3.0
    new_pages_horizon: float = 86400.0
    new_page_parents: int = 2
    truth_path: str | None = None
    truth_format: Literal["duckdb", "parquet"] | None = None
    truth_interval: float = 10.0

    def __post_init__(self) -> None:
        def need(ok: bool, key: str, message: str) -> None:
            if not ok:
                raise ConfigError(message, key=f"simweb.{key}")

        need(self.hosts >= 1, "hosts", f"needs at least 1 host, not {self.hosts}")
        need(self.pages_per_host >= 1, "pages_per_host", "needs at least 1 page per host")
        need(
            bool(self.domain) and "/" not in self.domain and ":" not in self.domain,
            "domain",
            f"{self.domain!r} is not a bare domain; use e.g. 'sim.test'",
        )
        need(bool(self.rate_mix), "rate_mix", "give at least one rate class")
        for c in self.rate_mix:
            need(
                c.share >= 0 and c.median >= 0 and c.sigma >= 0 and math.isfinite(c.median),
                "rate_mix",
                f"class {c.name!r} needs share, median and sigma ≥ 0 (finite)",
            )
        names = [c.name for c in self.rate_mix]
        need(len(set(names)) == len(names), "rate_mix", f"class names repeat: {names}")
        total = sum(c.share for c in self.rate_mix)
        need(
            abs(total - 1) < 1e-6,
            "rate_mix",
            f"the class shares add up to {total:g}; make them add up to 1",
        )
        for key in ("rate_unit", "time_scale", "truth_interval", "popularity_exponent"):
            value = getattr(self, key)
            need(0 < value < math.inf, key, f"must be a positive number, not {value}")
        need(self.links_per_page >= 0, "links_per_page", "must be ≥ 0")
        need(self.page_size >= 0, "page_size", "must be ≥ 0 bytes")
        need(self.new_page_parents >= 0, "new_page_parents", "must be ≥ 0")
        need(self.crawl_delay >= 0, "crawl_delay", "must be ≥ 0 seconds")
        need(
            self.sitemap_lastmod in SITEMAP_LASTMODS,
            "sitemap_lastmod",
            f"is one of {', '.join(SITEMAP_LASTMODS)}, not {self.sitemap_lastmod!r}",
        )
        for key in (
            "locality",
            "robots_rules_share",
            "no_robots_share",
            "crawl_delay_share",
            "private_share",
            "validators_none_share",
            "validators_wrong_share",
            "sitemap_share",
            "gzip_share",
        ):
            value = getattr(self, key)
            need(0 <= value <= 1, key, f"is a fraction from 0 to 1, not {value}")
        need(
            self.robots_rules_share + self.no_robots_share <= 1,
            "no_robots_share",
            "robots_rules_share + no_robots_share must not pass 1",
        )
        need(
            self.validators_none_share + self.validators_wrong_share <= 1,
            "validators_wrong_share",
            "validators_none_share + validators_wrong_share must not pass 1",
        )
        need(
            self.new_pages_per_minute >= 0 and self.new_pages_horizon >= 0,
            "new_pages_per_minute",
            "new_pages_per_minute and new_pages_horizon must be ≥ 0",
        )
        expected = self.new_pages_per_minute / 60 * self.new_pages_horizon
        need(
            expected <= _MAX_NEW_PAGES,
            "new_pages_horizon",
            f"{expected:.0f} new pages would be planned up front; lower new_pages_per_minute "
            f"or new_pages_horizon (at most {_MAX_NEW_PAGES:,} pages)",
        )
        _truth_format(self)  # checks the path's suffix

    def wall_rate(self, rate: float) -> float:
        """A rate in changes per rate unit of simulated time, in changes per wall second."""
        return rate / self.rate_unit * self.time_scale


@dataclass(frozen=True, slots=True, kw_only=True)
class SimwebPlan:
    """The planned web: its hosts (for :class:`Site`) and each page's rate class by URL.

    ``start`` is the clock time (Unix seconds) the web begins; new pages carry absolute
    ``created_at`` times after it.
    """

    hosts: tuple[HostSpec, ...]
    classes: dict[str, str] = field(default_factory=dict)
    start: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class SimwebSummary:
    """What a plan holds, for people choosing parameters (rates in changes per wall second)."""

    hosts: int
    pages: int  # at the start
    new_pages: int  # planned to appear later
    class_pages: dict[str, int]  # pages at the start by rate class
    median_change_interval: float  # wall seconds, over pages at the start (inf: never)
    change_rate: float  # all pages at the start together, changes per wall second
    robots_rules_hosts: int
    no_robots_hosts: int
    crawl_delay_hosts: int
    sitemap_hosts: int
    validators: dict[str, int]  # hosts by validator behaviour
    mean_in_degree: float
    max_in_degree: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Truth:
    """The ground truth up to ``until``: pages (parallel arrays) and every true change."""

    until: float
    urls: np.ndarray  # object (str)
    hosts: np.ndarray  # object (str)
    rates: np.ndarray  # float64, changes per wall second
    created_at: np.ndarray  # float64, Unix seconds
    change_urls: np.ndarray  # object (str)
    changed_at: np.ndarray  # float64, Unix seconds


# ----------------------------------------------------------------------------- planning


def _rng(seed: int, aspect: str) -> np.random.Generator:
    # One stream per aspect, so that changing one knob (say the new-page rate) keeps the rest
    # of the web as it was.
    return np.random.default_rng(
        np.random.SeedSequence([seed & (2**63 - 1), _stable_hash("simweb", aspect)])
    )


def _exact_counts(shares: Sequence[float], n: int) -> list[int]:
    """``n`` × ``shares`` as whole counts adding up to ``n`` × their sum, rounded (largest
    remainder)."""
    raw = [s * n for s in shares]
    counts = [math.floor(r) for r in raw]
    order = sorted(range(len(raw)), key=lambda i: (counts[i] - raw[i], i))
    for i in order[: round(sum(raw)) - sum(counts)]:
        counts[i] += 1
    return counts


def _exact_labels(rng: np.random.Generator, shares: Sequence[float], n: int) -> np.ndarray:
    """Labels 0 … len(shares) (the last: the rest) for ``n`` items, in exact shares, shuffled."""
    counts = _exact_counts([*shares, max(0.0, 1 - sum(shares))], n)
    labels = np.repeat(np.arange(len(counts)), counts)
    return rng.permutation(labels)


def _class_rates(config: SimwebConfig, rng: np.random.Generator, labels: np.ndarray) -> np.ndarray:
    """Wall rates (changes per second) of pages with the given class labels."""
    rates = np.zeros(len(labels))
    for k, c in enumerate(config.rate_mix):
        chosen = labels == k
        if c.median > 0:
            drawn = rng.lognormal(math.log(c.median), c.sigma, size=int(chosen.sum()))
            rates[chosen] = config.wall_rate(1.0) * drawn
    return rates


class _Popularity:
    """Draws pages with probability ∝ weight, without repeats, inside or outside one host.

    Pages are indices; a host's pages are one block ``[lo, hi)``. Draws are single Python
    calls (a random number and a bisection): numpy costs more per call than it saves here.
    """

    __slots__ = ("_cum", "_fallback", "_pick", "weights")

    def __init__(self, weights: np.ndarray, rng: np.random.Generator) -> None:
        self.weights = weights
        self._cum: list[float] = [0.0, *np.cumsum(weights).tolist()]
        self._pick = random.Random(int(rng.integers(2**63)))
        self._fallback = rng

    def random(self) -> float:
        return self._pick.random()

    def distinct(self, k: int, *, lo: int, hi: int, inside: bool, taken: set[int]) -> list[int]:
        """Up to ``k`` pages not in ``taken``, from ``[lo, hi)`` if ``inside`` else from
        outside it; adds them to ``taken``."""
        n = len(self.weights)
        held = sum(1 for i in taken if (lo <= i < hi) == inside)
        k = min(k, (hi - lo if inside else n - (hi - lo)) - held)
        picked: list[int] = []
        if k <= 0:
            return picked
        cum = self._cum
        block = cum[hi] - cum[lo]
        span = block if inside else cum[n] - block
        for _ in range(_DRAW_TRIES * k):
            u = self._pick.random() * span
            if inside:
                u += cum[lo]
            elif u >= cum[lo]:
                u += block  # skip over the host's own block
            i = bisect.bisect_right(cum, u) - 1
            if 0 <= i < n and (lo <= i < hi) == inside and i not in taken:
                taken.add(i)
                picked.append(i)
                if len(picked) == k:
                    return picked
        # The pages taken hold nearly all the weight: draw from the rest exactly, O(pages).
        pool = np.arange(lo, hi) if inside else np.concatenate((np.arange(lo), np.arange(hi, n)))
        pool = pool[~np.isin(pool, np.fromiter(taken, dtype=np.int64, count=len(taken)))]
        p = self.weights[pool]
        size = k - len(picked)
        rest: list[int] = self._fallback.choice(
            pool, size=size, replace=False, p=p / p.sum()
        ).tolist()
        taken.update(rest)
        return picked + rest


def plan_web(config: SimwebConfig, *, start: float) -> SimwebPlan:
    """The web ``config`` describes, beginning at clock time ``start`` (Unix seconds).

    Deterministic: the same config and start give the same plan.
    """
    H, P = config.hosts, config.pages_per_host
    n = H * P
    names = [f"h{i}.{config.domain}".lower() for i in range(H)]

    # Rate classes in exact shares over the whole web, then rates within each class.
    class_rng = _rng(config.seed, "classes")
    labels = _exact_labels(class_rng, [c.share for c in config.rate_mix][:-1], n)
    rates = _class_rates(config, _rng(config.seed, "rates"), labels)
    features = _host_features(config)
    paths = _paths(config, features.robots)
    popularity = _popularity(config)

    def href(target: int, host: int) -> str:
        h = target // P
        return paths[target] if h == host else f"http://{names[h]}{paths[target]}"

    def random_links(host: int, k: int, taken: set[int]) -> list[str]:
        local = sum(popularity.random() < config.locality for _ in range(k)) if H > 1 else k
        lo, hi = host * P, (host + 1) * P
        picks = popularity.distinct(local, lo=lo, hi=hi, inside=True, taken=taken)
        if H > 1:
            picks += popularity.distinct(k - local, lo=lo, hi=hi, inside=False, taken=taken)
        return [href(t, host) for t in picks]

    links: list[list[str]] = []
    for idx in range(n):
        i, j = divmod(idx, P)
        if P > 1:
            chain = i * P + (j + 1) % P
            own = [paths[chain]]
            own += random_links(i, config.links_per_page - 1, {idx, chain})
        else:
            own = random_links(i, config.links_per_page, {idx})
        links.append(own)

    classes: dict[str, str] = {}
    later, new_pages = _new_pages(config, start, rates, paths, names, random_links, classes)
    hosts: list[HostSpec] = []
    for i, name in enumerate(names):
        pages = []
        for j in range(P):
            idx = i * P + j
            pages.append(
                PageSpec(
                    path=paths[idx],
                    change_rate=float(rates[idx]),
                    links=tuple(dict.fromkeys(links[idx])),
                    size=config.page_size,
                    later_links=tuple(later[idx]),
                )
            )
            classes[f"http://{name}{paths[idx]}"] = config.rate_mix[int(labels[idx])].name
        hosts.append(
            HostSpec(
                name=name,
                pages=(*pages, *new_pages[i]),
                robots=_robots_text(
                    int(features.robots[i]), i in features.delayed, config.crawl_delay
                ),
                validators=_VALIDATORS[int(features.validators[i])],
                gzip=bool(features.gzips[i]),
                sitemap=bool(features.sitemaps[i]),
                sitemap_lastmod=config.sitemap_lastmod,
            )
        )
    return SimwebPlan(hosts=tuple(hosts), classes=classes, start=start)


@dataclass(frozen=True, slots=True)
class _HostFeatures:
    """Per host (index = host number): its robots.txt kind (0 rules, 1 none served, 2 allow
    all), whether it asks a Crawl-delay, its validators' kind, a sitemap, gzip."""

    robots: np.ndarray
    delayed: frozenset[int]
    validators: np.ndarray
    sitemaps: np.ndarray
    gzips: np.ndarray


def _host_features(config: SimwebConfig) -> _HostFeatures:
    """Each feature an independent exact partition of the hosts."""
    H = config.hosts
    host_rng = _rng(config.seed, "hosts")
    robots = _exact_labels(host_rng, [config.robots_rules_share, config.no_robots_share], H)
    serving = np.flatnonzero(robots != 1)
    delayed: set[int] = set()
    if len(serving):
        count = min(len(serving), _exact_counts([config.crawl_delay_share], H)[0])
        delayed = set(host_rng.permutation(serving)[:count].tolist())
    validators = _exact_labels(
        host_rng, [config.validators_none_share, config.validators_wrong_share], H
    )
    sitemaps = _exact_labels(host_rng, [config.sitemap_share], H) == 0
    gzips = _exact_labels(host_rng, [config.gzip_share], H) == 0
    return _HostFeatures(
        robots=robots,
        delayed=frozenset(delayed),
        validators=validators,
        sitemaps=sitemaps,
        gzips=gzips,
    )


def _paths(config: SimwebConfig, robots: np.ndarray) -> list[str]:
    """ "/" and /p1 …; on hosts with robots rules some pages live under /private/."""
    H, P = config.hosts, config.pages_per_host
    private_draw = _rng(config.seed, "private").random(H * P) < config.private_share
    paths: list[str] = []
    for i in range(H):
        for j in range(P):
            if j == 0:
                paths.append("/")
            elif robots[i] == 0 and private_draw[i * P + j]:
                paths.append(f"/private/p{j}")
            else:
                paths.append(f"/p{j}")
    return paths


def _popularity(config: SimwebConfig) -> _Popularity:
    """Zipf weights rank^(-1/α) on a random order of the pages, so a page's expected in-degree
    has a power-law tail P(K > k) ~ k^(-α); ranks rather than Pareto draws, whose largest draw
    can take most of the weight on its own. Each host's heaviest page is its root."""
    H, P = config.hosts, config.pages_per_host
    pop_rng = _rng(config.seed, "popularity")
    ranks = pop_rng.permutation(H * P) + 1.0
    weights = ranks ** (-1.0 / config.popularity_exponent)
    for i in range(H):
        block = weights[i * P : (i + 1) * P]
        top = int(np.argmax(block))
        block[0], block[top] = block[top], block[0]
    return _Popularity(weights, _rng(config.seed, "links"))


def _new_page_offsets(config: SimwebConfig, new_rng: np.random.Generator) -> list[float]:
    """A Poisson process of new pages' births over the horizon, seconds from the start."""
    per_second = config.new_pages_per_minute / 60
    offsets: list[float] = []
    if per_second > 0:
        t = 0.0
        while True:
            t += float(new_rng.exponential(1 / per_second))
            if t > config.new_pages_horizon:
                break
            offsets.append(t)
    return offsets


def _new_pages(
    config: SimwebConfig,
    start: float,
    rates: np.ndarray,
    paths: list[str],
    names: list[str],
    random_links: Callable[[int, int, set[int]], list[str]],
    classes: dict[str, str],
) -> tuple[list[list[tuple[float, str]]], list[list[PageSpec]]]:
    """The pages born during the run, each on a host drawn uniformly and linked from
    ``new_page_parents`` changing public pages of its host from its birth: (the links each
    existing page gains, by page index; the new pages by host). Notes their classes."""
    H, P = config.hosts, config.pages_per_host
    shares = [c.share for c in config.rate_mix]
    new_rng = _rng(config.seed, "new pages")
    offsets = _new_page_offsets(config, new_rng)
    m = len(offsets)
    new_hosts = new_rng.integers(H, size=m)
    new_labels = new_rng.choice(len(shares), size=m, p=np.asarray(shares) / sum(shares))
    new_rates = _class_rates(config, _rng(config.seed, "new rates"), new_labels)
    parents_of_host = [
        [
            i * P + j
            for j in range(P)
            if rates[i * P + j] > 0 and "/private/" not in paths[i * P + j]
        ]
        for i in range(H)
    ]
    # Small samples one at a time: Python's sampler costs a tenth of numpy's per call.
    parent_pick = random.Random(int(new_rng.integers(2**63)))
    later: list[list[tuple[float, str]]] = [[] for _ in range(H * P)]
    new_pages: list[list[PageSpec]] = [[] for _ in range(H)]
    for k in range(m):
        i = int(new_hosts[k])
        path = f"/n{k}"
        created = start + offsets[k]
        candidates = parents_of_host[i]
        count = min(config.new_page_parents, len(candidates))
        for parent in parent_pick.sample(candidates, count):
            later[parent].append((created, path))
        new_pages[i].append(
            PageSpec(
                path=path,
                change_rate=float(new_rates[k]),
                links=tuple(random_links(i, config.links_per_page, set())),
                size=config.page_size,
                created_at=created,
            )
        )
        classes[f"http://{names[i]}{path}"] = config.rate_mix[int(new_labels[k])].name
    return later, new_pages


_VALIDATORS: tuple[Literal["none", "wrong", "honest"], ...] = ("none", "wrong", "honest")


def _robots_text(kind: int, delayed: bool, delay: float) -> str | None:
    """robots.txt for kind 0 (rules), 1 (none: 404) or 2 (allow all)."""
    if kind == 1:
        return None
    text = "User-agent: *\n" + ("Disallow: /private/\n" if kind == 0 else "Allow: /\n")
    if delayed:
        text += f"Crawl-delay: {delay:g}\n"
    return text


def build_site(
    config: SimwebConfig,
    *,
    clock: Callable[[], float] = time.time,
    start: float | None = None,
    link_port: int | Literal["bound"] | None = None,
    max_log_entries: int | None = 100_000,
) -> Site:
    """The simulated web as a :class:`Site`, beginning at ``start`` (default: the clock now).

    Deterministic from ``config.seed``: the same config and start give the same pages, links,
    rates and change times.
    """
    begin = clock() if start is None else start
    return site_of(
        plan_web(config, start=begin),
        config,
        clock=clock,
        link_port=link_port,
        max_log_entries=max_log_entries,
    )


def site_of(
    plan: SimwebPlan,
    config: SimwebConfig,
    *,
    clock: Callable[[], float] = time.time,
    link_port: int | Literal["bound"] | None = None,
    max_log_entries: int | None = 100_000,
) -> Site:
    """The :class:`Site` serving ``plan`` (made from ``config``), beginning at its start."""
    return Site(
        plan.hosts,
        seed=config.seed,
        clock=clock,
        start=plan.start,
        link_port=link_port,
        max_log_entries=max_log_entries,
    )


def summarize(plan: SimwebPlan) -> SimwebSummary:
    """Counts and rates of a plan, to judge whether a run of a few minutes means something."""
    initial = [p for h in plan.hosts for p in _initial(h)]
    rates = np.array([p.change_rate for p in initial])
    median = float(np.median(rates)) if len(rates) else 0.0
    in_degree: dict[str, int] = {}
    for h in plan.hosts:
        for p in _initial(h):
            in_degree.setdefault(f"http://{h.name}{p.path}", 0)
            for link in p.links:
                url = link if link.startswith("http://") else f"http://{h.name}{link}"
                in_degree[url] = in_degree.get(url, 0) + 1
    degrees = [in_degree[f"http://{h.name}{p.path}"] for h in plan.hosts for p in _initial(h)]
    class_pages: dict[str, int] = {}
    for h in plan.hosts:
        for p in _initial(h):
            name = plan.classes.get(f"http://{h.name}{p.path}", "?")
            class_pages[name] = class_pages.get(name, 0) + 1
    validators: dict[str, int] = {}
    for h in plan.hosts:
        validators[h.validators] = validators.get(h.validators, 0) + 1
    return SimwebSummary(
        hosts=len(plan.hosts),
        pages=len(initial),
        new_pages=sum(len(h.pages) for h in plan.hosts) - len(initial),
        class_pages=class_pages,
        median_change_interval=1 / median if median > 0 else math.inf,
        change_rate=float(rates.sum()),
        robots_rules_hosts=sum(1 for h in plan.hosts if h.robots and "Disallow" in h.robots),
        no_robots_hosts=sum(1 for h in plan.hosts if h.robots is None),
        crawl_delay_hosts=sum(1 for h in plan.hosts if h.robots and "Crawl-delay" in h.robots),
        sitemap_hosts=sum(1 for h in plan.hosts if h.sitemap),
        validators=validators,
        mean_in_degree=float(np.mean(degrees)) if degrees else 0.0,
        max_in_degree=max(degrees, default=0),
    )


def _initial(host: HostSpec) -> list[PageSpec]:
    return [p for p in host.pages if p.created_at is None]


# ----------------------------------------------------------------------------- the truth


def _truth_format(config_or_path: SimwebConfig | str | os.PathLike[str]) -> str | None:
    if isinstance(config_or_path, SimwebConfig):
        if config_or_path.truth_path is None:
            return None
        if config_or_path.truth_format is not None:
            if config_or_path.truth_format not in ("duckdb", "parquet"):
                raise ConfigError(
                    f"is 'duckdb' or 'parquet', not {config_or_path.truth_format!r}",
                    key="simweb.truth_format",
                )
            return config_or_path.truth_format
        path = Path(config_or_path.truth_path)
    else:
        path = Path(config_or_path)
    if path.suffix.lower() in _TRUTH_SUFFIXES:
        return "duckdb"
    if path.suffix and not path.is_dir():
        raise ConfigError(
            f"{str(path)!r}: name a DuckDB file *.duckdb, or a directory for Parquet files, or "
            "set the truth format",
            key="simweb.truth_path",
        )
    return "parquet"


def collect_truth(site: Site, *, until: float) -> Truth:
    """The ground truth of ``site`` up to clock time ``until``.

    Pages that exist at ``until``; rates are the site's (changes per second of its clock);
    change times are :meth:`Site.change_times`. Touches the site, so call it from the thread
    that serves it.
    """
    urls: list[str] = []
    hosts: list[str] = []
    rates: list[float] = []
    created: list[float] = []
    counts: list[int] = []
    times: list[np.ndarray] = []
    for url in site.urls(at=until):
        rest = url.split("://", 1)[1]
        cut = rest.find("/")
        host, path = rest[:cut], rest[cut:]
        try:
            canonical = canonicalize(url)
            urls.append(canonical.url)
            hosts.append(canonical.host)
        except InvalidURL:
            urls.append(url)
            hosts.append(host)
        rates.append(site.change_rate(host, path))
        created.append(site.created_at(host, path))
        changes = site.change_times(host, path, until)
        counts.append(len(changes))
        times.append(changes)
    url_array = np.array(urls, dtype=object)
    return Truth(
        until=until,
        urls=url_array,
        hosts=np.array(hosts, dtype=object),
        rates=np.array(rates, dtype=np.float64),
        created_at=np.array(created, dtype=np.float64),
        change_urls=np.repeat(url_array, counts) if urls else np.array([], dtype=object),
        changed_at=np.concatenate(times) if times else np.empty(0),
    )


def _write_arrays(truth: Truth, path: Path, fmt: str) -> None:
    """Write ``truth`` to ``path`` through the store (each file replaced atomically)."""
    write_truth_tables(
        path,
        "duckdb" if fmt == "duckdb" else "parquet",
        pages={
            "url": truth.urls,
            "host": truth.hosts,
            "rate": truth.rates,
            "created_at": truth.created_at,
        },
        changes={"url": truth.change_urls, "changed_at": truth.changed_at},
    )


def write_truth(
    site: Site,
    path: str | os.PathLike[str],
    *,
    until: float,
    format: Literal["duckdb", "parquet"] | None = None,
) -> Truth:
    """Write the truth of ``site`` up to clock time ``until`` and return it.

    ``path`` is a DuckDB file (``.duckdb``, ``.db``, ``.ddb``) or a directory that receives
    ``truth_pages.parquet`` and ``truth_changes.parquet``; ``format`` overrides the guess.
    Tables: ``truth_pages(url, host, rate, created_at)`` and ``truth_changes(url,
    changed_at)``; rates in changes per second of the site's clock, times in its seconds.
    """
    fmt = format or _truth_format(path)
    assert fmt is not None
    truth = collect_truth(site, until=until)
    _write_arrays(truth, Path(path), fmt)
    return truth


# ----------------------------------------------------------------------------- serving


async def _write_truth_async(site: Site, path: Path, fmt: str) -> Truth:
    truth = collect_truth(site, until=site.clock())
    # Writing takes a worker thread; it is not abandoned on cancel, so no half-done replace.
    await trio.to_thread.run_sync(_write_arrays, truth, path, fmt)
    return truth


async def _keep_truth(site: Site, path: Path, fmt: str, interval: float) -> None:
    from refresher.ops._logging import get_logger

    log = get_logger("simweb")
    try:
        while True:
            truth = await _write_truth_async(site, path, fmt)
            log.debug(
                "simweb.truth_written",
                path=str(path),
                pages=len(truth.urls),
                changes=len(truth.changed_at),
            )
            await trio.sleep(interval)
    except trio.Cancelled:
        # Stopping is the normal end: the truth up to the last moment is what a run compares
        # the crawler's copy against. (After a failed write there is nothing to retry.)
        with trio.CancelScope(shield=True):
            truth = await _write_truth_async(site, path, fmt)
        log.info(
            "simweb.truth_final",
            path=str(path),
            pages=len(truth.urls),
            changes=len(truth.changed_at),
        )
        raise


async def serve_simweb(
    config: SimwebConfig,
    *,
    site: Site | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    clock: Callable[[], float] = time.time,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the simulated web on ``host``:``port`` (0: any free port) until cancelled.

    ``site`` is the web to serve (default: :func:`build_site` of ``config`` on ``clock``).
    With ``config.truth_path`` set, the truth is written at once, every
    ``config.truth_interval`` seconds and when cancelled. Calls ``task_status.started(port)``.
    """
    web = build_site(config, clock=clock) if site is None else site
    fmt = _truth_format(config)
    async with trio.open_nursery() as nursery:
        bound = await nursery.start(partial(serve_site, web, host=host, port=port))
        if config.truth_path is not None and fmt is not None:
            nursery.start_soon(
                _keep_truth, web, Path(config.truth_path), fmt, config.truth_interval
            )
        task_status.started(bound)


# ----------------------------------------------------------------------------- command line


def parse_rate_mix(text: str) -> tuple[RateClass, ...]:
    """``name:share[:median[:sigma]],…`` (e.g. ``never:0.1,rare:0.75:0.1:1.5``) as classes."""
    classes: list[RateClass] = []
    for item in text.split(","):
        parts = item.strip().split(":")
        try:
            if not parts[0] or not 2 <= len(parts) <= 4:
                raise ValueError(item)
            numbers = [float(p) for p in parts[1:]]
        except ValueError:
            raise ConfigError(
                f"{item.strip()!r} is not name:share[:median[:sigma]]; e.g. "
                "'never:0.1,rare:0.75:0.1:1.5,frequent:0.15:24:1'",
                key="simweb.rate_mix",
            ) from None
        share, median, sigma = (*numbers, 0.0, 0.0)[:3]
        classes.append(RateClass(name=parts[0], share=share, median=median, sigma=sigma))
    return tuple(classes)


def _mix_text(mix: Sequence[RateClass]) -> str:
    return ",".join(f"{c.name}:{c.share:g}:{c.median:g}:{c.sigma:g}" for c in mix)


# (option, SimwebConfig field, type, help): options whose default is the config's.
_CONFIG_OPTIONS: tuple[tuple[str, str, type, str], ...] = (
    ("--seed", "seed", int, "seed of the web"),
    ("--hosts", "hosts", int, "virtual hosts h0 … h<N-1>"),
    ("--pages", "pages_per_host", int, "pages per host at the start"),
    ("--domain", "domain", str, "host names are h<i>.<domain>"),
    ("--time-scale", "time_scale", float, "simulated seconds per wall second"),
    ("--links", "links_per_page", int, "links per page"),
    ("--locality", "locality", float, "share of random links that stay on their host"),
    ("--crawl-delay", "crawl_delay", float, "Crawl-delay in seconds where hosts ask for one"),
    ("--crawl-delay-share", "crawl_delay_share", float, "share of hosts with a Crawl-delay"),
    ("--sitemap-share", "sitemap_share", float, "share of hosts with /sitemap.xml"),
    ("--new-pages-per-minute", "new_pages_per_minute", float, "new pages per wall minute"),
    ("--new-pages-horizon", "new_pages_horizon", float, "wall seconds new pages appear in"),
    ("--truth-interval", "truth_interval", float, "seconds between truth writes (and on exit)"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``refresher simweb`` (defaults: :class:`SimwebConfig`, the demo)."""
    defaults = SimwebConfig()
    for option, name, kind, text in _CONFIG_OPTIONS:
        default = getattr(defaults, name)
        parser.add_argument(option, type=kind, default=default, help=f"{text} (%(default)s)")
    parser.add_argument(
        "--mix",
        default=_mix_text(defaults.rate_mix),
        help="rate classes name:share:median:sigma, medians in changes per rate unit (%(default)s)",
    )
    parser.add_argument(
        "--sitemap-lastmod",
        choices=SITEMAP_LASTMODS,
        default=defaults.sitemap_lastmod,
        help="the sitemaps' <lastmod>: each page's last change (honest), its day (date), the "
        "web's start (build) or the time served (now) (%(default)s)",
    )
    parser.add_argument(
        "--rate-unit",
        choices=tuple(RATE_UNITS),
        default="day",
        help="unit of the --mix medians (day)",
    )
    parser.add_argument("--port", type=int, default=8080, help="0 picks a free one (8080)")
    parser.add_argument("--bind", default="127.0.0.1", help="address (127.0.0.1)")
    parser.add_argument("--truth", help="write the truth to this .duckdb file or directory")
    parser.add_argument(
        "--truth-format", choices=("duckdb", "parquet"), help="override the guess from --truth"
    )
    parser.add_argument("--duration", type=float, help="stop after so many seconds")
    parser.add_argument("--links-with-port", action="store_true", help="port in absolute links")
    parser.add_argument("--port-file", help="write the bound port to this file")
    parser.add_argument("--describe", action="store_true", help="print a summary and exit")


def _config_from(args: argparse.Namespace) -> SimwebConfig:
    fields = {
        name: getattr(args, option[2:].replace("-", "_")) for option, name, _, _ in _CONFIG_OPTIONS
    }
    return SimwebConfig(
        **fields,
        rate_mix=parse_rate_mix(args.mix),
        rate_unit=RATE_UNITS[args.rate_unit],
        sitemap_lastmod=args.sitemap_lastmod,
        truth_path=args.truth,
        truth_format=args.truth_format,
    )


def run(args: argparse.Namespace) -> int:
    """Run ``refresher simweb`` with parsed arguments (see :func:`add_arguments`)."""
    from refresher.ops._logging import configure_logging, get_logger

    try:
        config = _config_from(args)
        if args.describe:
            summary = summarize(plan_web(config, start=0.0))
            print(json.dumps(asdict(summary), indent=2, default=str))
            return 0
        if args.duration is not None and not args.duration > 0:
            raise ConfigError("--duration is a number of seconds > 0", key="simweb.duration")
        plan = plan_web(config, start=time.time())
        site = site_of(plan, config, link_port="bound" if args.links_with_port else None)
    except ConfigError as e:
        print(f"refresher simweb: {e}", file=sys.stderr)
        return 2
    configure_logging()
    log = get_logger("simweb")

    async def serve() -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                serving = partial(serve_simweb, config, site=site, host=args.bind, port=args.port)
                port = await nursery.start(serving)
                if args.port_file:
                    _write_port_file(Path(args.port_file), port)
                summary = summarize(plan)
                log.info(
                    "simweb.serving",
                    address=f"{args.bind}:{port}",
                    port=port,
                    hosts=summary.hosts,
                    pages=summary.pages,
                    new_pages=summary.new_pages,
                    median_change_interval=round(summary.median_change_interval, 1),
                    changes_per_second=round(summary.change_rate, 2),
                    seed=config.seed,
                    truth=config.truth_path,
                )
                with trio.move_on_after(math.inf if args.duration is None else args.duration):
                    async for signum in signals:
                        log.info("simweb.stopping", signal=signal.Signals(signum).name)
                        break
                nursery.cancel_scope.cancel()

    try:
        trio.run(serve)
    except (ConfigError, StoreError) as e:
        print(f"refresher simweb: {e}", file=sys.stderr)
        return 2
    return 0


def _write_port_file(path: Path, port: int) -> None:
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    tmp.write_text(f"{port}\n")
    os.replace(tmp, path)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m refresher.sim._simweb``: serve the simulated web until a signal."""
    parser = argparse.ArgumentParser(
        prog="refresher simweb",
        description="Serve a simulated web with known change rates on one local port and "
        "write its ground truth. Point the crawler at it with DNS overrides such as "
        "'*.sim.test' = '127.0.0.1:PORT'.",
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
