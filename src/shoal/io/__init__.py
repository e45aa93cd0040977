"""Peer formats in and out (Sailor, HuggingFace, ...)."""
