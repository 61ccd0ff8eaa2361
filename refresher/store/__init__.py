"""Stage 3, store: the only owner of SQL.

duckdb (pages, hosts, the append-only fetch history, the batched writer), views (freshness and age
in SQL), snapshot (consistent copies for live queries), captures (the archive's index of WARC
records), history (retention of old fetches).
"""
