"""CLI command modules (one per command): add_arguments(parser) and run(args)."""
