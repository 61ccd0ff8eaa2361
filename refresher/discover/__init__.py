"""Stage 2, discover: from fetched documents to new pages.

parse (processing modules by MIME type: links, sitemaps, near-duplicate prints) → content
(the content-seen test, keyed by what a document yields) → url (WHATWG
normalisation, the page's identity) → filter (scope and spider-trap defences) → seen (the URL-seen
test) → discovery (new pages with a PageRank weight).
"""
