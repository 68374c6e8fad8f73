"""Lab tooling that operates GPU machines (``python -m tools.<name>``); no package imports it."""
