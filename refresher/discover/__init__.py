"""Stage 2, discover: from fetched documents to new pages.

parse (processing modules by MIME type: links, sitemaps, near-duplicate prints) → url (WHATWG
normalisation, the page's identity) → filter (scope and spider-trap defences) → seen (the URL-seen
test) → discovery (new pages with a PageRank weight).
"""
