"""Operating the daemon: the nursery tree, control socket, metrics, sd_notify, logging, CLI."""
