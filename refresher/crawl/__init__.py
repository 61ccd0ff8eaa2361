"""Stage 1, crawl: the Mercator frontier, the workers, the fetcher, DNS and robots.txt.

frontier (priority front queues, one back queue per host, the heap of next-allowed times) →
workers (lease a page, fetch it politely, carry the outcome out) → fetch (one HTTP exchange) with
dns (the resolver cache) and robots (RFC 9309 rules); outcome (what one fetch means, pure).
"""
