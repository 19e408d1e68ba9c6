"""What leaves the daemon: the Prometheus collector, the JSON findings document and the HTTP
server that serves both."""
