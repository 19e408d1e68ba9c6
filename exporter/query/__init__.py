"""Query mode: reading the fleet's vLLM series from Prometheus (or Thanos, Mimir) instead of
scraping them (`reader`), over its HTTP API (`client`), rebuilt into exposition families for the
shared canonicaliser (`families`)."""
