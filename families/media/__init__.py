"""Attached media: the parts a client sent, their limits, decoding them, and the processors that turn
them into model inputs."""
