"""The `envkit` command line: thin commands over the library (one module per group)."""
