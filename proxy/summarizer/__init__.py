"""One summary: the ladder that builds it, the model client that asks for it, and its parsing and rendering."""
