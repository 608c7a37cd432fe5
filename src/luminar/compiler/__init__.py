"""Compiler passes and (later) kernel IR, lowering and search."""
