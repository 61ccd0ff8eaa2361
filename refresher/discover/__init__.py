"""Stage 2, discover: from fetched documents to new pages.

parse (processing modules by MIME type: links, sitemaps, near-duplicate prints) → content
(the content-seen test, keyed by what a document yields) → url (WHATWG
normalisation, the page's identity) → filter (scope and spider-trap defences) → seen (the URL-seen
test) → discovery (new pages with a PageRank weight).

The parse stage is split by concern: ``_parse`` (the processor registry), ``_document`` (what
processors exchange, link resolution), ``_charset``, ``_html``, ``_simhash``, ``_sitemaps``, and
``_threads`` (the fixed parse threads the workers run processors on).
"""
