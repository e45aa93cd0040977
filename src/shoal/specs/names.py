"""The input formats by name, with no imports, so that the command line lists them without
loading their models (``reference.roots`` gives each one's model)."""

FORMATS = ("scenario", "plan", "serving")
