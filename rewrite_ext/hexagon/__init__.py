"""Hexagon lowering: the copy-to-DMA reference rewrite and its CPU stand-in."""
