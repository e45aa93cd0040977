"""HuggingFace models in the runtime: configs read into an ``Arch``, weights in and out."""
