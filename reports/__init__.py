"""Renderers: they format the plain report document (``Analysis.to_dict()``) and compute nothing."""
