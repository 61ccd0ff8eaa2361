"""Stage 3b, archive: the copy itself.

warc (every new version of a page as a WARC record, durable with its batch), archive (reading
the latest or a past version back, CDXJ, export), sinks (the change feed by entry point),
retention (pruning old versions).
"""
