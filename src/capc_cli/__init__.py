"""The ``capc`` command line: one entry point, one subcommand module per area under ``commands/``."""
