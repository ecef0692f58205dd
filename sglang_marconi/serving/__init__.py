"""Serving replay: SGLang's scheduler loop on CPU with a virtual GPU clock (``serve-sim``)."""
