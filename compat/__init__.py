"""The llama-server compatibility manifest: one entry per reference route or request field.

``compat/llama-server/b10621/`` holds ``pin.json`` (the reference's identity and counts) and one
shard per area. ``python -m compat.check`` validates it; ``python -m compat.render`` writes the
docs from it.
"""
