"""The replay's policies by name, with no imports, so that the command line lists them without
loading the planners (``policy`` implements them)."""

POLICIES = ("shoal", "always", "never", "oracle")
