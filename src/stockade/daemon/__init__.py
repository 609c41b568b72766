"""The daemon: one long-lived process that runs cells, serves their broker
sockets and the control socket, and keeps the record (docs/PROTOCOL.md)."""
